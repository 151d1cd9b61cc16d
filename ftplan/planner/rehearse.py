"""`ftplan rehearse DIR`: run what `plan --emit DIR` wrote on the GPU, judge it against the card, and lower
the batch (keeping the global batch) until a rehearsal runs inside the plan's memory budget.

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
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.planner.emit import PLAN_JSON, TRAINING_ARGS_PY, rewrite_rehearsed
from ftplan.store.records import build_record

REHEARSAL_COMMAND = (sys.executable, "-m", "ftplan.calibration.rehearsal")
PLAN_KEYS = ("setting", "micro_batch", "accumulation", "strategy", "length", "limit", "too_long", "headline",
             "usable_bytes", "predicted", "rehearsals", "lengths")
DEFAULT_STEPS = 20  # enough for the heaviest batches and a random mix after them
MAX_ATTEMPTS = 4  # the first run and three lowered batches: a plan off by more needs a new calibration


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
    try:
        numbers = json.loads(path.read_text())
    except FileNotFoundError:
        raise FtplanError(f"{directory} has no {PLAN_JSON}: rehearse a folder written by `ftplan plan --emit`") from None
    except (OSError, ValueError) as exc:
        raise FtplanError(f"cannot read {path}: {exc}") from None
    if not isinstance(numbers, dict) or numbers.get("written_by") != "ftplan plan --emit":
        raise FtplanError(f"{path} was not written by `ftplan plan --emit`")
    absent = [key for key in PLAN_KEYS if key not in numbers]
    if absent:
        raise FtplanError(f"{path} lacks {', '.join(absent)}: emit the folder again with this ftplan "
                          "(`ftplan plan ... --emit DIR --force`)")
    setting = Setting.from_dict(numbers["setting"])
    if setting.world_size > 1:
        raise FtplanError(f"rehearse runs one GPU; this plan uses {setting.world_size} (rehearse it on its cluster "
                          "with your launcher)")
    if numbers["strategy"] == "pack":
        raise FtplanError("rehearsing packed batches needs TRL's SFTTrainer, which rehearse does not run yet")
    return numbers


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
                        rehearsal=True, accumulation=rehearsal.accumulation, emit_digest=digest, emit_dir=emit_dir,
                        padded_length=numbers["length"], strategy=numbers["strategy"], device="cuda",
                        source="rehearse", trial_seconds=round(seconds, 3),
                        timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **measured)


def rehearse_folder(directory: Path, steps: int, timeout: float, lower: bool, log_dir: Path,
                    on_record: Callable[[dict], None], progress: Callable[[str], None]) -> list[Rehearsal]:
    """Rehearse, and while a run is not safe and lowering is allowed, lower the batch, rewrite the folder and
    rehearse again. Each run's record goes to on_record as soon as it ended, so a kill loses none."""
    problem = cuda_problem()
    if problem:
        raise FtplanError(f"rehearse needs the GPU the plan is for: {problem}")
    numbers = read_plan(directory)
    runs: list[Rehearsal] = []
    micro, accumulation = numbers["micro_batch"], numbers["accumulation"]
    for attempt in range(MAX_ATTEMPTS):
        progress(f"rehearsal {attempt + 1}: micro-batch {micro} x accumulation {accumulation}, {steps} steps")
        digest = hashlib.sha256((Path(directory) / TRAINING_ARGS_PY).read_bytes()).hexdigest()
        started = time.monotonic()
        result = run_once(Path(directory).resolve(), steps, timeout, log_dir / f"rehearsal-b{micro}.log")
        run = Rehearsal(micro, accumulation, result["status"], result["message"], result, numbers["usable_bytes"])
        runs.append(run)
        on_record(record_of(numbers, run, digest, time.monotonic() - started, Path(directory).name))
        progress(f"  {run.verdict}; peak {run.reserved / GIB:.2f} GiB reserved")
        if run.safe or not lower or micro == 1 or run.status == "error":
            note = (f"VERIFIED by `ftplan rehearse`: micro-batch {micro} ran {steps} steps on {result.get('gpu_name')}, "
                    f"the heaviest batches first, {run.reserved / GIB:.2f} GiB reserved of "
                    f"{numbers['usable_bytes'] / GIB:.2f} usable." if run.safe else
                    f"NOT VERIFIED: `ftplan rehearse` at micro-batch {micro}: {run.verdict}.")
            rewrite_rehearsed(directory, micro, accumulation, run.summary(), note)
            return runs
        new_micro, new_accumulation = lowered(micro, accumulation, max(run.reserved, numbers["usable_bytes"] + 1),
                                              numbers["usable_bytes"])
        rewrite_rehearsed(directory, new_micro, new_accumulation, run.summary(),
                          f"LOWERED by `ftplan rehearse`: micro-batch {micro} {run.verdict}; now {new_micro} x "
                          f"accumulation {new_accumulation}.")
        micro, accumulation = new_micro, new_accumulation
        numbers = read_plan(directory)
    return runs
