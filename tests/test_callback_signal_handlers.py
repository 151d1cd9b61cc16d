"""The callback's SIGTERM handler and excepthook last one train() call: a run that raised, was caught,
and was followed by another train() must leave the process's handlers as the user had them."""

from __future__ import annotations

import signal
import sys

import pytest

from ftplan.store.records import read_records
from tests.test_callback import raise_at_step_class, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # it skips them without transformers


def users_excepthook(kind, value, traceback):  # stands in for IPython's or a logging library's hook
    sys.__excepthook__(kind, value, traceback)


def users_sigterm(signum, frame):
    pass


@pytest.fixture
def users_handlers():
    previous = sys.excepthook, signal.getsignal(signal.SIGTERM)
    sys.excepthook = users_excepthook
    signal.signal(signal.SIGTERM, users_sigterm)
    yield
    sys.excepthook = previous[0]
    signal.signal(signal.SIGTERM, previous[1])


def test_a_caught_failure_then_a_second_train_restores_the_users_sigterm_handler_and_excepthook(tmp_path, users_handlers):
    from ftplan.calibration.callback import FtplanCallback

    out = tmp_path / "c.jsonl"
    callback = FtplanCallback(out=out, warmup_steps=1, predict=False)
    with pytest.raises(ValueError):
        train(tmp_path, [callback, raise_at_step_class()(3, ValueError("a bug in the user's callback"))], steps=5)
    train(tmp_path, [callback], steps=3)  # the user fixed it and trained again, in the same process

    assert sys.excepthook is users_excepthook
    assert signal.getsignal(signal.SIGTERM) is users_sigterm
    first, second = read_records([out])
    assert "train() was called again after this run raised" in first["message"]
    assert second["status"] == "ok" and second["steps_measured"] == 2


def test_handle_interruptions_false_leaves_the_users_handlers_in_place_while_training(tmp_path, users_handlers):
    from transformers import TrainerCallback

    from ftplan.calibration.callback import FtplanCallback

    class HandlersSeen(TrainerCallback):
        """The process's SIGTERM handler and excepthook as they are in the middle of training."""

        def on_step_end(self, args, state, control, **kwargs):
            self.seen = signal.getsignal(signal.SIGTERM), sys.excepthook

    out = tmp_path / "c.jsonl"
    probe = HandlersSeen()
    train(tmp_path, [FtplanCallback(out=out, warmup_steps=1, predict=False, handle_interruptions=False), probe],
          steps=3)

    assert probe.seen == (users_sigterm, users_excepthook)
    [record] = read_records([out])
    assert record["status"] == "ok"
