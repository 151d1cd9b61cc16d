"""Several processes appending to one calibration file at once: no line interleaved, none lost,
and a writer killed mid-line never glues its fragment to another writer's record."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

from ftplan.store.records import RecordWarning, read_records

WRITER = (sys.executable, str(Path(__file__).parent / "fixtures" / "reliability" / "record_writer.py"))


def _start(out: Path, tag: str, count: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*WRITER, str(out), tag, str(count), *extra], stderr=subprocess.PIPE, text=True)


def _records_by_writer(out: Path) -> tuple[dict[str, list[int]], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records([out])
    by_writer: dict[str, list[int]] = {}
    for r in records:
        by_writer.setdefault(r["writer"], []).append(r["index"])
    return by_writer, [str(w.message) for w in caught if issubclass(w.category, RecordWarning)]


def test_writers_appending_lines_far_larger_than_an_atomic_write_lose_and_interleave_nothing(tmp_path):
    """64 KiB lines: without the lock, the kernel may split such appends and interleave them."""
    out = tmp_path / "c.jsonl"
    writers = [_start(out, f"w{n}", 30, "--pad", str(64 * 1024)) for n in range(4)]
    assert [w.wait(timeout=60) for w in writers] == [0] * 4, [w.stderr.read() for w in writers]
    by_writer, problems = _records_by_writer(out)
    assert problems == []
    assert by_writer == {f"w{n}": list(range(30)) for n in range(4)}  # every record, each writer's in its order
    assert all(len(line) > 64 * 1024 for line in out.read_text().splitlines())


def test_a_writer_killed_mid_line_among_live_writers_costs_only_its_own_fragment(tmp_path):
    out = tmp_path / "c.jsonl"
    writers = [_start(out, "torn", 5, "--tear"), *(_start(out, f"w{n}", 20, "--pad", "4096") for n in range(3))]
    assert [w.wait(timeout=60) for w in writers] == [-9, 0, 0, 0]
    by_writer, problems = _records_by_writer(out)
    assert by_writer == {"torn": list(range(5)), **{f"w{n}": list(range(20)) for n in range(3)}}
    torn_lines = [n for n, line in enumerate(out.read_text().splitlines(), start=1) if not _is_json(line)]
    assert len(torn_lines) == 1  # the fragment sits alone on its line, whoever wrote next
    assert problems == [f"{out}:{torn_lines[0]}: corrupt or truncated record skipped"]


def test_readers_during_appends_see_only_whole_records_or_a_named_last_line(tmp_path):
    """A planner reading while a calibration writes: it may miss the line being written, never mangle one."""
    out = tmp_path / "c.jsonl"
    writers = [_start(out, f"w{n}", 40, "--pad", str(32 * 1024)) for n in range(2)]
    while any(w.poll() is None for w in writers):
        by_writer, problems = _records_by_writer(out) if out.exists() else ({}, [])
        for indices in by_writer.values():
            assert indices == list(range(len(indices)))
        assert len(problems) <= 1  # only the line in flight
    assert [w.returncode for w in writers] == [0, 0]
    assert _records_by_writer(out) == ({"w0": list(range(40)), "w1": list(range(40))}, [])
    assert all(_is_json(line) for line in out.read_text().splitlines())


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def test_a_writer_opening_a_new_file_while_another_writes_its_first_line_waits_for_it(tmp_path):
    """The first line half-written (its writer holds the lock) is no record yet: the check that the file holds
    records waits for the line instead of refusing the file (a calibration failed so with its peers starting)."""
    import fcntl
    import os
    import threading
    import time

    from ftplan.core.settings import Setting
    from ftplan.store.records import append_record, build_record

    out = tmp_path / "c.jsonl"
    line = (json.dumps(build_record(Setting("tiny-llama", seq_len=64), 1, "ok", source="calibrate")) + "\n").encode()
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, line[: len(line) // 2])
    failures = []

    def second_writer() -> None:
        try:
            append_record(out, build_record(Setting("tiny-llama", seq_len=64), 2, "ok", source="calibrate"))
        except Exception as exc:  # noqa: BLE001 - the test reports whatever the writer raised
            failures.append(exc)

    writer = threading.Thread(target=second_writer)
    writer.start()
    time.sleep(0.3)
    os.write(fd, line[len(line) // 2:])
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    writer.join(timeout=30)
    assert failures == []
    assert [r["micro_batch"] for r in read_records([out])] == [1, 2]
