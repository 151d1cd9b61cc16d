"""Turn the recommended setup into files that run as-is with the Hugging Face Trainer and DeepSpeed.

The DeepSpeed JSON starts from calibration's own definition (calibration/deepspeed_config.py), so
the emitted run is configured like the runs the prediction came from; the batch is written out
explicitly so the file says what was planned, and the Trainer checks it against its arguments.
training_args.py adds what TrainingArguments cannot carry: the collator of the planned batching
(ftplan.planner.emit_batching).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from ftplan.calibration.deepspeed_config import deepspeed_config
from ftplan.core import recipe
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import CPU
from ftplan.core.settings import Setting
from ftplan.models.eta import spoken_duration
from ftplan.planner.dataset_plan import ALLOC_CONF_DOC, DatasetPlan
from ftplan.planner.emit_batching import (
    PlannedBatch,
    collator_code,
    length_limit_comment,
    planned_batch,
    sampler_args,
    training_args_py,
)
from ftplan.planner.search import PlanRequest, SetupPlan

DS_CONFIG = "ds_config.json"
TRAINING_ARGS = "training_args.json"
TRAINING_ARGS_PY = "training_args.py"
README = "README.txt"
PLAN_JSON = "plan.json"  # the plan in numbers, for `ftplan rehearse`: recipe, batching, predictions, budget
OWN_FILES = (DS_CONFIG, TRAINING_ARGS, TRAINING_ARGS_PY, README, PLAN_JSON)  # all ftplan ever writes into an emit folder
MANIFEST = ".ftplan-manifest.json"  # what ftplan wrote there and its digest: all --force may replace
MAX_OWN_FILE_BYTES = 2**26  # plan.json holds a dataset's token lengths
OUTPUT_DIR = "output"


def ds_config(setting: Setting, micro_batch: int, accumulation: int = 1) -> dict | None:
    """DeepSpeed config with the planned micro-batch and accumulation (the Trainer refuses a mismatch with its
    own arguments); None when the setup runs without DeepSpeed."""
    config = deepspeed_config(setting)
    if config is None:
        return None
    precision = {"bf16": {"enabled": setting.precision == "bf16"}, "fp16": {"enabled": setting.precision == "fp16"}}
    return {**config, **precision, "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": accumulation}


def training_args(setting: Setting, micro_batch: int, epochs: float, output_dir: str,
                  ds_config_path: str | None, accumulation: int = 1, sampler: dict | None = None) -> dict:
    """Keyword arguments for transformers.TrainingArguments, matching the calibrated setup and the planned
    batch split; sampler: the batching's sampler keys (emit_batching.sampler_args)."""
    args = {
        "output_dir": output_dir,
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": accumulation,
        **(sampler or {}),
        "num_train_epochs": epochs,
        **recipe.trainer_arguments(setting),  # the calibration trial's own arguments
    }
    if ds_config_path is not None:
        args["deepspeed"] = ds_config_path
    return args


def headline(setup: SetupPlan, request: PlanRequest) -> str:
    """The plan in one line, heading the README and training_args.py."""
    return f"{setup.label} for {setup.setting.model} on {setup.setting.world_size} x {request.gpu.name}"


def _launch_command(setting: Setting) -> str:
    """The launcher the setting's stack needs: DeepSpeed's own on one node, torchrun's rendezvous across nodes."""
    if setting.nodes > 1:
        return (f"torchrun --nnodes {setting.nodes} --nproc_per_node {setting.gpus} --rdzv-backend c10d "
                "--rdzv-endpoint HOST:29500 train.py  (on every node; HOST is the first node)")
    if setting.uses_deepspeed:
        return f"deepspeed --num_gpus {setting.gpus} train.py"
    return f"torchrun --nproc_per_node {setting.gpus} train.py"


def _recipe_lines(setup: SetupPlan, request: PlanRequest, batch: PlannedBatch) -> list[str]:
    """What the plan chose and how train.py takes it in, since the Trainer arguments alone cannot carry the model."""
    lines = [
        f"ftplan plan: {headline(setup, request)}",
        (f"micro-batch {batch.micro_batch} x gradient accumulation {batch.accumulation} per GPU, "
         f"{setup.eta.steps:,} steps x {setup.eta.seconds_per_step:.2f} s = "
         f"{spoken_duration(setup.eta.total_seconds)}, predicted source: {setup.best.source}"),
        "",
        "The recipe is training_args.py: the Trainer arguments under your transformers' names, the collator, and",
        "how the model is loaded and prepared (dtype, attention implementation, QLoRA's 4-bit base, the LoRA",
        "adapters), each as the plan's calibration ran it. Use all four in your train.py:",
        "    from training_args import training_arguments, data_collator, model_kwargs, prepare_model",
        "    model = prepare_model(AutoModelForCausalLM.from_pretrained(MODEL, **model_kwargs()))",
    ]
    if batch.strategy == "pack":
        return lines + [("    trainer = SFTTrainer(model=model, args=training_arguments(), train_dataset=train, "
                         "processing_class=tokenizer)  # TRL: packing lives in its SFTConfig")]
    collator, why = collator_code(batch)
    return lines + [("    trainer = Trainer(model=model, args=training_arguments(), train_dataset=train, "
                     "data_collator=data_collator(tokenizer))"),
                    f"    (the collator: {collator}: {why})"]


