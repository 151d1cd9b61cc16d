"""`ftplan rehearse DIR`: run what `plan --emit DIR` wrote on the GPU, judge it against the card, lower the
batch (keeping the global batch) until a rehearsal runs inside the plan's memory budget, and raise it while a
safe run leaves room (where the plan chose the global batch itself).

A calibration trial measures a setting; a rehearsal measures the emitted folder itself (its collator, mask,
model loading, allocator setting and batch split), on the dataset's heaviest batches. Only a batch whose own
folder was rehearsed is "verified". Rehearsals are stored beside the calibrations, marked as such, and never
enter a fit: they are the user's data, not a controlled ladder.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ftplan.calibration.launcher import cuda_problem, run_process
from ftplan.core.errors import FtplanError
from ftplan.core.architecture import cached_architecture
from ftplan.core.hardware import CPU
from ftplan.core.settings import MAX_TRIAL_BATCH, MAX_TRIAL_SEQ_LEN, Setting
from ftplan.core.units import GIB
from ftplan.planner.emit import PLAN_JSON, TRAINING_ARGS_PY, edited_run_files, rewrite_rehearsed
from ftplan.store.records import build_record

REHEARSAL_COMMAND = (sys.executable, "-m", "ftplan.calibration.rehearsal")
PLAN_KEYS = ("setting", "micro_batch", "accumulation", "strategy", "length", "limit", "too_long", "headline",
             "usable_bytes", "predicted", "rehearsals", "lengths")
DEFAULT_STEPS = 20  # enough for the heaviest batches and a random mix after them
MAX_ATTEMPTS = 4  # the first run and three more (lowered, raised or bisected): a plan off by more needs a calibration


@dataclass(frozen=True)
class Rehearsal:
    """One run of the folder at one batch split, and whether it stayed inside the plan's budget."""

    micro_batch: int
    accumulation: int
    status: str  # ok, oom or error
    message: str
    result: dict
    usable_bytes: int

    @property
    def reserved(self) -> int:
        return int(self.result.get("peak_reserved_bytes") or 0)

    @property
    def safe(self) -> bool:
        """Ran, and reserved no more than the plan may use (the card less its safety margin)."""
        return self.status == "ok" and self.reserved <= self.usable_bytes

    @property
    def verdict(self) -> str:
        if self.safe:
            return "verified"
        if self.status == "ok":
            return f"over the budget ({self.reserved / GIB:.2f} GiB reserved > {self.usable_bytes / GIB:.2f} usable)"
        return f"{self.status}: {self.message}"

    def summary(self) -> dict:
        seconds = self.result.get("step_seconds") or []
        mixed = seconds[self.result.get("heavy_steps", 0):]
        return {"micro_batch": self.micro_batch, "accumulation": self.accumulation, "verdict": self.verdict,
                "peak_allocated_bytes": self.result.get("peak_allocated_bytes"),
                "peak_reserved_bytes": self.result.get("peak_reserved_bytes"),
                "num_alloc_retries": self.result.get("num_alloc_retries"),
                "seconds_per_step_mixed": statistics.median(mixed) if mixed else None,
                "gpu_name": self.result.get("gpu_name"), "versions": self.result.get("versions")}


