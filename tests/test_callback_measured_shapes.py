"""The callback records the sequence length its batches had, not the seq_len it was given: a record says
what was measured, and seq_len= is only the fallback for a model never called with input_ids."""

from __future__ import annotations

import pytest

from ftplan.store.records import read_records
from tests.test_callback import SEQ_LEN, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # it skips them without transformers


def test_a_seq_len_argument_above_the_batches_is_not_recorded_as_measured(tmp_path):
    from ftplan.calibration.callback import FtplanCallback

    out = tmp_path / "c.jsonl"
    callback = FtplanCallback(out=out, warmup_steps=1, seq_len=4096, predict=False)
    train(tmp_path, [callback], steps=3)
    [record] = read_records([out])
    assert record["seq_len"] == SEQ_LEN == 32
