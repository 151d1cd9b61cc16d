"""The calibration record contract and its append-only JSONL storage.

Why this shape: a calibration can run for an hour on rented GPUs, so every finished trial is
written at once (one write of a whole line, under an exclusive lock, then fsync), and readers
survive torn or corrupt lines and records from newer versions, naming file and line.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import math
import os
import stat
import statistics
import sys
import unicodedata
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import CPU
from ftplan.core.settings import Setting
from ftplan.models.communication.links import MAX_BANDWIDTH_GBS, MIN_BANDWIDTH_GBS

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error")
REQUIRED_KEYS = ("schema_version", "model", "micro_batch", "status", "setting_key")
# Records of other kinds share the files (a "kind" field; trials have none) and are skipped by trial readers.
REQUIRED_KEYS_BY_KIND = {"trial": REQUIRED_KEYS,
                         "network": ("schema_version", "kind", "backend", "ranks", "latency_s", "bandwidth_gbs")}
_MEASURED_NUMBERS = ("peak_allocated_bytes", "peak_reserved_bytes", "seconds_per_step", "num_alloc_retries",
                     "gpu_memory_total_bytes", "params_total", "params_trainable", "tokens_per_second")
# Where and how a record was taken: keys of duplicate detection, resume and the prior (a dict there crashed them).
_IDENTITY_FIELDS = ("machine_id", "device", "arch_hash", "source")
# Types of the trial fields readers compute with (None is allowed where a failed trial measured nothing).
_TRIAL_FIELD_TYPES = {
    **{key: "an integer" for key in ("micro_batch", "seq_len", "zero_stage", "lora_rank", "gpus", "nodes",
                                     "pad_to_multiple_of")},
    **{key: "true or false" for key in ("offload_optimizer", "liger", "gradient_checkpointing")},
    **{key: "text" for key in ("model", "setting_key", "precision", "optimizer", "alloc_conf", "gpu_name",
                               "attention", "padding", "quantization")},
    **{key: "a number" for key in _MEASURED_NUMBERS},
    "lora_targets": "a list of strings",
    "step_seconds": "a list of numbers",
    **{key: "text" for key in _IDENTITY_FIELDS},
    "trial_seconds": "a number",  # plans price a calibration's GPU time from it
    **{key: "an integer" for key in ("steps_measured", "gradient_accumulation_steps")},
}
_MAY_BE_NULL = (*_MEASURED_NUMBERS, "gpu_name", "step_seconds", *_IDENTITY_FIELDS, "trial_seconds", "steps_measured",
                "gradient_accumulation_steps")
_RAN_POSITIVE = ("seconds_per_step", "peak_allocated_bytes", "peak_reserved_bytes")  # above 0 in an ok record
# Upper limits no real trial comes near (1 PiB of memory on one device, a million samples per batch);
# above them a value is a typo or an attack, and taken into a fit it shows as nonsense such as -129.5 GiB.
_LARGEST = {"micro_batch": 2**20, "seq_len": 2**24, "gpus": 2**16, "nodes": 2**12, "lora_rank": 2**16,
            "peak_allocated_bytes": 2**50, "peak_reserved_bytes": 2**50,
            "gpu_memory_total_bytes": 2**50, "params_total": 10**15, "params_trainable": 10**15,
            "num_alloc_retries": 10**12, "seconds_per_step": 10**6, "tokens_per_second": 10**12,
            "trial_seconds": 10**7, "steps_measured": 10**9, "gradient_accumulation_steps": 2**20}
_NETWORK_FIELD_TYPES = {"backend": "text", "ranks": "an integer", "nodes": "an integer",
                        "latency_s": "a number", "bandwidth_gbs": "a number", "timestamp": "text"}
MAX_LATENCY_S = 1.0  # a hop of a second is no network's; at 1e300 a plan's ETA printed 300 digits
# A trial's error message is its last lines (runner and trial keep about 1,000 characters); printed whole, a longer
# one costs rich's highlighter seconds per kB.
MAX_MESSAGE_CHARS = 2000
MAX_LINE_BYTES = 2**20  # a record is a few kB; longer lines are junk and are read past, never held whole
WARNINGS_PER_FILE = 20  # bad lines named one by one; the rest of a file's are counted in one line
_INVISIBLE_CATEGORIES = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


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


def same_device_kind(record: dict, gpu_name: str) -> bool:
    """Whether the record ran on the kind of device a plan is for: a CPU's step times and trial start-ups say
    nothing of a GPU's, nor the reverse."""
    return (record.get("device") == CPU) == (gpu_name == CPU)


