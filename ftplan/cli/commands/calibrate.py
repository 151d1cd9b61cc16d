"""`ftplan calibrate`: measure real short fine-tunes at a ladder of batch sizes, resumably.

A thin layer over ftplan.calibration.runner: it turns options into the cartesian product of settings and
draws progress. torch is imported only by the trial subprocesses, never here.
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import warnings
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ftplan.calibration import launcher, measure
from ftplan.calibration.build_locks import STALE_AFTER_SECONDS, clear_build_locks
from ftplan.calibration.extra import extra_problem
from ftplan.calibration.ladder import LadderStep
from ftplan.calibration.runner import CalibrationPlan, CalibrationProgress, calibrate, pinned_machine_id
from ftplan.cli.commands.dataset_options import check_dataset_options, dataset_options
from ftplan.cli.commands.input_options import FiniteFloat
from ftplan.cli.commands.options import MODEL_HELP, positive_int_list
from ftplan.cli.main import Dependencies
from ftplan.core.architecture import ALL_LINEAR_TARGETS, load_architecture, run_attention
from ftplan.core.errors import FtplanError, Terminated
from ftplan.core.recipe import check_alloc_conf
from ftplan.core.settings import ATTENTIONS, MAX_TRIAL_BATCH, MAX_TRIAL_SEQ_LEN, PRECISIONS, Setting
from ftplan.core.units import GIB
from ftplan.models.bytes_per_param import OPTIMIZER_STATE_BYTES
from ftplan.planner.dataset import CHARS_PER_TOKEN, load_lengths
from ftplan.planner.dataset_plan import calibration_length
from ftplan.store.records import open_store

# Three small batches fix the lines of the phases they sit in; the verify trials then test the plan
# itself: on the shipped ladders a safe, median-exact largest batch in about five trials
# (`python benchmarks/accuracy.py`, "3 points + verify"), where a full ladder took ten or more.
QUICK_BATCH_SIZES = (1, 2, 4)
DEFAULT_MAX_BATCH = {"cuda": 1024, "cpu": 4}  # a CPU never runs out of memory before swapping, so stop early
# A CPU calibration should take minutes: 256 tokens in fp32, the Trainer's own default off a GPU. bf16 on a
# CPU without bf16 units ran tiny-llama 30x slower (3.7 s/step against 0.1 at 256 tokens, batch 1).
CALIBRATED_PADDINGS = ("max_length", "longest", "none")  # packed rows are not calibrated yet: plans say so
DEFAULT_SEQ_LEN = {"cuda": 2048, "cpu": 256}
DEFAULT_PRECISION = {"cuda": "bf16", "cpu": "fp32"}
SWITCH = click.Choice(["on", "off", "both"])
NOISY_STEP_SPREAD = 2.0  # one trial's slowest step over its fastest: a quiet GPU's steps differ by a few percent
EXIT_NOTHING_MEASURED = 1  # every trial failed: what a script must not take for a calibration


def _split_targets(_ctx, _param, value: str) -> tuple[str, ...]:
    """Unknown module names are left to Architecture.lora_params, which names them per model."""
    return tuple(t.strip() for t in value.split(",") if t.strip())


def _switch(value: str) -> tuple[bool, ...]:
    return {"on": (True,), "off": (False,), "both": (False, True)}[value]


# Beyond what any trial can mean: 10^20 built a row list (or a step loop) until --timeout, or overflowed in torch
# (MAX_TRIAL_BATCH and MAX_TRIAL_SEQ_LEN are in core.settings: a rehearsal's plan.json is held to them too).
MAX_TRIAL_STEPS = 10_000  # measured or warm-up steps
MAX_TRIAL_GPUS = 1024  # ranks on this one machine


@click.command("calibrate")
@click.option("--model", "models", multiple=True, required=True,
              help=f"{MODEL_HELP} Repeatable.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Train on the GPU(s), or on this machine's CPU (no GPU needed; defaults chosen to finish in "
                   "minutes, and `ftplan plan --gpu cpu` plans from it).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSONL file to append to (and resume from).  [default: calibrations/<machine>.jsonl]")
@click.option("--machine", default=None,
              help="Machine id stored in every record.  [default: $FTPLAN_MACHINE_ID, else the one --out's records "
                   "carry, else the host name]")
@click.option("--seq-len", "seq_lens", type=click.IntRange(min=1, max=MAX_TRIAL_SEQ_LEN), multiple=True,
              help="Tokens per sample; repeatable. With --dataset: the longest a sample may be.  "
                   "[default: 2048 on cuda, 256 on cpu; with --dataset, its longest sample]")
@dataset_options
@click.option("--zero-stage", "zero_stages", type=click.IntRange(0, 3), multiple=True, default=(0,), show_default=True,
              help="DeepSpeed ZeRO stage, 0 = no DeepSpeed; repeatable.")
@click.option("--offload", type=SWITCH, default="off", show_default=True, help="Optimizer offload to CPU (needs ZeRO).")
@click.option("--liger", type=SWITCH, default="off", show_default=True, help="Liger Kernel.")
@click.option("--gradient-checkpointing", type=SWITCH, default="off", show_default=True,
              help="Recompute activations during backward (less memory, more compute).")
@click.option("--lora-rank", "lora_ranks", type=click.IntRange(min=0), multiple=True, default=(0,), show_default=True,
              help="LoRA rank, 0 = full fine-tuning; repeatable.")
@click.option("--lora-targets", default=",".join(ALL_LINEAR_TARGETS), show_default=True, callback=_split_targets,
              help="Comma-separated module names LoRA adapts.")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Precision of training: bf16 mixed precision, bf16-pure (model loaded in bf16), fp16 or fp32.  "
                   "[default: bf16 on cuda; fp32 on cpu, which trains fastest without bf16 units]")
@click.option("--quantization", type=click.Choice(["", "nf4"]), default="", show_default=True,
              help="nf4: QLoRA, LoRA (--lora-rank) on a 4-bit NF4 base with double quantization (bitsandbytes).")
@click.option("--optimizer", type=click.Choice(sorted(OPTIMIZER_STATE_BYTES)), default="adamw_torch", show_default=True,
              help="Trainer `optim`, e.g. paged_adamw_8bit (bitsandbytes) for QLoRA.")
@click.option("--gpus", type=click.IntRange(min=1, max=MAX_TRIAL_GPUS), default=1, show_default=True,
              help="GPUs (ranks) per trial.")
@click.option("--batch-sizes", callback=positive_int_list("batch sizes", MAX_TRIAL_BATCH), default=None,
              help="Comma-separated micro-batches to run.  [default on cuda: 1,2,4 then --verify]")
@click.option("--max-batch", type=click.IntRange(min=1, max=MAX_TRIAL_BATCH), default=None,
              help="Run the full ladder instead: double until OOM (or this batch), then bisect to the exact "
                   "largest batch.  [default on cpu: 4]")
@click.option("--verify/--no-verify", default=None,
              help="After the listed batches, run the batch the planner would recommend, bisecting down if it "
                   "runs out of memory (at most 3 trials).  [default: on with the default batch sizes]")
@click.option("--steps", type=click.IntRange(min=1, max=MAX_TRIAL_STEPS), default=4, show_default=True,
              help="Measured steps per trial.")
@click.option("--warmup-steps", type=click.IntRange(min=0, max=MAX_TRIAL_STEPS), default=2, show_default=True,
              help="Fewest untimed steps first; warm-up then goes on until a step takes within 10% of the one "
                   "before (at most 12 steps). 0: time from the first step.")
@click.option("--timeout", type=FiniteFloat(min=0, min_open=True), default=900.0, show_default=True,
              help="Seconds before a trial is ended as an error.")
@click.option("--alloc-conf", envvar="PYTORCH_CUDA_ALLOC_CONF", default="", show_default=False,
              callback=lambda _ctx, _param, value: check_alloc_conf(value),
              help="PYTORCH_CUDA_ALLOC_CONF for the trials (part of the setting).  [default: $PYTORCH_CUDA_ALLOC_CONF]")
@click.option("--padding", "paddings", type=click.Choice(CALIBRATED_PADDINGS), multiple=True,
              default=("max_length",), show_default=True,
              help="The collator's padding, as the emitted config's (`plan` without --dataset: max_length; "
                   "--batching dynamic/group: longest): padded batches carry a mask, which sends SDPA down its masked "
                   "path (K/V expanded to every query head); none: rows of exactly --seq-len, no mask. Repeatable.")
@click.option("--attention", type=click.Choice(ATTENTIONS), default=None,
              help="attn_implementation the model is loaded with (part of the setting).  [default: sdpa; eager where "
                   "SDPA cannot compute the model's attention: Gemma 2's softcapping]")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep every rank's log here (by default logs are deleted; failures quote their last line).")
@click.pass_context
def command(ctx: click.Context, models: tuple[str, ...], device: str, out: Path | None, machine: str | None,
            seq_lens: tuple[int, ...], dataset: Path | None, text_field: str | None, ids_field: str | None,
            tokenizer: Path | None, chars_per_token: float | None, too_long: str,
            zero_stages: tuple[int, ...], offload: str, liger: str,
            gradient_checkpointing: str, lora_ranks: tuple[int, ...], lora_targets: tuple[str, ...],
            precision: str | None, quantization: str, optimizer: str,
            gpus: int,
            batch_sizes: tuple[int, ...] | None, max_batch: int | None, verify: bool | None, steps: int, warmup_steps: int,
            timeout: float, alloc_conf: str, paddings: tuple[str, ...], attention: str | None, log_dir: Path | None) -> None:
    """Run short real fine-tunes of every combination of the options, at a ladder of batch sizes.

    Each trial runs in its own processes under a watchdog; every finished trial is appended at once,
    and re-running the same command skips what is already recorded.
    """
    check_dataset_options(ctx.params)
    if device == "cpu" and alloc_conf:  # recorded, it would split CPU records by a setting that did nothing
        raise click.UsageError("--alloc-conf sets PyTorch's CUDA allocator; a CPU run has none")
    console = Console(soft_wrap=True)
    if dataset is not None:
        seq_lens = (dataset_seq_len(dataset, text_field, ids_field, tokenizer, chars_per_token, seq_lens, too_long,
                                    console),)
    seq_lens = seq_lens or (DEFAULT_SEQ_LEN[device],)
    precision = precision or DEFAULT_PRECISION[device]
    ctx.params.update(seq_lens=seq_lens, precision=precision)  # the command line kept in every record names them
    settings = expand_settings(models, seq_lens, zero_stages, _switch(offload), _switch(liger),
                               _switch(gradient_checkpointing), lora_ranks, lora_targets, precision, gpus, alloc_conf,
                               paddings, attention, quantization=quantization, optimizer=optimizer)
    dependencies = ctx.find_object(Dependencies)
    trial_command = dependencies.trial_command if dependencies else None
    if trial_command is None:  # a stand-in trial (tests) needs no GPU
        settings = runnable_here(settings, device)
    plan = _calibration_plan(ctx, out, device, machine, batch_sizes, max_batch, verify, steps, warmup_steps, timeout,
                             log_dir, trial_command)
    for lock in clear_build_locks():  # a calibration killed mid-build (kill -9) left it; trials would wait on it
        click.echo(f"warning: removed {lock}, a PyTorch extension build lock over "
                   f"{STALE_AFTER_SECONDS // 60} minutes old", err=True)
    console.print(f"calibrating {len(settings)} setting(s) on {device}, appending to {plan.out}")
    with _sigterm_as_interrupt(), RichProgress(console) as progress:
        records = calibrate(settings, plan, progress)
    console.print(f"{len(records)} new record(s) in {plan.out}")
    for line in noisy_ladders(records, plan.out):
        click.echo(f"warning: {line}", err=True)
    failed = [record for record in records if record["status"] == "error"]
    if failed and len(failed) == len(records):  # a script must not take a run that measured nothing for a calibration
        click.echo(f"error: all {len(failed)} trial(s) failed, nothing was measured; the first: {failed[0]['message']}",
                   err=True)
        raise click.exceptions.Exit(EXIT_NOTHING_MEASURED)


def noisy_ladders(records: list[dict], out: Path) -> list[str]:
    """The settings whose new ladder ran faster a step at its largest batch than at its smallest, and the trials
    whose steps were far apart: a busy host's noise, said now, while the GPU (or CPU) is still at hand, rather
    than by a plan that extrapolates it (a CPU trial of steps 0.25-3.36 s was planned as 546 s at batch 521)."""
    from ftplan.models.fit import time_falls_with_batch, time_ladder

    ladders: dict[str, list[dict]] = {}
    for record in records:
        if record["status"] == "ok" and record.get("seconds_per_step"):
            ladders.setdefault(record["setting_key"], []).append(record)
    again = f"to measure again, delete these records from {out} and run the same command (it resumes what is missing)"
    lines = [f"{ladder[0]['model']} {Setting.from_dict(ladder[0]).label()}: step time fell as the batch grew "
             f"({time_ladder(ladder)}), so the host was busy or the steps too few; {again}"
             for ladder in ladders.values() if time_falls_with_batch(ladder)]
    for ladder in ladders.values():  # one trial's steps far apart: its median stands for neither
        for record in ladder:
            steps = [s for s in record.get("step_seconds") or [] if s > 0]
            if steps and max(steps) > NOISY_STEP_SPREAD * min(steps):
                lines.append(f"{record['model']} {Setting.from_dict(record).label()} batch {record['micro_batch']}: "
                             f"its steps took {min(steps):.2f} to {max(steps):.2f} s, so the host was busy; {again}")
    return lines


def _calibration_plan(ctx: click.Context, out: Path | None, device: str, machine: str | None,
                      batch_sizes: tuple[int, ...] | None, max_batch: int | None, verify: bool | None, steps: int,
                      warmup_steps: int, timeout: float, log_dir: Path | None,
                      trial_command: tuple[str, ...] | None) -> CalibrationPlan:
    """How every trial runs and where it is recorded; the store is checked first, so a bad path fails before any trial."""
    if batch_sizes is not None and max_batch is not None:  # the listed batches ran, the ladder's cap was dropped
        raise click.UsageError("--batch-sizes runs the batches listed, --max-batch the full ladder: give one")
    out = out or measure.default_records_path()
    _check_writable(out)  # before reading it: a symlink or a user's own file is refused unread
    machine = machine or measure.machine_id(pinned_machine_id(out))
    quick = device == "cuda" and batch_sizes is None and max_batch is None
    return CalibrationPlan(out=out, device=device, steps=steps, verify=quick if verify is None else verify,
                           warmup_steps=warmup_steps, timeout=timeout,
                           max_batch=max_batch or DEFAULT_MAX_BATCH[device],
                           batch_sizes=QUICK_BATCH_SIZES if quick else batch_sizes,
                           machine_id=machine, command=_command_line(ctx), log_dir=log_dir,
                           trial_command=trial_command)


def dataset_seq_len(dataset: Path, text_field: str | None, ids_field: str | None, tokenizer: Path | None,
                    chars_per_token: float | None, seq_lens: tuple[int, ...], too_long: str, console: Console) -> int:
    """The dataset's longest sample (capped by one --seq-len), printed with the length distribution it comes from."""
    if len(seq_lens) > 1:
        raise click.UsageError("with --dataset, calibration runs at its longest sample; give at most one --seq-len, "
                               "the longest a sample may be")
    read = load_lengths(dataset, text_field, ids_field, tokenizer,
                        CHARS_PER_TOKEN if chars_per_token is None else chars_per_token)
    length, lines = calibration_length(read, seq_lens[0] if seq_lens else None, too_long)
    for line in lines:
        console.print(line)
    return length


