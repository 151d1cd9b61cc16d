"""The calibration record contract and its append-only JSONL storage.

Why this shape: a calibration can run for an hour on rented GPUs, so every finished trial is
written at once (one write of a whole line, under an exclusive lock, then fsync), and readers
survive torn or corrupt lines and records from newer versions, naming file and line.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import statistics
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error")
REQUIRED_KEYS = ("schema_version", "model", "micro_batch", "status", "setting_key")
# Records of other kinds share the files (a "kind" field; trials have none) and are skipped by trial readers.
REQUIRED_KEYS_BY_KIND = {"trial": REQUIRED_KEYS,
                         "network": ("schema_version", "kind", "backend", "ranks", "latency_s", "bandwidth_gbs")}
_MEASURED_NUMBERS = ("peak_allocated_bytes", "peak_reserved_bytes", "seconds_per_step", "num_alloc_retries",
                     "gpu_memory_total_bytes", "params_total", "params_trainable", "tokens_per_second")
# Types of the trial fields readers compute with (None is allowed where a failed trial measured nothing).
_TRIAL_FIELD_TYPES = {
    **{key: "an integer" for key in ("micro_batch", "seq_len", "zero_stage", "lora_rank", "gpus", "nodes")},
    **{key: "true or false" for key in ("offload_optimizer", "liger", "gradient_checkpointing")},
    **{key: "text" for key in ("model", "setting_key", "precision", "optimizer", "alloc_conf", "gpu_name")},
    **{key: "a number" for key in _MEASURED_NUMBERS},
    "lora_targets": "a list of strings",
    "step_seconds": "a list of numbers",
}
_MAY_BE_NULL = (*_MEASURED_NUMBERS, "gpu_name", "step_seconds")


class RecordWarning(UserWarning):
    """A record that was skipped while reading; the message names file and line."""


def summarise_per_gpu(name: str, per_gpu: list[int]) -> dict:
    """The per-GPU list plus min/mean/max; the max is the one that decides an OOM."""
    if not per_gpu:
        return {f"{name}_per_gpu": [], name: None, f"{name}_min": None, f"{name}_mean": None}
    return {
        f"{name}_per_gpu": list(per_gpu),
        name: max(per_gpu),
        f"{name}_min": min(per_gpu),
        f"{name}_mean": statistics.fmean(per_gpu),
    }


def build_record(setting: Setting, micro_batch: int, status: str, **measured) -> dict:
    """A record in the contract: setting fields flattened in, plus what the trial measured."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    return {"schema_version": SCHEMA_VERSION, **setting.to_dict(), "setting_key": setting.key(),
            "micro_batch": micro_batch, "status": status, **measured}


def append_record(path: Path, record: dict) -> None:
    """Durably append one record; safe against concurrent writers and a kill mid-write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":  # a writer was killed mid-line: keep its fragment on its own line
            line = b"\n" + line
        _write_all_or_nothing(fd, line, size, path)
    finally:
        os.close(fd)


def _write_all_or_nothing(fd: int, data: bytes, size: int, path: Path) -> None:
    """Write and fsync the whole line, or cut the file back to size and raise.

    A full disk shows up as a short write or as ENOSPC (sometimes only at fsync); ignoring either
    left a torn record reported as saved, and the next append glued its line onto the fragment.
    """
    try:
        while data:
            written = os.write(fd, data)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = data[written:]
        os.fsync(fd)
    except OSError as exc:
        os.ftruncate(fd, size)
        raise FtplanError(f"cannot append a record to {path}: {exc.strerror or exc}; "
                          "the file is left as it was, free space and run again to resume") from None


def iter_records(path: Path, kind: str = "trial") -> Iterator[dict]:
    """Valid records of one kind in one file; bad lines are skipped with a RecordWarning naming file:line."""
    if kind not in REQUIRED_KEYS_BY_KIND:
        raise ValueError(f"record kind must be one of {tuple(REQUIRED_KEYS_BY_KIND)}, got {kind!r}")
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FtplanError(f"cannot read calibration file {path}: {exc.strerror}") from None
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):  # a torn write, or not text at all
            warnings.warn(f"{path}:{number}: corrupt or truncated record skipped", RecordWarning, stacklevel=2)
            continue
        if isinstance(record, dict) and record.get("kind", "trial") != kind:
            continue
        problem = _problem(record)
        if problem:
            warnings.warn(f"{path}:{number}: {problem}; record skipped", RecordWarning, stacklevel=2)
            continue
        record["_source"] = f"{path}:{number}"
        yield record


def _problem(record: object) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    kind = record.get("kind", "trial")
    missing = [k for k in REQUIRED_KEYS_BY_KIND[kind] if k not in record]
    if missing:
        return f"missing {', '.join(missing)}"
    version = record["schema_version"]
    if not _is_a(version, "an integer") or version < 1:
        return f"schema version {version!r} is not a positive integer"
    if version > SCHEMA_VERSION:
        return f"schema version {version} is newer than this ftplan understands ({SCHEMA_VERSION}); upgrade ftplan"
    if kind == "trial":
        return _trial_problem(record)
    return None


def _trial_problem(record: dict) -> str | None:
    """Wrong types or impossible values, which would otherwise crash the fits far from their line."""
    if record["status"] not in STATUSES:
        return f"unknown status {record['status']!r}"
    for key, wanted in _TRIAL_FIELD_TYPES.items():
        value = record.get(key)
        if key in record and not (value is None and key in _MAY_BE_NULL) and not _is_a(value, wanted):
            return f"{key} is {value!r}, not {wanted}"
    if record["micro_batch"] < 1:
        return f"micro_batch must be positive, got {record['micro_batch']}"
    negative = [key for key in _MEASURED_NUMBERS if (record.get(key) or 0) < 0]
    if negative:
        return f"negative {', '.join(negative)}"
    try:
        Setting.from_dict(record)
    except FtplanError as exc:
        return str(exc)
    return None


def _is_a(value: object, wanted: str) -> bool:
    if wanted == "an integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted == "a number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if wanted == "true or false":
        return isinstance(value, bool)
    if wanted == "a list of strings":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if wanted == "a list of numbers":
        return isinstance(value, list) and all(_is_a(item, "a number") for item in value)
    return isinstance(value, str)


def read_records(paths: Iterable[Path], kind: str = "trial") -> list[dict]:
    """All valid records of one kind in several files (a folder means every *.jsonl in it)."""
    records: list[dict] = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            records.extend(read_records(sorted(path.glob("*.jsonl")), kind))
        elif not path.exists():
            raise FtplanError(f"calibration file {path} does not exist")
        else:
            records.extend(iter_records(path, kind))
    return records