def is_rehearsal(record: dict) -> bool:
    """A run of an emitted folder (`ftplan rehearse`): it verifies that folder's batch and enters no fit,
    because its batches are the user's data, not a controlled ladder of one setting."""
    return record.get("rehearsal") is True


def append_record(path: Path, record: dict) -> None:
    """Durably append one record; safe against concurrent writers and a kill mid-write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = open_store(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _holds_line(fd, line):  # this very record (timestamp and all) is in already: appending is idempotent
            return
        size = os.fstat(fd).st_size
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":  # a writer was killed mid-line: keep its fragment on its own line
            line = b"\n" + line
        _write_all_or_nothing(fd, line, size, path)
    finally:
        os.close(fd)


def open_store(path: Path) -> int:
    """A descriptor for appending to a calibration file, created if missing; refused, in one line, when
    the path is a symlink (as root it could point into any file), not a regular file, or a file holding
    something other than records (a user's dataset once got a record as its line 51)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        why = "it is a symlink; ftplan does not write through one" if exc.errno == errno.ELOOP else exc.strerror
        raise FtplanError(f"cannot write calibration file {printable(str(path))}: {why}") from None
    problem = None if stat.S_ISREG(os.fstat(fd).st_mode) else "not a regular file"
    if problem is None:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a writer holds LOCK_EX mid-line: its first line, read half-written, is no record
        if not _holds_records(fd):
            problem = "it holds no ftplan record; give a new file or one ftplan wrote"
        fcntl.flock(fd, fcntl.LOCK_UN)
    if problem:
        os.close(fd)
        raise FtplanError(f"cannot write calibration file {printable(str(path))}: {problem}")
    return fd


def holds_records(path: Path) -> bool:
    """Whether a regular file holds ftplan records among its first lines: measurements no output may replace."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        status = os.fstat(fd)
        return stat.S_ISREG(status.st_mode) and status.st_size > 0 and _holds_records(fd)
    finally:
        os.close(fd)


def _holds_records(fd: int, lines: int = 5) -> bool:
    """Whether a file is empty or one of its first non-blank lines is a record of any kind (it has a schema
    version): a record torn by a kill may come first, a user's dataset never has one."""
    with open(os.dup(fd), "rb") as stream:  # a dup shares the file offset: start at 0, and leave it there
        stream.seek(0)
        try:
            first = list(itertools.islice((line for _n, line in _bounded_lines(stream) if line is None or line.strip()),
                                          lines))
        finally:
            stream.seek(0)
    return not first or any(_is_record_line(line) for line in first)


def _text(line: bytes) -> str:
    """A line as JSON text: UTF-8 (RFC 8259), a byte-order mark an editor saved dropped, the line break cut off
    first so that a write torn inside a character reads as cut short."""
    return line.rstrip(b"\r\n").decode("utf-8-sig")


def _is_record_line(line: bytes | None) -> bool:
    try:
        record = json.loads(_text(line)) if line is not None else None
    except (ValueError, RecursionError):
        return False
    return isinstance(record, dict) and "schema_version" in record


def _holds_line(fd: int, line: bytes) -> bool:
    """Whether the file already has this exact line: a calibration that waited on another's claim of a
    trial hands back the record that one wrote, and it must not land twice."""
    with open(os.dup(fd), "rb") as stream:
        stream.seek(0)
        return any(found == line for _number, found in _bounded_lines(stream))


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
    """Valid records of one kind in one file; bad lines are skipped with a RecordWarning naming file:line.

    The file is read a bounded line at a time, and only the first WARNINGS_PER_FILE bad lines are
    named: a junk or endless file once took 24 GB of memory and printed two million warnings.
    """
    if kind not in REQUIRED_KEYS_BY_KIND:
        raise ValueError(f"record kind must be one of {tuple(REQUIRED_KEYS_BY_KIND)}, got {kind!r}")
    path = Path(path)
    shown = printable(str(path))
    skipped = 0
    with _open_records_file(path) as stream:
        for number, line in _bounded_lines(stream):
            record, problem = _parse(line, kind)
            if problem:
                skipped += 1
                if skipped <= WARNINGS_PER_FILE:
                    warnings.warn(f"{shown}:{number}: {printable(problem)}", RecordWarning, stacklevel=2)
                continue
            if record is not None:
                record["_source"] = f"{shown}:{number}"
                yield record
    if skipped > WARNINGS_PER_FILE:
        warnings.warn(f"{shown}: ... and {skipped - WARNINGS_PER_FILE} more bad lines skipped", RecordWarning, stacklevel=2)


def _open_records_file(path: Path) -> BinaryIO:
    """A regular file (or a pipe) opened for reading; a device such as /dev/zero never ends, so it is refused."""
    try:  # a FIFO opened without O_NONBLOCK waits for a writer forever; once open, one without a writer reads as empty
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)
        stream = os.fdopen(fd, "rb")
    except OSError as exc:
        raise FtplanError(f"cannot read calibration file {printable(str(path))}: {exc.strerror}") from None
    mode = os.fstat(stream.fileno()).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        stream.close()
        raise FtplanError(f"calibration file {printable(str(path))} is not a regular file")
    return stream