def _batch_shape_lines(setting: Setting, batch: PlannedBatch) -> list[str]:
    """The data the plan assumed, because other data (shorter rows, dynamic shapes) meets memory it never measured."""
    lines = []
    if batch.strategy == "group":
        lines.append("    transformers 4.x: group_by_length=True instead of train_sampling_strategy (training_args.py "
                     "picks the one your version takes)")
    if setting.padding == "none":
        lines += [f"    PLANNED FOR ROWS OF EXACTLY {setting.seq_len} TOKENS (chunked as run_clm's group_texts does): the",
                  "    collator then pads nothing and no mask reaches attention, as in the calibration trials. A shorter",
                  "    row is padded and masked, which sends SDPA down its masked path (K/V expanded to every query head,",
                  "    an additive mask per layer: GiBs more at large batches) that this plan did not measure; for such",
                  "    data plan with --padding max_length (the default) or --dataset."]
    if not batch.from_dataset:
        lines.append('    Dynamic padding (padding="longest") pads less, but on a GPU its changing shapes can make the '
                     "caching allocator reserve more; `ftplan plan --dataset` plans it.")
    return lines + [f"    {line[2:]}" for line in length_limit_comment(batch)]


def _run_lines(setting: Setting, batch: PlannedBatch) -> list[str]:
    """Where to launch from, since the arguments' paths are relative to the folder."""
    return ["", "Run your train.py (copied here) from this folder: the paths in the arguments (output/"
            + (", ds_config.json" if setting.uses_deepspeed else "") + ") are relative to it, so the folder",
            "works wherever it is copied (to the cluster, say):",
            f"    cd THIS_FOLDER && {_launch_command(setting)}",
            "training_args.json holds the same Trainer arguments as data, for tools that read JSON; it keeps the",
            "older checkpointing names (gradient_checkpointing), which training_args.py renames where your",
            "transformers has activation_checkpointing" + (", and it cannot carry packing" if batch.strategy == "pack"
                                                           else "") + "."]


def _allocator_lines(batch: PlannedBatch) -> list[str]:
    """The allocator setting must be in the environment before CUDA starts, which the Trainer arguments cannot do."""
    if not batch.alloc_conf:
        return []
    return ["", "Before the run, on every node: micro-batches whose shape changes every step fragment PyTorch's CUDA",
            "caching allocator (on an H200 an epoch of dynamic padding reserved up to 1.8x what the calibration",
            "measured at its longest micro-batch); expandable segments let it grow one segment instead:",
            f"    export PYTORCH_CUDA_ALLOC_CONF={shlex.quote(batch.alloc_conf)}",
            f"    ({ALLOC_CONF_DOC})",
            "training_args.py sets it too, when train.py imports it before anything is put on the GPU."]


def _liger_lines(setting: Setting) -> list[str]:
    """Liger outside the Trainer needs the model patched by hand, or the plan's memory is not what runs."""
    if not setting.liger:
        return []
    return ["", "Liger: training_args.json sets use_liger_kernel=True; outside the Trainer patch the model first:",
            "    from liger_kernel.transformers import AutoLigerKernelForCausalLM",
            "    model = prepare_model(AutoLigerKernelForCausalLM.from_pretrained(MODEL, **model_kwargs()))"]


REHEARSE_LINES = ("", "Before the full run, on the GPU: `ftplan rehearse THIS_FOLDER` runs it unchanged for a few steps on the",
                  "heaviest batches; if it runs out of memory or comes within the safety margin it lowers the batch",
                  "(raising gradient accumulation to keep the global batch), and while a run leaves room it tries a",
                  "larger one (where the plan chose the global batch); it rewrites this folder to the largest that ran.")
