"""Calibrate many settings: walk each one's batch-size ladder, one trial at a time, resumably.

Every finished trial is appended (locked, fsynced) before the next one starts, and trials already
in the output file are never re-run, so killing a calibration loses at most the trial in flight.
One trial's crash or OOM only ends that setting's ladder step; the other settings go on.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ftplan.calibration.ladder import LadderStep, next_step, remaining_estimate
from ftplan.calibration.verify import next_verify_batch
from ftplan.calibration.launcher import TrialOutcome, TrialSpec, run_trial
from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.store.records import (
    RecordWarning,
    append_record,
    build_record,
    iter_records,
    summarise_per_gpu,
)
from ftplan.core.settings import Setting


@dataclass(frozen=True)
class CalibrationPlan:
    """Everything a calibration run needs besides the settings themselves."""

    out: Path
    device: str = "cuda"
    steps: int = 4
    warmup_steps: int = 2
    timeout: float = 900.0
    max_batch: int = 1024
    batch_sizes: tuple[int, ...] | None = None
    machine_id: str = ""
    command: str = ""
    log_dir: Path | None = None
    trial_command: tuple[str, ...] | None = None  # None: the real trial, launcher.REAL_TRIAL_COMMAND
    verify: bool = False  # after the listed batches, run the batch the planner would recommend (calibration/verify.py)


class CalibrationProgress:
    """What the runner tells its caller; this base ignores it, the CLI draws it with rich."""

    def trial_started(self, index: int, total: int, setting: Setting, batch: int) -> None:
        pass

    def trial_finished(self, record: dict) -> None:
        pass

    def setting_finished(self, setting: Setting, step: LadderStep) -> None:
        pass


def known_outcomes(path: Path, machine_id: str, device: str) -> dict[tuple[str, str], dict[int, str]]:
    """(setting_key, arch_hash) -> {batch: ok|oom} measured earlier by a calibration of this machine and device.

    Errors are left out, so they are retried; records of another machine, device or version of the
    architecture (same setting key, different config) never count as done here.
    """
    outcomes: dict[tuple[str, str], dict[int, str]] = {}
    if Path(path).exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecordWarning)
            for r in iter_records(path):
                if (r["status"] in ("ok", "oom") and r.get("source") == "calibrate"
                        and r.get("machine_id") == machine_id and r.get("device") == device):
                    outcomes.setdefault((r["setting_key"], r.get("arch_hash")), {})[r["micro_batch"]] = r["status"]
    return outcomes


def pinned_machine_id(path: Path) -> str | None:
    """The machine id the records in path were taken under, when they name exactly one.

    Reused when --machine is not given, so a new host name (a restarted container) keeps the resume
    key instead of re-running every trial; a file shared by several machines pins none.
    """
    if not Path(path).is_file():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordWarning)
        ids = {r.get("machine_id") for r in iter_records(path) if r.get("source") in ("calibrate", "trainer_callback")}
    ids.discard(None)
    return ids.pop() if len(ids) == 1 else None


def calibrate(settings: Sequence[Setting], plan: CalibrationPlan, progress: CalibrationProgress | None = None) -> list[dict]:
    """Run every setting's remaining trials; return the records written by this run."""
    progress = progress or CalibrationProgress()
    remove_stale_claims(plan)
    outcomes = known_outcomes(plan.out, plan.machine_id, plan.device)
    hashes = [load_architecture(s.model).hash for s in settings]
    per_setting = [outcomes.setdefault((s.key(), h), {}) for s, h in zip(settings, hashes)]
    written: list[dict] = []
    for setting, arch_hash, done in zip(settings, hashes, per_setting):
        while (step := next_step(done, plan.max_batch, plan.batch_sizes)).batch is not None:
            total = len(written) + sum(remaining_estimate(d, plan.max_batch, plan.batch_sizes) for d in per_setting)
            written.append(_run_and_record(setting, arch_hash, step.batch, plan, done, progress, len(written) + 1, total))
        if plan.verify and step.reason.startswith("done"):
            verify_trials = 0
            while (batch := _next_verify(setting, plan, done, verify_trials)) is not None:
                written.append(_run_and_record(setting, arch_hash, batch, plan, done, progress, len(written) + 1,
                                               len(written) + 1))
                verify_trials += 1
            step = LadderStep(None, f"{step.reason}; verified {verify_trials} planned batch(es)" if verify_trials
                              else f"{step.reason}; nothing to verify")
        progress.setting_finished(setting, step)
    _release_claims()  # the last trial's record is in
    return written