def _bounded_lines(stream: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line) pairs; a line over MAX_LINE_BYTES comes as None, read past in bounded pieces.

    A regular file is read up to its size when this starts: a line a writer appends meanwhile is then
    either whole or left out, never read in two halves that would count as two torn records.
    """
    status = os.fstat(stream.fileno())
    left = status.st_size if stat.S_ISREG(status.st_mode) else sys.maxsize
    number = 0
    while left > 0 and (line := stream.readline(min(MAX_LINE_BYTES + 1, left))):
        left -= len(line)
        number += 1
        if len(line) <= MAX_LINE_BYTES:
            yield number, line
            continue
        while line and not line.endswith(b"\n") and left > 0:
            line = stream.readline(min(MAX_LINE_BYTES, left))
            left -= len(line)
        yield number, None


def _parse(line: bytes | None, kind: str) -> tuple[dict | None, str | None]:
    """(record, None) for a valid record of this kind, (None, warning) for a bad line, (None, None) for others.
    A line that is no record of any kind (torn, not JSON) is the trial reader's to name: every file is read for
    trials first, and named by both readers it read as two bad lines."""
    if line is not None and not line.strip():
        return None, None
    record, unreadable = _decoded(line)
    if unreadable:
        return None, unreadable if kind == "trial" else None
    if isinstance(record, dict) and record.get("kind", "trial") != kind:
        return None, None
    problem = _problem(record)
    if problem:
        return None, f"{problem}; record skipped"
    if isinstance(record.get("message"), str) and len(record["message"]) > MAX_MESSAGE_CHARS:
        record["message"] = record["message"][:MAX_MESSAGE_CHARS] + " [...]"  # a hand-made 100 kB one hung plan
    return record, None


def printable(text: str) -> str:
    """text with control, bidi and other invisible characters escaped (\\x00, \\u202e).

    Everything echoed from a file goes through here: a NUL or a right-to-left override in a
    record would otherwise reach the user's terminal raw and can make a warning read backwards.
    """
    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) in _INVISIBLE_CATEGORIES else ch for ch in text)


def _decoded(line: bytes | None) -> tuple[object, str | None]:
    """(the line's JSON value, None), or (None, why it is no record at all)."""
    if line is None:
        return None, f"line longer than {MAX_LINE_BYTES // 2**20} MiB; record skipped"
    try:
        return json.loads(_text(line)), None
    except RecursionError:
        return None, "JSON nested too deeply; record skipped"
    except UnicodeDecodeError as exc:  # a file an editor saved as latin-1 is whole, but not in the UTF-8 JSON needs
        if exc.reason == "unexpected end of data":  # a write torn inside a character
            return None, "corrupt or truncated record skipped"
        return None, "not UTF-8 text (save the file as UTF-8); record skipped"
    except ValueError:  # a torn write, not text at all, or a number too long to convert
        return None, "corrupt or truncated record skipped"


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
    return _trial_problem(record) if kind == "trial" else _network_problem(record)


def _network_problem(record: dict) -> str | None:
    """A link measurement every plan reads, even on one GPU: a bad one must not reach the arithmetic."""
    mistyped = _mistyped(record, _NETWORK_FIELD_TYPES, ())  # a null timestamp sorted beside text: a TypeError
    if mistyped:
        return mistyped
    if record["ranks"] < 1 or record.get("nodes", 1) < 1:
        return f"ranks and nodes must be positive, got ranks={record['ranks']} nodes={record.get('nodes', 1)}"
    if not MIN_BANDWIDTH_GBS <= record["bandwidth_gbs"] <= MAX_BANDWIDTH_GBS:  # the limits --*-bandwidth takes
        return (f"bandwidth_gbs must be between {MIN_BANDWIDTH_GBS:g} and {MAX_BANDWIDTH_GBS:g}, "
                f"got {record['bandwidth_gbs']!r}")
    if not 0 <= record["latency_s"] <= MAX_LATENCY_S:
        return f"latency_s must be between 0 and {MAX_LATENCY_S:g} s, got {record['latency_s']!r}"
    return None


def _trial_problem(record: dict) -> str | None:
    """Wrong types or impossible values, which would otherwise crash the fits far from their line."""
    if record["status"] not in STATUSES:
        return f"unknown status {record['status']!r}"
    mistyped = _mistyped(record, _TRIAL_FIELD_TYPES, _MAY_BE_NULL)
    if mistyped:
        return mistyped
    if record["micro_batch"] < 1:
        return f"micro_batch must be positive, got {record['micro_batch']}"
    negative = [key for key in _MEASURED_NUMBERS if (record.get(key) or 0) < 0]
    if any(seconds < 0 for seconds in record.get("step_seconds") or []):
        negative.append("step_seconds")
    if negative:
        return f"negative {', '.join(negative)}"
    if record["status"] == "ok":  # a trial that ran took time and held memory; zero is a broken measurement
        zero = [key for key in _RAN_POSITIVE if record.get(key) == 0]
        if zero:
            return f"{', '.join(zero)} is 0 in a trial that ran"
    allocated, reserved = record.get("peak_allocated_bytes"), record.get("peak_reserved_bytes")
    if allocated is not None and reserved is not None and allocated > reserved:  # each GPU reserves what it allocates
        return f"peak_allocated_bytes {allocated} is above peak_reserved_bytes {reserved}"
    too_large = [f"{key} is {record[key]!r}, above {limit:g}" for key, limit in _LARGEST.items()
                 if (record.get(key) or 0) > limit]
    if too_large:
        return too_large[0]
    try:
        Setting.from_dict(record)
    except FtplanError as exc:
        return str(exc)
    return None


def _mistyped(record: dict, types: dict[str, str], may_be_null: tuple[str, ...]) -> str | None:
    for key, wanted in types.items():
        value = record.get(key)
        if key in record and not (value is None and key in may_be_null) and not _is_a(value, wanted):
            return f"{key} is {value!r}, not {wanted}"
    return None


def _is_a(value: object, wanted: str) -> bool:
    if wanted == "an integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted == "a number":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value)
    if wanted == "true or false":
        return isinstance(value, bool)
    if wanted == "a list of strings":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if wanted == "a list of numbers":
        return isinstance(value, list) and all(_is_a(item, "a number") for item in value)
    return isinstance(value, str)


def read_records(paths: Iterable[Path], kind: str = "trial") -> list[dict]:
    """All valid records of one kind in several files (a folder means every *.jsonl in it)."""
    records = _read_all(paths, kind)
    return _without_duplicate_trials(records) if kind == "trial" else records


def record_files(paths: Iterable[Path]) -> list[Path]:
    """The files read_records reads: each path, or a folder's *.jsonl; only regular files of a folder, since a FIFO
    dropped in ./calibrations/ once hung every plan."""
    files: list[Path] = []
    for path in map(Path, paths):
        files.extend(sorted(p for p in path.glob("*.jsonl") if p.is_file()) if path.is_dir() else [path])
    return files


def _read_all(paths: Iterable[Path], kind: str) -> list[dict]:
    records: list[dict] = []
    for path in record_files(paths):
        if not path.exists():
            raise FtplanError(f"calibration file {printable(str(path))} does not exist")
        records.extend(iter_records(path, kind))
    return records


def _without_duplicate_trials(records: list[dict]) -> list[dict]:
    """The first measurement of each calibrated trial; later ones are reported and skipped.

    A calibration measures a trial once per machine and device, so a second record is a second run
    alongside the first (contended timings) or a file given twice; averaged in, it would skew the fits.
    Records without an architecture hash (made by hand) cannot be told apart as trials and are all kept.
    """
    first_at: dict[tuple, str] = {}
    kept = []
    for record in records:
        key = (record.get("machine_id"), record.get("device"), record["setting_key"], record.get("arch_hash"),
               record["micro_batch"])
        if record.get("source") != "calibrate" or record["status"] not in ("ok", "oom") or not record.get("arch_hash"):
            kept.append(record)
        elif key in first_at:
            warnings.warn(f"{record['_source']}: duplicate measurement of {printable(record['model'])} "
                          f"{Setting.from_dict(record).label()} batch {record['micro_batch']} on "
                          f"{printable(str(record.get('machine_id')))} (first at {first_at[key]}); record skipped",
                          RecordWarning, stacklevel=3)
        else:
            first_at[key] = record["_source"]
            kept.append(record)
    return kept