def expand_settings(models, seq_lens, zero_stages, offloads, ligers, checkpointings, lora_ranks, lora_targets,
                    precision, gpus, alloc_conf, paddings=("max_length",), attention=None, quantization: str = "",
                    optimizer: str = "adamw_torch") -> list[Setting]:
    """The cartesian product of the options; offload is only combined with ZeRO stages that support it."""
    if offloads == (True,) and 0 in zero_stages:
        raise FtplanError("--offload on needs DeepSpeed ZeRO: use --zero-stage 1-3 (or --offload both)")
    if quantization and not all(lora_ranks):
        raise FtplanError("--quantization nf4 is QLoRA: every --lora-rank must be above 0")
    if lora_targets != ALL_LINEAR_TARGETS and not any(lora_ranks):
        raise FtplanError("--lora-targets needs a --lora-rank above 0")
    for model in models:
        arch = load_architecture(model)
        for rank in {r for r in lora_ranks if r}:
            arch.lora_params(rank, lora_targets)  # names unknown modules in one line
    settings = []
    for model, seq_len, zero, off, lig, gc, rank, padding in itertools.product(
            models, seq_lens, zero_stages, offloads, ligers, checkpointings, lora_ranks, paddings):
        if off and zero == 0:
            continue
        settings.append(Setting(model=model, seq_len=seq_len, zero_stage=zero, offload_optimizer=off, liger=lig,
                                gradient_checkpointing=gc, lora_rank=rank,
                                lora_targets=lora_targets if rank else ALL_LINEAR_TARGETS,
                                precision=precision, gpus=gpus, alloc_conf=alloc_conf, padding=padding,
                                attention=run_attention(model, attention), quantization=quantization,
                                optimizer=optimizer))
    return list(dict.fromkeys(settings))