# `ftplan rehearse` runs one GPU (planner/rehearse.py refuses more): a multi-GPU folder is tried with its launcher.
CLUSTER_REHEARSE_LINES = ("", "Before the full run: `ftplan rehearse` runs one GPU and this plan uses {gpus}, so run",
                          "the launch command above for a few steps first (max_steps=20 in TrainingArguments) on the",
                          "heaviest batches; the batch is not verified until such a run has ended without running out",
                          "of memory.")


CPU_REHEARSE_LINES = ("", "Before the full run: this plan is for the CPU (rehearse verifies GPU plans), so run",
                      "train.py for a few steps first (max_steps=20 in TrainingArguments) on the longest samples.")


def _rehearse_lines(setting: Setting, gpu: str) -> tuple[str, ...]:
    if setting.world_size > 1:
        return tuple(line.format(gpus=setting.world_size) for line in CLUSTER_REHEARSE_LINES)
    return CPU_REHEARSE_LINES if gpu == CPU else REHEARSE_LINES


def readme(setup: SetupPlan, request: PlanRequest, batch: PlannedBatch, plan_warnings: Sequence[str] = ()) -> str:
    """How to use the files, and the collator, Liger and LoRA lines the Trainer arguments cannot carry."""
    setting = setup.setting
    lines = [*_recipe_lines(setup, request, batch), *_batch_shape_lines(setting, batch), *_run_lines(setting, batch),
             *_allocator_lines(batch), *_liger_lines(setting), *_rehearse_lines(setting, request.gpu.name)]
    if plan_warnings:  # the folder travels without the terminal that showed them
        lines += ["", "WARNINGS from the plan:", *(f"  - {w}" for w in plan_warnings)]
    return "\n".join(lines) + "\n"


def write_configs(directory: Path, setup: SetupPlan, request: PlanRequest, force: bool = False,
                  dataset: DatasetPlan | None = None, plan_warnings: Sequence[str] = ()) -> list[Path]:
    """Write training_args.json and .py, ds_config.json (DeepSpeed setups only) and README.txt; return their
    paths. With a dataset plan, its batching (micro-batch × accumulation, sampler, collator) is written;
    plan_warnings (what the plan warned of) go into README.txt.

    The folder must be empty, so a user's files are never overwritten; force replaces the files ftplan
    wrote there, as its manifest lists them and unedited (all of them, so no ds_config.json of an earlier
    plan is left beside a plan without DeepSpeed), and keeps the rest. The new files are written whole into
    a staging folder first and renamed into place: a full disk leaves the old plan as it was. Nothing is
    written through a symlink, which could point anywhere.
    """
    directory = Path(directory)
    if directory.is_symlink():
        raise FtplanError(f"{directory} is a symlink; emit into a real folder")
    lengths = dataset.limited.lengths.tolist() if dataset is not None else None
    files = _file_texts(setup, request, planned_batch(setup, request, dataset), plan_warnings, lengths)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _locked_folder(directory) as folder:
            ours = _replaceable(folder, directory, set(files), force)
            _stage_and_rename(folder, {**files, MANIFEST: _manifest(files)}, stale=ours - set(files))
    except OSError as exc:
        raise FtplanError(f"cannot write configs to {directory}: {exc.strerror or exc}; "
                          "the folder is left as it was") from None
    return [directory / name for name in files]


def _file_texts(setup: SetupPlan, request: PlanRequest, batch: PlannedBatch,
                plan_warnings: Sequence[str] = (), lengths: list[int] | None = None) -> dict[str, str]:
    """Every file of the plan by name; paths inside are relative to the folder, so it can be copied as a whole."""
    ds = ds_config(setup.setting, batch.micro_batch, batch.accumulation)
    args = training_args(setup.setting, batch.micro_batch, request.epochs, OUTPUT_DIR, DS_CONFIG if ds else None,
                         batch.accumulation, sampler_args(batch))
    if request.gpu.name == CPU:  # as the CPU trial ran it (no pinned-memory warning on a host without a GPU)
        args["use_cpu"] = True
    texts = {DS_CONFIG: json.dumps(ds, indent=2) + "\n"} if ds else {}
    return {**texts, TRAINING_ARGS: json.dumps(args, indent=2) + "\n",
            TRAINING_ARGS_PY: training_args_py(args, batch, headline(setup, request)),
            README: readme(setup, request, batch, plan_warnings),
            PLAN_JSON: plan_json(plan_numbers(setup, request, batch, lengths))}


def plan_json(numbers: dict) -> str:
    """plan.json's text: indented, but the token lengths on one line (a dataset has many)."""
    text = json.dumps({**numbers, "lengths": None}, indent=1)
    return text.replace('"lengths": null', f'"lengths": {json.dumps(numbers["lengths"], separators=(",", ":"))}') + "\n"