def _run_and_record(setting: Setting, arch_hash: str, batch: int, plan: CalibrationPlan, done: dict[int, str],
                    progress: CalibrationProgress, index: int, total: int) -> dict:
    progress.trial_started(index, total, setting, batch)
    record = counted_as_wall(_run_one(setting, arch_hash, batch, plan), done)
    append_record(plan.out, record)
    done[batch] = record["status"]
    progress.trial_finished(record)
    return record


def _next_verify(setting: Setting, plan: CalibrationPlan, done: dict[int, str], trials_done: int) -> int | None:
    """The batch the planner would recommend from this setting's records so far, when it still needs a trial
    (ftplan.calibration.verify); None without a card capacity (CPU) or enough points to fit."""
    from ftplan.models.fit import fit_setting
    from ftplan.models.safe_batch import MemoryBudget, fit_largest_safe_batch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordWarning)
        records = [r for r in iter_records(plan.out) if r.get("setting_key") == setting.key()
                   and r.get("machine_id") == plan.machine_id and r.get("device") == plan.device
                   and r["status"] in ("ok", "oom")]
    capacity = max((r.get("gpu_memory_total_bytes") or 0 for r in records), default=0)
    if not capacity or plan.device == "cpu":
        return None
    try:
        fit = fit_setting(records)
    except FtplanError:
        return None
    budget = MemoryBudget(capacity)
    planned = fit_largest_safe_batch(fit, setting.seq_len, budget)
    return next_verify_batch(done, planned, lambda b: fit.peak_reserved(b, setting.seq_len).mean <= budget.usable_bytes,
                             trials_done)


# NCCL's own device allocations (communicator, channel buffers) fail before PyTorch's at the memory
# wall and surface as an NCCL error, not a CUDA OOM: a ZeRO-2 offload ladder on the H200 stopped on
# "NCCL error ... unhandled cuda error" at a batch between the largest that fitted and the first OOM.
NCCL_WALL_MARKERS = ("unhandled cuda error", "NCCL WARN Cuda failure 'out of memory'", "ncclUnhandledCudaError")


def counted_as_wall(record: dict, outcomes: dict[int, str]) -> dict:
    """An NCCL CUDA failure above a batch that ran is the memory wall: recorded as an OOM, so the ladder
    bisects on and fits stay below it. At the first batch it is a set-up failure and stays an error."""
    ran_smaller = any(status == "ok" and batch < record["micro_batch"] for batch, status in outcomes.items())
    message = record.get("message") or ""
    if record["status"] == "error" and ran_smaller and "NCCL" in message and any(m in message for m in NCCL_WALL_MARKERS):
        return {**record, "status": "oom",
                "message": f"{message} [counted as out of memory: NCCL's device allocations fail first at the memory wall]"[:1000]}
    return record


MIN_FREE_BYTES = 64 * 2**20  # a trial's spec, results and rank logs (DeepSpeed's reach megabytes), and its record


def check_free_space(plan: CalibrationPlan) -> None:
    """Refuse to start a trial where its files cannot be written: a full disk was found only when the record
    was appended, after the trial had spent its minutes on the GPU."""
    folders = [Path(plan.out).parent, Path(tempfile.gettempdir()), *([Path(plan.log_dir)] if plan.log_dir else [])]
    for folder in folders:
        folder = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
        free = shutil.disk_usage(folder).free
        if free < MIN_FREE_BYTES:
            raise FtplanError(f"only {free:,} bytes free at {folder}; a calibration trial needs {MIN_FREE_BYTES:,} "
                              "for its logs and record: free space and run again to resume")


def _run_one(setting: Setting, arch_hash: str, batch: int, plan: CalibrationPlan) -> dict:
    measured_elsewhere = claim_trial(plan, setting, arch_hash, batch)
    if measured_elsewhere is not None:
        return measured_elsewhere
    check_free_space(plan)
    spec = TrialSpec(setting, batch, plan.device, plan.steps, plan.warmup_steps)
    started = time.time()
    outcome = run_trial(spec, plan.timeout, plan.trial_command, plan.log_dir)
    return build_record(setting, batch, outcome.status, message=outcome.message,
                        timestamp=dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
                        source="calibrate", machine_id=plan.machine_id, device=plan.device,
                        arch_hash=arch_hash, command=plan.command,
                        trial_seconds=round(outcome.seconds, 3), **measurements(outcome, setting, batch))


CLAIM_POLL_SECONDS = 0.2
_held_claims: list[tuple[int, Path]] = []  # the claim of the trial this process ran last, held until its record is in


