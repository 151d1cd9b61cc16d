"""What FtplanCallback costs a training run: its per-step work must stay under 1% of the step time.

Two measurements, because on a shared machine the run-to-run noise of whole runs exceeds 1%:
- self time: the time spent inside the callback's per-step work (on_step_begin, on_step_end and the
  forward pre-hook that reads the sequence length), as a share of the measured step time. Exact on
  CPU; on CUDA an upper bound, as it includes waiting for the GPU in the step-edge synchronisations
  (which the Trainer's own per-step loss check mostly pays already).
- A/B: the same training without and with the callback, interleaved (ABBA), each arm's median seconds per
  step (from a bare timestamp at every step end, present in both arms), compared pair by pair.
  Catches indirect costs; read it against the range of the pairs, which is the noise.
One-off costs (reading the run, predicting, writing the record) are reported apart: they do not
grow with the run.

    python benchmarks/callback_overhead.py [--device cpu|cuda] [--model tiny-llama] [--steps 30] [--repeats 5]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import click
from transformers import Trainer, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from ftplan.calibration import callback as ftplan_callback  # noqa: E402
from ftplan.calibration.trial import RandomTokens, build_model, training_arguments  # noqa: E402
from ftplan.core.settings import Setting  # noqa: E402


class StepClock(TrainerCallback):
    """A bare timestamp at every step end, in both arms: the step time both are judged by."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.ends.append(time.perf_counter())

    def seconds_per_step(self, warmup: int) -> float:
        return statistics.median(b - a for a, b in zip(self.ends[warmup:], self.ends[warmup + 1:]))


class TimedCallback(ftplan_callback.FtplanCallback):
    """FtplanCallback with the time spent inside each of its events added up."""

    seconds: dict[str, float]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seconds = {}
        for event in ("on_train_begin", "on_step_begin", "on_step_end", "on_train_end"):
            setattr(self, event, self._timed(event, getattr(self, event)))

    def _timed(self, name: str, method):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
        return timed


@contextmanager
def timed_forward_hook(seconds: dict[str, float]):
    """Count the forward pre-hook's time too (it runs inside the model's forward)."""
    original = ftplan_callback._Run._see_batch

    def timed(run, module, args, kwargs):
        started = time.perf_counter()
        try:
            return original(run, module, args, kwargs)
        finally:
            seconds["forward_pre_hook"] = seconds.get("forward_pre_hook", 0.0) + time.perf_counter() - started
    ftplan_callback._Run._see_batch = timed
    try:
        yield
    finally:
        ftplan_callback._Run._see_batch = original


def run_once(setting: Setting, batch: int, steps: int, warmup: int, device: str, out: Path,
             with_callback: bool) -> tuple[float, dict[str, float]]:
    """Train once; (median seconds per step after warm-up, seconds inside the callback by event)."""
    model, arch = build_model(setting, device)
    clock = StepClock()
    timed = TimedCallback(out=out, warmup_steps=warmup, predict=False) if with_callback else None
    with tempfile.TemporaryDirectory(prefix="ftplan-overhead-") as output_dir, \
            timed_forward_hook(timed.seconds) if timed else nullcontext():
        args = training_arguments(setting, batch, steps, device, output_dir)
        dataset = RandomTokens(batch * steps, setting.seq_len, arch.vocab)
        Trainer(model=model, args=args, train_dataset=dataset, callbacks=[clock] + ([timed] if timed else [])).train()
    return clock.seconds_per_step(warmup), (timed.seconds if timed else {})


PER_STEP_EVENTS = ("on_step_begin", "on_step_end", "forward_pre_hook")


@click.command()
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--model", default="tiny-llama", show_default=True)
@click.option("--seq-len", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(min=4), default=30, show_default=True)
@click.option("--warmup-steps", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads on CPU.  [default: torch's]")
def main(device: str, model: str, seq_len: int, batch: int, steps: int, warmup_steps: int, repeats: int,
         threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
    setting = Setting(model, seq_len=seq_len, precision="bf16" if device == "cuda" else "fp32")
    bare, instrumented, per_step_shares, one_off = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ftplan-overhead-records-") as folder:
        out = Path(folder) / "records.jsonl"
        for repeat in range(repeats):
            for with_callback in (False, True) if repeat % 2 == 0 else (True, False):  # ABBA: order effects cancel
                seconds_per_step, inside = run_once(setting, batch, steps, warmup_steps, device, out, with_callback)
                (instrumented if with_callback else bare).append(seconds_per_step)
                if with_callback:
                    per_step = sum(inside.get(e, 0.0) for e in PER_STEP_EVENTS) / steps
                    one_off.append(inside.get("on_train_begin", 0.0) + inside.get("on_train_end", 0.0))
            per_step_shares.append(per_step / instrumented[-1])
            click.echo(f"repeat {repeat + 1}/{repeats}: without {bare[-1] * 1e3:.2f} ms/step, "
                       f"with {instrumented[-1] * 1e3:.2f} ms/step, inside the callback {per_step * 1e6:.1f} us/step")
    without, with_ = statistics.median(bare), statistics.median(instrumented)
    paired = sorted(w / b - 1 for w, b in zip(instrumented, bare))
    click.echo(f"\n{setting.model} s{seq_len} batch {batch} on {device}, {steps} steps x {repeats} repeats, interleaved")
    click.echo(f"self time of the per-step work: {statistics.median(per_step_shares):.4%} of step time (max {max(per_step_shares):.4%})")
    click.echo(f"A/B: {without * 1e3:.2f} ms/step without, {with_ * 1e3:.2f} with; paired difference median "
               f"{statistics.median(paired):+.2%}, range {paired[0]:+.1%} to {paired[-1]:+.1%} (run-to-run noise)")
    click.echo(f"one-off (read the run at start, write the record at end): {statistics.median(one_off) * 1e3:.0f} ms per run")


if __name__ == "__main__":
    main()