def plan_numbers(setup: SetupPlan, request: PlanRequest, batch: PlannedBatch, lengths: list[int] | None) -> dict:
    """What `ftplan rehearse` needs to run the folder and judge the run: the recipe, the batching, the dataset's
    token lengths after the limit (None: samples padded to the planned length), the predictions and the budget."""
    best = setup.best
    return {"written_by": "ftplan plan --emit", "setting": setup.setting.to_dict(),
            "micro_batch": batch.micro_batch, "accumulation": batch.accumulation, "strategy": batch.strategy,
            "length": batch.length, "gpu": request.gpu.name, "usable_bytes": request.budget.usable_bytes,
            "safety_margin": request.budget.margin,
            "predicted": {"evidence": best.evidence, "peak_allocated_bytes": best.peak_allocated.mean,
                          "peak_allocated_upper_bytes": best.peak_allocated.upper,
                          "peak_reserved_bytes": best.peak_reserved.mean,
                          "peak_reserved_upper_bytes": best.peak_reserved.upper,
                          "seconds_per_step": setup.eta.seconds_per_step, "steps": setup.eta.steps},
            "limit": batch.limit, "too_long": batch.too_long, "headline": headline(setup, request),
            "global_batch_asked": batch.global_batch, "largest_fitting": batch.largest_fitting, "rehearsals": [],
            "lengths": lengths}


def rewrite_rehearsed(directory: Path, micro_batch: int, accumulation: int, rehearsal: dict, note: str) -> None:
    """After a rehearsal: the folder at this batch split (the global batch kept), the rehearsal added to
    plan.json and its note to README.txt. Only files ftplan wrote and nobody edited are rewritten."""
    directory = Path(directory)
    numbers = json.loads((directory / PLAN_JSON).read_text())
    setting = Setting.from_dict(numbers["setting"])
    args = {**json.loads((directory / TRAINING_ARGS).read_text()), "per_device_train_batch_size": micro_batch,
            "gradient_accumulation_steps": accumulation}
    batch = PlannedBatch(micro_batch, accumulation, numbers["strategy"], numbers["length"], numbers["limit"],
                         numbers["too_long"], numbers["lengths"] is not None, setting.alloc_conf, setting)
    numbers = {**numbers, "micro_batch": micro_batch, "accumulation": accumulation,
               "rehearsals": [*numbers["rehearsals"], rehearsal]}
    readme_text = re.sub(r"micro-batch \d+ x gradient accumulation \d+ per GPU",
                         f"micro-batch {micro_batch} x gradient accumulation {accumulation} per GPU",
                         (directory / README).read_text(), count=1)
    files = {TRAINING_ARGS: json.dumps(args, indent=2) + "\n",
             TRAINING_ARGS_PY: training_args_py(args, batch, numbers["headline"]),
             README: readme_text.rstrip("\n") + f"\n\n{note}\n", PLAN_JSON: plan_json(numbers)}
    ds = ds_config(setting, micro_batch, accumulation)
    if ds:
        files[DS_CONFIG] = json.dumps(ds, indent=2) + "\n"
    try:
        with _locked_folder(directory) as folder:
            ours = _replaceable(folder, directory, set(files), force=True)
            _stage_and_rename(folder, {**files, MANIFEST: _manifest({**_read_manifest_texts(folder, ours), **files})},
                              stale=set())
    except OSError as exc:
        raise FtplanError(f"cannot rewrite {directory}: {exc.strerror or exc}; the folder is left as it was") from None


@contextlib.contextmanager
def _locked_folder(directory: Path) -> Iterator[int]:
    """The folder's descriptor (the folder checked is the one written, never a symlink's target), held under an
    exclusive lock: two plans emitting into one folder at once left one's plan.json beside the other's
    arguments, and a manifest matching neither."""
    folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(folder)  # and with it the lock


def _read_manifest_texts(folder: int, names: set[str]) -> dict[str, str]:
    """The current text of ftplan's own files, so a rewrite's manifest lists those it left alone too."""
    texts = {}
    for name in names:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
        with os.fdopen(fd, encoding="utf-8") as file:
            texts[name] = file.read()
    return texts


def _occupied(directory: Path) -> FtplanError:
    return FtplanError(f"{directory} is not empty; emit into a new folder, or pass --force to replace "
                       f"the files an earlier `ftplan plan --emit` wrote there and keep the rest")