def read_plan(directory: Path) -> dict:
    """plan.json of an emitted folder, checked: a one-line error for anything else."""
    path = Path(directory) / PLAN_JSON
    if not path.is_file():
        raise FtplanError(f"{directory} has no {PLAN_JSON}: rehearse a folder written by `ftplan plan --emit`")
    edited = edited_run_files(Path(directory))
    if edited:  # checked before any GPU time: rehearse verifies what --emit wrote, unchanged
        raise FtplanError(f"{Path(directory) / edited[0]} is not as `ftplan plan --emit` wrote it (edited or "
                          "deleted since); rehearse runs the emitted folder unchanged: emit it into a new folder")
    try:
        numbers = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise FtplanError(f"cannot read {path}: {exc}") from None
    if not isinstance(numbers, dict) or numbers.get("written_by") != "ftplan plan --emit":
        raise FtplanError(f"{path} was not written by `ftplan plan --emit`")
    absent = [key for key in PLAN_KEYS if key not in numbers]
    if absent:
        raise FtplanError(f"{path} lacks {', '.join(absent)}: emit the folder again with this ftplan "
                          "(`ftplan plan ... --emit DIR --force`)")
    _check_plan_numbers(path, numbers)
    setting = _checked_setting(path, numbers["setting"])
    cached_architecture(setting.model)  # an edited model name fails here in one line, not in the run on the GPU
    if setting.world_size > 1:
        raise FtplanError(f"rehearse runs one GPU; this plan uses {setting.world_size} (rehearse it on its cluster "
                          "with your launcher)")
    return numbers


def _checked_setting(path: Path, fields: object) -> Setting:
    """The recipe plan.json names, or a one-line error: an edited one ([], null, a model of 5) raised TypeErrors."""
    try:
        if not isinstance(fields, dict) or not isinstance(fields.get("lora_targets", []), list):
            raise TypeError("not an object with a list of lora_targets")
        setting = Setting.from_dict(fields)
        if not isinstance(setting.model, str) or not all(isinstance(t, str) for t in setting.lora_targets):
            raise TypeError("model and lora_targets must be text")
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise FtplanError(f"{path}: setting is not a recipe ftplan wrote ({exc})") from None
    if setting.seq_len > MAX_TRIAL_SEQ_LEN:
        raise FtplanError(f"{path}: seq_len {setting.seq_len} is above {MAX_TRIAL_SEQ_LEN}, past every model's context")
    return setting


