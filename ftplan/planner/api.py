"""The Python API, for notebooks: the same plan and prediction `ftplan plan` and `ftplan predict` print.

    import ftplan
    result = ftplan.plan(model="llama-3-8b", dataset_size=19692, gpu="H200")
    result.recommendation.label, result.recommendation.batch   # what to run
    result.to_frame()                                           # every setup, one row each (pandas)
    result.to_dict()                                            # what `ftplan plan --json` prints

The CLI commands are thin layers over these functions; nothing here prints.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ftplan.core.architecture import cached_architecture, load_architecture, run_attention
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import CPU
from ftplan.core.recipe import check_alloc_conf
from ftplan.core.settings import DEFAULT_SEQ_LEN, Setting
from ftplan.core.units import GIB
from ftplan.models.communication.estimates import estimate_overlap
from ftplan.models.communication.layout import describe_layout
from ftplan.models.communication.links import Links
from ftplan.models.eta import check_samples
from ftplan.models.prediction import Prediction
from ftplan.models.scaling import DEFAULT_GPUS_PER_NODE, node_layout, parse_gpu_counts
from ftplan.planner.as_data import plan_to_dict, scaling_to_dict
from ftplan.planner.dataset_plan import (
    STRATEGY_PADDING,
    DatasetOptions,
    DatasetPlan,
    dataset_plan_to_dict,
    plan_dataset_file,
)
from ftplan.planner.gpu_counts import ScalingPlan, plan_gpu_counts
from ftplan.planner.headline import headline
from ftplan.evidence.inputs import Evidence
from ftplan.planner.search import ALLOWED, DEFAULT_LORA_RANKS, Plan, PlanRequest, SetupPlan, make_plan
from ftplan.planner.verified import mark_verified
from ftplan.evidence.workspace import Workspace

if TYPE_CHECKING:  # pandas only for to_frame: importing it cost more than a whole plan
    import pandas as pd

# Without a dataset: padded to seq_len with a mask (the default collator), or rows already exactly seq_len.
NO_DATASET_PADDINGS = ("max_length", "none")


@dataclass(frozen=True)
class PlanResult:
    """A plan with what it rests on: the ranked setups (one GPU count) or the scaling over several."""

    plan: Plan | None
    scaling: ScalingPlan | None
    evidence: Evidence
    links: Links
    links_text: str
    failed: dict[Setting, str]
    dataset_plan: DatasetPlan | None = None
    dataset_lines: tuple[str, ...] = ()
    headline: tuple[str, ...] = ()  # said before the table: a prior-only winner, records of other versions

    @property
    def recommendation(self) -> SetupPlan | None:
        return self.plan.recommended if self.plan else None

    def to_dict(self) -> dict:
        """Exactly what `ftplan plan --json` prints."""
        largest = ({s: b.largest_fitting for s, b in self.dataset_plan.setups.items()} if self.dataset_plan
                   else None)
        planned = plan_to_dict(self.plan, self.failed, largest) if self.plan else {}
        if planned:
            planned["warnings"] = [*self.headline, *planned["warnings"]]
        return {**planned, "headline": list(self.headline),
                "inputs": [{"path": str(i.path), "records": i.records, "from_training_runs": i.from_training_runs}
                           for i in self.evidence.inputs],
                "links": {**self.links.__dict__, "description": self.links_text},
                "scaling": scaling_to_dict(self.scaling) if self.scaling else None,
                **({"dataset": dataset_plan_to_dict(self.dataset_plan, list(self.dataset_lines))}
                   if self.dataset_plan else {})}

    def to_frame(self) -> pd.DataFrame:
        """Every setup as a row: fits or not, its largest safe batch, memory, evidence, time and cost."""
        import pandas as pd

        if self.plan is None:
            return pd.DataFrame()
        rows = []
        for verdict, setups in (("ranked", self.plan.ranked), ("over max hours", self.plan.too_slow),
                                ("cannot fit", self.plan.unfit)):
            for setup in setups:
                prediction = setup.best or setup.at_batch_one
                rows.append({"setup": setup.label, "training": setup.training, "verdict": verdict,
                             "recommended": setup is self.recommendation, "batch_per_gpu": setup.batch,
                             "reserved_gib": prediction.peak_reserved.mean / GIB,
                             "reserved_upper_gib": prediction.peak_reserved.upper / GIB,
                             "seconds_per_step": prediction.seconds_per_step.mean, "evidence": prediction.evidence,
                             "steps": setup.eta.steps if setup.eta else None,
                             "hours": setup.eta.hours if setup.eta else None,
                             "cost": setup.eta.cost if setup.eta else None,
                             "host_gib_per_node": setup.host_bytes / GIB})
        return pd.DataFrame(rows)


def plan(model: str, dataset_size: int | None = None, gpu: str = "H200", *, epochs: float = 1.0,
         seq_len: int | None = None,
         gpus: int | str = 1, gpus_per_node: int = DEFAULT_GPUS_PER_NODE, step_time_cv: float | None = None,
         intra_node_bandwidth: str | None = None, inter_node_bandwidth: str | None = None,
         price_per_hour: float | None = None, max_hours: float | None = None, by: str = "time",
         training: str = "any", lora_ranks: Sequence[int] | None = None, precision: str | None = None,
         safety_margin: float | None = None, context_reserve_gib: float = 0.0, host_memory_gib: float | None = None,
         calibrations: Sequence[Path | str] = (), gpu_specs: Path | str | None = None,
         dataset: Path | str | None = None, dataset_options: DatasetOptions | None = None,
         text_field: str | None = None, ids_field: str | None = None, tokenizer: Path | str | None = None,
         chars_per_token: float | None = None, allow: Sequence[str] = (), attention: str | None = None,
         alloc_conf: str = "", padding: str = "max_length",
         progress: Callable[[str], None] | None = None) -> PlanResult:
    """Every setup ranked for this run, as `ftplan plan` with the same options (gpus: a count, or '1..64';
    progress: told of each count's search as it starts, when there are several).

    The run's recipe without a dataset: padding "max_length" pads samples to seq_len with a mask (the
    collator --emit writes); "none" is rows already of exactly seq_len (run_clm-style chunks), which carry
    no mask to attention. With a dataset its batching's collator decides; attention and alloc_conf as the
    run will set them (attention None: sdpa, or eager where SDPA cannot compute the model's attention).

    With a dataset file, its own token lengths set the sample count, the longest batch (memory) and the
    tokens per step (time); dataset_options choose the batching (dynamic padding by default). seq_len (2,048
    when None) is then, as --seq-len is, the length samples are cut at (unless dataset_options.max_length says
    otherwise; None: none is cut) and packing's row length (unless dataset_options.pack_length says otherwise).
    """
    # Over 40 lines only by its 23-line public signature and docstring; the body is check, request, plan.
    _check_names(model=model, gpu=gpu)
    _check_optional_names(intra_node_bandwidth=intra_node_bandwidth, inter_node_bandwidth=inter_node_bandwidth,
                          by=by, training=training, precision=precision, text_field=text_field, ids_field=ids_field,
                          attention=attention, alloc_conf=alloc_conf, padding=padding, dataset=dataset,
                          tokenizer=tokenizer, gpu_specs=gpu_specs)
    calibrations = _paths(calibrations)
    _check_dataset_arguments(dataset, dataset_size, text_field=text_field, ids_field=ids_field, tokenizer=tokenizer,
                             chars_per_token=chars_per_token)
    if dataset_options is not None and not isinstance(dataset_options, DatasetOptions):
        raise FtplanError(f"dataset_options must be a DatasetOptions, got {dataset_options!r}")
    _check_numbers(epochs=epochs, step_time_cv=step_time_cv, price_per_hour=price_per_hour, max_hours=max_hours,
                   safety_margin=safety_margin, context_reserve_gib=context_reserve_gib,
                   host_memory_gib=host_memory_gib, chars_per_token=chars_per_token)
    _check_finite(price_per_hour=price_per_hour, max_hours=max_hours, context_reserve_gib=context_reserve_gib)
    _refuse_contradictions(training, lora_ranks, allow, precision)
    lora_ranks = DEFAULT_LORA_RANKS if lora_ranks is None else lora_ranks
    _check_lists(lora_ranks=lora_ranks, allow=allow)
    _check_integers(dataset_size=dataset_size, seq_len=seq_len, gpus_per_node=gpus_per_node,
                    **({} if isinstance(gpus, str) else {"gpus": gpus}),
                    **{f"lora_ranks[{i}]": rank for i, rank in enumerate(lora_ranks)})
    check_alloc_conf(alloc_conf)
    _warn_of_unquantized_experts(model, allow)
    counts = _checked_counts(str(gpus), dataset_size, epochs, dataset)
    options = _dataset_options(dataset_options, dataset, seq_len)
    seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    base = Setting(model=model, seq_len=seq_len, padding=_run_padding(padding, dataset, options),
                   attention=run_attention(model, attention), alloc_conf=alloc_conf)
    workspace = Workspace.open(gpu, calibrations, gpu_specs, intra_node_bandwidth, inter_node_bandwidth, step_time_cv)
    if workspace.card.name == CPU and alloc_conf:
        raise FtplanError("alloc_conf (--alloc-conf) sets PyTorch's CUDA allocator; a CPU run has none")
    request = PlanRequest(base=base, dataset_size=dataset_size if dataset is None else dataset_size or 1,  # or its rows
                          epochs=epochs, gpu=workspace.card,
                          budget=workspace.budget(safety_margin, context_reserve_gib),
                          price_per_gpu_hour=price_per_hour, max_hours=max_hours, by=by, training=training,
                          lora_ranks=tuple(lora_ranks), host_memory_gib=host_memory_gib, precision=precision,
                          allow=tuple(allow))
    dataset_file = None if dataset is None else DatasetFile(Path(dataset), options, text_field, ids_field,
                                                            Path(tokenizer) if tokenizer else None, chars_per_token)
    return _plan_counts(workspace, model, request, counts, gpus_per_node, dataset_file, progress)


def _plan_counts(workspace: Workspace, model: str, request: PlanRequest, counts: list[int], gpus_per_node: int,
                 dataset: DatasetFile | None, progress: Callable[[str], None] | None) -> PlanResult:
    """One count is planned setup by setup (from the dataset's batches when there is one), several as a scaling;
    either way the result says what it rests on: the layout, the links, the overlap and the failed trials."""
    evidence, base = workspace.evidence, request.base
    extra = list(dict.fromkeys(s.with_(padding=base.padding, attention=base.attention, alloc_conf=base.alloc_conf)
                               for s in evidence.calibrated_settings(model)))  # in the run's recipe; theirs inform
    scaling, dataset_plan, dataset_lines, links_text = None, None, (), workspace.links_text()
    if len(counts) == 1:
        per_node, nodes = node_layout(counts[0], gpus_per_node)
        links_text = f"Layout: {describe_layout(per_node, nodes)}. {workspace.links_text(nodes)}"
        request = replace(request, base=base.with_(gpus=per_node, nodes=nodes))
        result_plan, dataset_plan, dataset_lines = _plan_one_count(workspace, request, extra, dataset)
    else:
        scaling = plan_gpu_counts(workspace.predictor, request, counts, gpus_per_node, extra, progress)
        result_plan = scaling.plan
    overlap = estimate_overlap(evidence.records, workspace.links)
    links_text += f" Overlap of communication with backward: {overlap.overlap:g}; {overlap.source}."
    return PlanResult(result_plan, scaling, evidence, workspace.links, links_text, evidence.failed_trials(model),
                      dataset_plan, tuple(dataset_lines),
                      (*cached_architecture(model).caveats,
                       *headline(result_plan, evidence.records, evidence.card_of,
                                 dataset.options.global_batch if dataset else None)))


@dataclass(frozen=True)
class DatasetFile:
    """A dataset to plan from and how to read and batch it (plan's dataset arguments, together)."""

    path: Path
    options: DatasetOptions
    text_field: str | None
    ids_field: str | None
    tokenizer: Path | None
    chars_per_token: float | None


def _plan_one_count(workspace: Workspace, request: PlanRequest, extra: list[Setting],
                    dataset: DatasetFile | None) -> tuple[Plan, DatasetPlan | None, Sequence[str]]:
    """The plan for one GPU layout: ranked setups, from the dataset's own batches when there is one, with each
    batch a rehearsal ran inside its budget marked verified."""
    dataset_plan, dataset_lines = None, ()
    if dataset is None:
        plan_ = make_plan(workspace.predictor, request, extra)
    else:  # planned at the dataset's own lengths only: at the --seq-len cap an 8B of 50-token rows fit nowhere
        dataset_plan, dataset_lines = plan_dataset_file(
            workspace.predictor, request, dataset.path, dataset.options, dataset.text_field, dataset.ids_field,
            dataset.tokenizer, extra, dataset.chars_per_token)
        plan_ = dataset_plan.plan
    evidence = workspace.evidence
    plan_ = mark_verified(plan_, evidence.rehearsals, dataset_plan, evidence.card_of)
    return plan_, (replace(dataset_plan, plan=plan_) if dataset_plan is not None else None), dataset_lines


def _warn_of_unquantized_experts(model: str, allow: Sequence[str]) -> None:
    """QLoRA on a mixture of experts quantizes little: say so before its setups need more memory than bf16 LoRA.
    Loading the architecture also refuses an unknown model, with close names, before any fitting."""
    arch = load_architecture(model)
    if "qlora" in allow and arch.experts:
        experts = arch.param_counts.experts / arch.params_total
        warnings.warn(f"QLoRA on {model}: bitsandbytes quantizes nn.Linear weights only, and {experts:.0%} of its "
                      "parameters are fused experts, which stay unquantized and are cast to fp32 by "
                      "prepare_model_for_kbit_training: its QLoRA setups need more memory than LoRA on a bf16 base",
                      stacklevel=3)


def _checked_counts(gpus: str, dataset_size: int | None, epochs: float, dataset: Path | str | None) -> list[int]:
    """The GPU counts to plan, refused where the run could not give every GPU a sample per step."""
    if dataset is None and dataset_size is None:
        raise FtplanError("give a dataset size, or a dataset to plan from its token lengths")
    counts = parse_gpu_counts(gpus)
    if dataset_size is not None:
        check_samples(dataset_size, epochs)
    if dataset_size is not None and max(counts) > dataset_size:
        raise FtplanError(f"{max(counts):,} GPUs for {dataset_size:,} samples: each GPU needs a sample "
                          f"per step; use --gpus up to {dataset_size:,}")
    if dataset is not None and len(counts) > 1:
        raise FtplanError("--dataset plans one GPU count at a time; give --gpus N")
    return counts


def _dataset_options(options: DatasetOptions | None, dataset: Path | str | None, seq_len: int | None) -> DatasetOptions:
    """The batching options as `ftplan plan` resolves them: a given seq_len cuts the samples, and packing's rows
    default to the sequence length; without a dataset there is nothing to batch."""
    if dataset is None:
        default = DatasetOptions()
        if options is not None and (options.strategy, options.pack_length, options.too_long, options.global_batch) != (
                default.strategy, default.pack_length, default.too_long, default.global_batch):
            raise FtplanError("dataset_options need a dataset: without one every sample is padded to seq_len")
        return default
    options = options or DatasetOptions()
    if options.strategy == "pack" and options.pack_length is None:
        options = replace(options, pack_length=DEFAULT_SEQ_LEN if seq_len is None else seq_len)
    if seq_len is not None and options.max_length is None:
        options = replace(options, max_length=seq_len)
    return options


def _run_padding(padding: str, dataset: Path | str | None, options: DatasetOptions) -> str:
    """The padding the run's collator applies: the caller's without a dataset, the batching's with one."""
    if padding not in NO_DATASET_PADDINGS:
        raise FtplanError(f"padding must be one of {', '.join(NO_DATASET_PADDINGS)}, got {padding!r}")
    if dataset is None:
        return padding
    if padding != "max_length":
        raise FtplanError("with a dataset its batching sets the padding; leave padding out")
    return STRATEGY_PADDING[options.strategy]


def predict(model: str, batch_size: int, gpu: str = "H200", *, calibrations: Sequence[Path | str] = (),
            gpu_specs: Path | str | None = None, **setting) -> Prediction:
    """Peak memory per GPU and seconds per step of one setting and micro-batch, as `ftplan predict`;
    setting: the Setting fields (seq_len, precision, zero_stage, offload_optimizer, liger, lora_rank,
    gradient_checkpointing, gpus, nodes, ...) as a record holds them: gpus is GPUs per node and nodes the node
    count (gpus=8, nodes=2 is the CLI's --gpus 16, which lays out 8 a node by default); padding defaults to
    "max_length", the padded and masked batches of `ftplan predict` and of plan's emitted collator
    (padding="none": rows of exactly seq_len)."""
    _check_names(model=model, gpu=gpu)
    _check_optional_names(gpu_specs=gpu_specs)
    calibrations = _paths(calibrations)
    _check_integers(batch_size=batch_size)
    targets = setting.get("lora_targets", ())
    if not isinstance(targets, (list, tuple)) or (not targets and "lora_targets" in setting):  # "q_proj" is letters
        raise FtplanError(f"lora_targets must be a list of module names, got {targets!r}")
    unknown = sorted(set(setting) - {f.name for f in fields(Setting)})
    if unknown:
        raise FtplanError(f"unknown setting field(s) {', '.join(unknown)}; the fields are those of "
                          "ftplan.core.settings.Setting other than model")
    load_architecture(model)
    wanted = Setting(model=model, **{"padding": NO_DATASET_PADDINGS[0], **setting})
    check_alloc_conf(wanted.alloc_conf)
    return Workspace.open(gpu, calibrations, gpu_specs).predict(wanted, batch_size)


# Notebook arguments are checked here, as click checks the CLI's: a string or 4.5 reached the arithmetic as a
# bare TypeError, or planned a fractional batch as if it were measured.
def _check_names(**values: object) -> None:
    for name, value in values.items():
        if not isinstance(value, (str, Path)):
            raise FtplanError(f"{name} must be a string, got {value!r}")


def _check_optional_names(**values: object) -> None:
    _check_names(**{name: value for name, value in values.items() if value is not None})


def _paths(calibrations: object) -> list[Path | str]:
    """Calibration paths: one path may come alone (a string iterated as paths read each letter as a file)."""
    paths = [calibrations] if isinstance(calibrations, (str, Path)) else calibrations
    if not isinstance(paths, (list, tuple)):
        raise FtplanError(f"calibrations must be a path or a list of paths, got {calibrations!r}")
    _check_names(**{f"calibrations[{i}]": path for i, path in enumerate(paths)})
    return list(paths)


def _check_dataset_arguments(dataset: object, dataset_size: object, **reading: object) -> None:
    """As the CLI refuses them: a dataset's reading options without a dataset were ignored without a word, and a
    dataset_size beside a dataset lost to the file's rows."""
    given = [name for name, value in reading.items() if value is not None]
    if dataset is None and given:
        raise FtplanError(f"{', '.join(given)} {'reads' if len(given) == 1 else 'read'} a dataset: give dataset= too")
    if dataset is not None and dataset_size is not None:
        raise FtplanError("dataset_size is the sample count without a dataset; with one, its rows are counted")


def _refuse_contradictions(training: str, lora_ranks: Sequence[int] | None, allow: Sequence[str],
                           precision: str | None) -> None:
    """Options the plan would drop without a word: LoRA ranks or QLoRA beside full fine-tuning alone, QLoRA
    beside a precision it does not train in (its base is 4-bit, its compute bf16 or fp16)."""
    if training == "full" and lora_ranks is not None:
        raise FtplanError("LoRA ranks choose among LoRA setups, and full fine-tuning alone leaves them out: "
                          "give one (--full or --lora-ranks)")
    qlora = isinstance(allow, (list, tuple)) and "qlora" in allow
    if qlora and training == "full":
        raise FtplanError("QLoRA is LoRA on a 4-bit base, and full fine-tuning alone leaves it out: "
                          "give one (--full or --allow qlora)")
    if qlora and precision not in (None, "bf16", "fp16"):
        raise FtplanError(f"QLoRA computes in bf16 or fp16 mixed precision, and precision {precision} leaves it out: "
                          "give one (--precision or --allow qlora)")


def _check_lists(**values: object) -> None:
    """A list or tuple: 16 for lora_ranks ended in a bare TypeError, and allow="qlora" was read letter by letter."""
    for name, value in values.items():
        if not isinstance(value, (list, tuple)):
            raise FtplanError(f"{name} must be a list, got {value!r}")
    unknown = [option for option in values.get("allow", ()) if option not in ALLOWED]
    if unknown:
        raise FtplanError(f"allow takes {', '.join(map(repr, ALLOWED))}, got {unknown[0]!r}")


def _check_integers(**values: object) -> None:
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise FtplanError(f"{name} must be a whole number, got {value!r}")


def _check_numbers(**values: object) -> None:
    """Types only: each value's range (positive, finite) is checked where it is used, as for the CLI."""
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise FtplanError(f"{name} must be a number, got {value!r}")


def _check_finite(**values: float | None) -> None:
    """The numbers no later check bounds, which the CLI's types keep finite: NaN compared false everywhere and
    planned nothing, and inf wrote invalid JSON."""
    for name, value in values.items():
        if value is not None and not math.isfinite(value):
            raise FtplanError(f"{name} must be a finite number, got {value!r}")