def refuse_occupied(directory: Path, force: bool) -> None:
    """Say before planning what writing would say after it: without --force a folder with anything in it is
    refused (write_configs checks again as it writes, on the folder it opened)."""
    try:
        occupied = not force and directory.is_dir() and bool(set(os.listdir(directory)) - {MANIFEST})
    except OSError:  # unreadable: write_configs says so as it opens the folder
        return
    if occupied:
        raise _occupied(directory)


def _replaceable(folder: int, directory: Path, names: set[str], force: bool) -> set[str]:
    """The files of an earlier plan that force may replace or remove: those ftplan's manifest lists with
    the content it wrote. Refuses a folder with anything in it unless forced, and, forced, any file of a
    name ftplan writes that is not such a file (the user's own README.txt) or is a symlink."""
    present = set(os.listdir(folder)) - {MANIFEST}
    if present and not force:
        raise _occupied(directory)
    ours = {name for name, digest in _read_manifest(folder).items()
            if name in present and _is_file_with(folder, name, digest)}
    links = sorted(n for n in set(OWN_FILES) & present if stat.S_ISLNK(os.stat(n, dir_fd=folder, follow_symlinks=False).st_mode))
    if links:
        raise FtplanError(f"{directory / links[0]} is a symlink; ftplan does not write through it")
    foreign = sorted((names & present) - ours)
    if foreign:
        raise FtplanError(f"{directory / foreign[0]} was not written by ftplan (or was edited since); "
                          "move it away or emit into a new folder")
    return ours


def edited_run_files(directory: Path) -> list[str]:
    """The files that make the run (plan.json, the Trainer arguments, the DeepSpeed config) in an emitted folder
    not as ftplan wrote them (edited, or deleted), by the manifest's digests: what rehearse would not be verifying."""
    try:
        folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise FtplanError(f"cannot open {directory}: {exc.strerror}") from None
    try:
        run_files = {PLAN_JSON, TRAINING_ARGS, TRAINING_ARGS_PY, DS_CONFIG}
        present = set(os.listdir(folder)) & run_files
        written = _read_manifest(folder)
        missing = (set(written) & run_files) - present  # a deleted ds_config.json leaves a run that cannot start
        return sorted(missing | {name for name in present
                                 if name not in written or not _is_file_with(folder, name, written[name])})
    finally:
        os.close(folder)


def _regular_file(folder: int, name: str) -> bytes | None:
    """The first MAX_OWN_FILE_BYTES of a regular file in the folder; None for a link, a folder, a FIFO or nothing
    (Python's file objects refuse a folder's descriptor with a traceback)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:  # a symlink (ELOOP) or gone
        return None
    try:
        return os.read(fd, MAX_OWN_FILE_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def _is_file_with(folder: int, name: str, digest: str) -> bool:
    data = _regular_file(folder, name)
    return data is not None and hashlib.sha256(data).hexdigest() == digest


def _manifest(files: dict[str, str]) -> str:
    digests = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in files.items()}
    return json.dumps({"written_by": "ftplan plan --emit", "files": digests}, indent=2) + "\n"


def _read_manifest(folder: int) -> dict[str, str]:
    """{file name: sha256} of what ftplan wrote here; empty when there is no manifest or it is not one."""
    data = _regular_file(folder, MANIFEST)
    try:
        files = json.loads(data).get("files", {}) if data is not None else {}
    except (ValueError, AttributeError, RecursionError):
        return {}
    return {k: v for k, v in files.items() if k in OWN_FILES and isinstance(v, str)} if isinstance(files, dict) else {}


def _stage_and_rename(folder: int, files: dict[str, str], stale: set[str]) -> None:
    """Write every file whole (fsynced) into a staging folder, then rename each into place and remove the
    earlier plan's files the new one lacks; on any failure the staging folder goes and nothing else changes."""
    staging = f".ftplan-emit-{os.getpid()}-{secrets.token_hex(4)}"
    os.mkdir(staging, 0o700, dir_fd=folder)
    stage = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
    try:
        try:
            for name, text in files.items():
                _write_new(stage, name, text)
        except OSError:
            for name in os.listdir(stage):
                os.unlink(name, dir_fd=stage)
            raise
        for name in files:  # the manifest comes last: it lists only what is in place
            os.rename(name, name, src_dir_fd=stage, dst_dir_fd=folder)
        for name in stale:
            os.unlink(name, dir_fd=folder)
    finally:
        os.close(stage)
        os.rmdir(staging, dir_fd=folder)


def _write_new(folder: int, name: str, text: str) -> None:
    """Create the file afresh and flush it to disk: O_EXCL never opens an existing file or a symlink."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
