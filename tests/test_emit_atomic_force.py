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
