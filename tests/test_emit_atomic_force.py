"""--emit --force is all or nothing and touches only what ftplan wrote: a full disk leaves the earlier plan
whole, and a README.txt or training_args.py the user wrote or edited is never replaced."""

from __future__ import annotations

import errno
import os

import pytest

from ftplan.core.errors import FtplanError
from ftplan.planner import emit as emit_module
from ftplan.planner.emit import MANIFEST, README, TRAINING_ARGS, TRAINING_ARGS_PY
from tests.test_emit_safety import DEEPSPEED, PLAIN_LORA, emit


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_full_disk_mid_write_leaves_the_earlier_plan_as_it_was(tmp_path, monkeypatch):
    emit(tmp_path, DEEPSPEED)
    before = snapshot(tmp_path)
    real_write = emit_module._write_new
    written = []

    def full_after_two(folder, name, text):
        if len(written) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(name)
        real_write(folder, name, text)

    monkeypatch.setattr(emit_module, "_write_new", full_after_two)
    with pytest.raises(FtplanError, match="No space left on device; the folder is left as it was"):
        emit(tmp_path, PLAIN_LORA, force=True)
    assert snapshot(tmp_path) == before  # no staging folder left, nothing removed, nothing half-written


@pytest.mark.parametrize("name", [README, TRAINING_ARGS_PY])
def test_force_never_replaces_a_file_the_user_wrote(tmp_path, name):
    (tmp_path / name).write_text("the user's own")
    with pytest.raises(FtplanError, match="not written by ftplan"):
        emit(tmp_path, PLAIN_LORA, force=True)
    assert (tmp_path / name).read_text() == "the user's own"


def test_force_never_replaces_a_file_ftplan_wrote_that_the_user_edited_since(tmp_path):
    emit(tmp_path, PLAIN_LORA)
    (tmp_path / TRAINING_ARGS_PY).write_text((tmp_path / TRAINING_ARGS_PY).read_text() + "# my change\n")
    with pytest.raises(FtplanError, match="or was edited since"):
        emit(tmp_path, DEEPSPEED, force=True)
    assert (tmp_path / TRAINING_ARGS_PY).read_text().endswith("# my change\n")


def test_the_manifest_lists_what_was_written_and_force_replaces_it(tmp_path):
    emit(tmp_path, DEEPSPEED)
    emit(tmp_path, PLAIN_LORA, force=True)
    assert (tmp_path / MANIFEST).exists() and not any(p.name.startswith(".ftplan-emit-") for p in tmp_path.iterdir())
    assert "deepspeed" not in (tmp_path / TRAINING_ARGS).read_text()


def test_a_second_emit_into_the_folder_waits_for_the_first_to_finish(tmp_path):
    """Eight plans emitting into one folder at once left one's plan.json beside another's Trainer arguments, and
    a manifest matching neither (so a later --force refused the folder as not ftplan's)."""
    import fcntl
    import threading

    emit(tmp_path, DEEPSPEED)
    before = snapshot(tmp_path)
    held = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a first writer holds it
    writer = threading.Thread(target=emit, args=(tmp_path, PLAIN_LORA, True))
    writer.start()
    writer.join(timeout=1.0)
    assert writer.is_alive() and snapshot(tmp_path) == before  # waiting, nothing written
    os.close(held)
    writer.join(timeout=30)
    assert not writer.is_alive() and snapshot(tmp_path) != before
    assert not emit_module.edited_run_files(tmp_path)  # one plan's files, and its manifest