def _check_plan_numbers(path: Path, numbers: dict) -> None:
    """The numbers a rehearsal runs and judges by: a manifest re-hashed after an edit let micro-batch 0 or -5 and
    a NaN prediction through to a dry run that priced them ('about inf GPU-minutes')."""
    for key in ("micro_batch", "accumulation", "usable_bytes"):
        value = numbers[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FtplanError(f"{path}: {key} must be a positive whole number, got {value!r}")
    for key in ("micro_batch", "accumulation"):
        if numbers[key] > MAX_TRIAL_BATCH:
            raise FtplanError(f"{path}: {key} {numbers[key]} is above {MAX_TRIAL_BATCH}, more than any GPU runs")
    predicted = numbers["predicted"]
    for key in ("seconds_per_step", "peak_reserved_bytes"):
        value = predicted.get(key) if isinstance(predicted, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise FtplanError(f"{path}: predicted {key} must be a positive number, got {value!r}")


# A rehearsal's time outside its steps (process start, dataset, model build, first-shape warm-up): the median
# of the 14 H200 rehearsals in benchmarks/gpu/results/emitted_runs_h200.jsonl, and the one with ZeRO-2 offload
# (DeepSpeed's CPU Adam build and pinned buffers).
STARTUP_SECONDS = 25
OFFLOAD_STARTUP_SECONDS = 94


def rehearsal_seconds(numbers: dict, steps: int) -> float:
    """About how long one rehearsal takes on the GPU: start-up and model build, plus its steps."""
    offload = Setting.from_dict(numbers["setting"]).offload_optimizer
    return (OFFLOAD_STARTUP_SECONDS if offload else STARTUP_SECONDS) + steps * numbers["predicted"]["seconds_per_step"]


def run_once(directory: Path, steps: int, timeout: float, log: Path) -> dict:
    """One rehearsal process on the folder as it is now; its result (status ok, oom or error)."""
    with tempfile.TemporaryDirectory(prefix="ftplan-rehearse-") as tmp:
        result_path = Path(tmp) / "result.json"
        outcome = run_process([*REHEARSAL_COMMAND, "--dir", str(directory), "--steps", str(steps),
                               "--result", str(result_path)], result_path, log, timeout)
    return {**outcome.result, "status": outcome.status, "message": outcome.message}


def lowered(micro_batch: int, accumulation: int, reserved: int, usable: int) -> tuple[int, int]:
    """A smaller micro-batch, by the share of memory it went over (at least one less), and the accumulation
    that keeps the global batch at least what it was."""
    share = usable / reserved if reserved > usable else 1.0
    micro = max(1, min(micro_batch - 1, math.floor(micro_batch * share)))
    return micro, math.ceil(micro_batch * accumulation / micro)


def record_of(numbers: dict, rehearsal: Rehearsal, digest: str, seconds: float, emit_dir: str) -> dict:
    """The rehearsal as a calibration record, marked so that no fit takes it (store.records.is_rehearsal)."""
    setting = Setting.from_dict(numbers["setting"])
    result = rehearsal.result
    measured = {key: result.get(key) for key in ("peak_allocated_bytes", "peak_reserved_bytes", "num_alloc_retries",
                                                 "step_seconds", "heavy_steps", "gpu_name", "gpu_memory_total_bytes",
                                                 "versions", "alloc_conf") if result.get(key) is not None}
    return build_record(setting, rehearsal.micro_batch, rehearsal.status, message=rehearsal.message,
                        arch_hash=cached_architecture(setting.model).hash,  # the shape that ran, as plans check it
                        rehearsal=True, accumulation=rehearsal.accumulation, emit_digest=digest, emit_dir=emit_dir,
                        padded_length=numbers["length"], strategy=numbers["strategy"], device="cuda",
                        source="rehearse", trial_seconds=round(seconds, 3),
                        timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **measured)


def rehearse_folder(directory: Path, steps: int, timeout: float, lower: bool, log_dir: Path,
                    on_record: Callable[[dict], None], progress: Callable[[str], None],
                    grow: bool = True) -> BatchSearch:
    """Rehearse the folder's batch split, then the splits a BatchSearch asks for (lowered while unsafe, raised
    while a safe run left room), rewriting the folder before each; it ends at the largest split that ran safely,
    or at the last one tried (the search's answer). Each run's record goes to on_record as soon as it ended, so a
    kill loses none."""
    numbers = read_plan(directory)
    refuse_a_cpu_plan(directory, numbers)
    problem = cuda_problem()
    if problem:
        raise FtplanError(f"rehearse needs the {numbers.get('gpu', 'GPU')} the plan is for: {problem}")
    search = BatchSearch(numbers["usable_bytes"], lower, grow and can_grow(numbers))
    split: tuple[int, int] | None = (numbers["micro_batch"], numbers["accumulation"])
    while split is not None:
        micro, accumulation = split
        if (micro, accumulation) != (numbers["micro_batch"], numbers["accumulation"]):
            rewrite_rehearsed(directory, micro, accumulation, search.runs[-1].summary(),
                              f"TRYING micro-batch {micro} x accumulation {accumulation} after {search.runs[-1].verdict} "
                              f"at {search.runs[-1].micro_batch}.")
            numbers = read_plan(directory)
        progress(f"rehearsal {len(search.runs) + 1}: micro-batch {micro} x accumulation {accumulation}, {steps} steps")
        digest = hashlib.sha256((Path(directory) / TRAINING_ARGS_PY).read_bytes()).hexdigest()
        started = time.monotonic()
        result = run_once(Path(directory).resolve(), steps, timeout, log_dir / f"rehearsal-b{micro}.log")
        run = Rehearsal(micro, accumulation, result["status"], result["message"], result, numbers["usable_bytes"])
        on_record(record_of(numbers, run, digest, time.monotonic() - started, Path(directory).name))
        progress(f"  {run.verdict}; peak {run.reserved / GIB:.2f} GiB reserved")
        split = search.saw(run)
    final = search.answer
    rewrite_rehearsed(directory, final.micro_batch, final.accumulation, search.runs[-1].summary(),
                      final_note(final, search.runs, steps))
    return search


def refuse_a_cpu_plan(directory: Path, numbers: dict) -> None:
    """A CPU plan has no GPU to rehearse on (and its dry run would price GPU-minutes)."""
    if numbers.get("gpu") == CPU:
        raise FtplanError(f"{directory} is planned for this CPU, and rehearse verifies a GPU's plan on that GPU: "
                          "run your train.py from the folder for a few steps instead")


def can_grow(numbers: dict) -> bool:
    """A larger micro-batch may replace the planned one only where the plan chose the global batch itself (no
    --global-batch asked), accumulates nothing and ran the largest batch it found safe: then its aim is the largest
    safe micro-batch. Not where a smaller one was faster (dynamic padding on a long tail), nor with packing, whose
    attention grows with the square."""
    asked = numbers.get("global_batch_asked", "unknown")  # a folder emitted before the key: treated as asked
    return (numbers["accumulation"] == 1 and asked is None
            and numbers.get("largest_fitting") == numbers["micro_batch"] and numbers["strategy"] != "pack")


def final_note(final: Rehearsal, runs: list[Rehearsal], steps: int) -> str:
    """README.txt's line on where the rehearsals ended."""
    tried = ", ".join(f"{r.micro_batch} ({r.verdict.split(' (')[0]})" for r in runs)
    if not final.safe:
        return f"NOT VERIFIED: `ftplan rehearse` at micro-batch {final.micro_batch}: {final.verdict}. Tried: {tried}."
    return (f"VERIFIED by `ftplan rehearse`: micro-batch {final.micro_batch} x accumulation {final.accumulation} ran "
            f"{steps} steps on {final.result.get('gpu_name')}, the heaviest batches first, "
            f"{final.reserved / GIB:.2f} GiB reserved of {final.usable_bytes / GIB:.2f} usable. Tried: {tried}.")


class BatchSearch:
    """Which batch split to rehearse next, from the runs so far.

    An unsafe run lowers the micro-batch (by the share it went over, keeping the global batch), or, above a
    split that ran safely, bisects between the two. A safe run with room left raises it, when growing is
    allowed, to where the run's reserved memory, grown in proportion to the micro-batch, meets the budget: that
    over-counts the growth (the weights do not grow), so the next split is rarely over, and it is rehearsed
    before it is kept. On the H200 the planned batches were 67-90% of the largest safe one in eight folders of
    nine, and the search reached it in two or three runs (benchmarks/gpu/results/emitted_runs_grow_h200.jsonl).
    """

    def __init__(self, usable_bytes: int, lower: bool, grow: bool) -> None:
        self.usable_bytes, self.lower, self.grow = usable_bytes, lower, grow
        self.runs: list[Rehearsal] = []

    @property
    def answer(self) -> Rehearsal:
        """The largest split that ran safely, else the last run."""
        safe = [r for r in self.runs if r.safe]
        return max(safe, key=lambda r: r.micro_batch) if safe else self.runs[-1]

    def saw(self, run: Rehearsal) -> tuple[int, int] | None:
        """The next split to rehearse after this run, or None to stop."""
        self.runs.append(run)
        if run.status == "error" or len(self.runs) >= MAX_ATTEMPTS:
            return None
        safe = [r.micro_batch for r in self.runs if r.safe]
        unsafe = [r.micro_batch for r in self.runs if not r.safe]
        above = min((u for u in unsafe if not safe or u > max(safe)), default=None)
        if not run.safe:
            if safe:
                middle = (max(safe) + run.micro_batch) // 2
                return (middle, 1) if middle > max(safe) else None
            if not self.lower or run.micro_batch == 1:
                return None
            return lowered(run.micro_batch, run.accumulation, max(run.reserved, self.usable_bytes + 1),
                           self.usable_bytes)
        if not self.grow or run.micro_batch < max(safe):
            return None
        target = math.floor(run.micro_batch * self.usable_bytes / max(run.reserved, 1))
        if above is not None:
            target = min(target, above - 1)
        return (target, 1) if target > run.micro_batch else None