def claim_trial(plan: CalibrationPlan, setting: Setting, arch_hash: str, batch: int) -> dict | None:
    """Claim one trial across processes before it runs; None when claimed here, else the record another wrote.

    Two calibrations of one output file used to run every shared trial twice, contending for the
    device. The claim is an exclusive lock on a sidecar file, held from before the trial until this
    process claims its next one or ends (its record is appended by then), and the file is removed then;
    the kernel drops the lock when the process dies. While another process holds it, this one waits for
    that trial's record; a lock that comes free without one means that process died, and the trial is
    run here.
    """
    _release_claims()
    path = _claim_path(plan, setting, arch_hash, batch)
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder was removed as it emptied: make it again
            continue
        except OSError:  # nowhere to put claims (a read-only folder beside a writable file): run unclaimed
            return None
        locked = _try_lock(fd)
        if locked and not _is_current(fd, path):  # its last holder removed it after this process opened it
            os.close(fd)
            continue
        measured = _measured(plan, setting, arch_hash, batch)
        if locked and measured is None:
            _held_claims.append((fd, path))
            return None
        if locked:
            _remove_claim(path)
        os.close(fd)
        if measured is not None:
            return measured
        time.sleep(CLAIM_POLL_SECONDS)


def _release_claims() -> None:
    while _held_claims:
        fd, path = _held_claims.pop()
        _remove_claim(path)
        os.close(fd)


def remove_stale_claims(plan: CalibrationPlan) -> None:
    """Remove the claim files a killed calibration left (no process holds their lock), and the folder once empty."""
    folder = _claims_folder(plan)
    for path in folder.glob("*.lock") if folder.is_dir() else ():
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        if _try_lock(fd) and _is_current(fd, path):
            _remove_claim(path)
        os.close(fd)


def _remove_claim(path: Path) -> None:
    """Remove a claim file; called holding its lock, so whoever opened it meanwhile sees it is no longer current."""
    try:
        os.unlink(path)
        os.rmdir(path.parent)
    except OSError:  # already gone, or other claims are in the folder
        pass


def _is_current(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


def _claims_folder(plan: CalibrationPlan) -> Path:
    out = Path(plan.out)
    return out.with_name(f"{out.name}.claims")


def _claim_path(plan: CalibrationPlan, setting: Setting, arch_hash: str, batch: int) -> Path:
    trial = json.dumps([plan.machine_id, plan.device, setting.key(), arch_hash, batch])
    return _claims_folder(plan) / f"{hashlib.sha256(trial.encode()).hexdigest()[:24]}.lock"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _measured(plan: CalibrationPlan, setting: Setting, arch_hash: str, batch: int) -> dict | None:
    """This trial's ok/oom record in the output file, as it was written (errors are retried, as on resume)."""
    if not Path(plan.out).is_file():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordWarning)
        for r in iter_records(plan.out):
            if (r["status"] in ("ok", "oom") and r.get("source") == "calibrate" and r["micro_batch"] == batch
                    and r["setting_key"] == setting.key() and r.get("arch_hash") == arch_hash
                    and r.get("machine_id") == plan.machine_id and r.get("device") == plan.device):
                return {k: v for k, v in r.items() if k != "_source"}
    return None


def measurements(outcome: TrialOutcome, setting: Setting, batch: int) -> dict:
    """Combine the ranks' results into the record's measured fields.

    Step times: data-parallel ranks wait for each other every step, so a step lasts as long as its
    slowest rank; step_seconds holds that per-step maximum and seconds_per_step its median. Memory:
    per-GPU lists plus min/mean/max, because the fullest GPU decides an OOM.
    """
    results = [r.result for r in outcome.ranks]
    first = results[0] if results else {}
    step_seconds = [max(steps) for steps in zip(*(r.get("step_seconds") or [] for r in results))]
    seconds_per_step = statistics.median(step_seconds) if step_seconds else None
    tokens = batch * setting.seq_len * setting.world_size
    return {
        **_per_gpu("peak_allocated_bytes", results),
        **_per_gpu("peak_reserved_bytes", results),
        "num_alloc_retries": max((r["num_alloc_retries"] for r in results if "num_alloc_retries" in r), default=None),
        "step_seconds": step_seconds,
        "steps_measured": len(step_seconds),
        "seconds_per_step": seconds_per_step,
        "tokens_per_second": tokens / seconds_per_step if seconds_per_step else None,
        "gpu_count": setting.world_size,
        **{key: first.get(key) for key in ("gpu_name", "gpu_memory_total_bytes", "params_total", "params_trainable", "versions")},
    }


def _per_gpu(name: str, results: list[dict]) -> dict:
    """All ranks' values, or none: a list with a gap would no longer say which GPU held what."""
    values = [r[name] for r in results if isinstance(r.get(name), int)]
    return summarise_per_gpu(name, values if len(values) == len(results) else [])
