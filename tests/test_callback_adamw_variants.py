"""The Trainer's default optimizer (adamw_torch_fused) keeps AdamW's state, so the callback's prediction
comes from a calibration of the same setting with adamw_torch, as the README says of AdamW variants."""

from __future__ import annotations

import pytest

from tests.test_callback import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # it skips them without transformers


def test_a_fused_adamw_run_is_predicted_from_the_adamw_torch_calibration(tmp_path, capsys):
    from ftplan.calibration.callback import FtplanCallback

    out = tmp_path / "c.jsonl"
    for batch in (1, 4):
        train(tmp_path, [FtplanCallback(out=out, warmup_steps=1)], micro_batch=batch, steps=3, optim="adamw_torch")
    capsys.readouterr()  # the first runs had nothing to predict from
    callback = FtplanCallback(out=out, warmup_steps=1)
    train(tmp_path, [callback], micro_batch=2, steps=3, optim="adamw_torch_fused")
    assert "no prediction" not in capsys.readouterr().err
    assert callback.record["optimizer"] == "adamw_torch_fused"
    assert callback.record["prediction"]["source"] == "interpolated"