def runnable_here(settings: list[Setting], device: str) -> list[Setting]:
    """The settings the real trial can run on this device; the others are skipped with a warning, before
    an hour of trials rather than as error records after it. FtplanError when none can run."""
    if problem := extra_problem("ftplan calibrate"):
        raise FtplanError(problem)
    if device == "cuda" and (problem := launcher.cuda_problem()):
        raise FtplanError(problem + ("; use --device cpu" if problem.startswith("no CUDA GPU") else ""))
    problems = {setting: launcher.setting_problem(setting, device) for setting in settings}
    runnable = [setting for setting, problem in problems.items() if problem is None]
    if not runnable:
        raise FtplanError(f"nothing to calibrate on {device}: {problems[settings[0]]}")
    for setting, problem in problems.items():
        if problem is not None:
            warnings.warn(f"{setting.model} {setting.label()} skipped: {problem}", UserWarning, stacklevel=2)
    return runnable


def _check_writable(out: Path) -> None:
    """Fail now, not after the first hour of trials."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FtplanError(f"cannot write calibration file {out}: {exc.strerror}") from None
    os.close(open_store(out))


def _command_line(ctx: click.Context) -> str:
    """The command as it could be typed again, rebuilt from the parsed options (kept in every record)."""
    words = ["ftplan", "calibrate"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or value == "":
            continue
        flag = param.opts[0]
        for item in value if param.multiple else [value]:
            words += [flag, ",".join(map(str, item)) if isinstance(item, tuple) else str(item)]
    return shlex.join(words)


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM ends the run like Ctrl-C, so the running trial's ranks are ended too, not orphaned."""
    def interrupt(_signum, _frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RichProgress(CalibrationProgress):
    """Draws trial i of n, the current setting and batch, elapsed time, and one line per result."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=True)
        self.task = self.bar.add_task("starting", total=None)

    def __enter__(self) -> RichProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def trial_started(self, index: int, total: int, setting: Setting, batch: int) -> None:
        self.bar.update(self.task, description=f"{setting.model} {setting.label()} batch {batch}",
                        completed=index - 1, total=total)

    def trial_finished(self, record: dict) -> None:
        self.bar.advance(self.task)
        self.console.print(describe_record(record))

    def setting_finished(self, setting: Setting, step: LadderStep) -> None:
        self.console.print(f"  {setting.model} {setting.label()}: {step.reason}")


def describe_record(record: dict) -> str:
    """One line per finished trial: status, setting, batch, peak memory, speed, trial time."""
    head = f"{record['status']:<5} {record['model']} {Setting.from_dict(record).label()} batch {record['micro_batch']}"
    if record["status"] != "ok":
        return f"{head}: {record['message']} ({record['trial_seconds']:.0f} s)"
    return (f"{head}: peak {record['peak_allocated_bytes'] / GIB:.2f} GiB allocated, "
            f"{record['peak_reserved_bytes'] / GIB:.2f} GiB reserved, {record['seconds_per_step']:.3f} s/step "
            f"({record['trial_seconds']:.0f} s)")
