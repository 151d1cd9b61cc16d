"""Properties (hypothesis) the planner's answers must keep for any plausible evidence.

Memory predictions never fall as batch or sequence grows, from the fits and from the prior alone;
the planner's batch always lies inside the usable memory; the ETA never falls as the dataset or the
epochs grow. test_fit.py and test_prior.py hold the same monotonicity for one fit and one prior;
here it is the Predictor the CLI uses, across models, sequence lengths and multi-GPU settings.
"""

from __future__ import annotations

import functools
import warnings

from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.core.hardware import find_gpu, load_catalog
from ftplan.core.settings import Setting
from ftplan.models.predictor import Predictor
from ftplan.models.eta import estimate_eta, largest_micro_batch
from ftplan.planner.search import MemoryBudget, PlanRequest, make_plan
from tests.helpers import GIB, synthetic_records

H200 = find_gpu("H200", load_catalog())
MODEL = "qwen2.5-0.5b"
CALIBRATED = Setting(MODEL, seq_len=1024, gradient_checkpointing=True)
SHIPPED_MODELS = ("llama-2-7b", "llama-3-8b", "llama-3.2-1b", "qwen1.5-0.5b", "qwen2.5-0.5b")
FEW = settings(max_examples=12, deadline=None)


@functools.lru_cache(maxsize=8)
def fitted_predictor(static_gib: float, slopes: tuple[float, float]) -> Predictor:
    """A Predictor fitted on convex two-phase records at three sequence lengths, as a calibration on an H200 gives."""
    def memory(batch: int, seq: int) -> float:
        tokens = batch * seq / 1024
        return GIB * max(static_gib + slopes[0] * tokens, static_gib - 1 + (slopes[0] + slopes[1]) * tokens)

    records = synthetic_records([1, 2, 4, 6, 8], seq_lens=(512, 1024, 2048), memory=memory, setting=CALIBRATED)
    for record in records:
        record["gpu_name"] = "NVIDIA H200"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Predictor.fit(records)


# Two fixed record shapes (each fit takes seconds here): light static memory with a steep second phase,
# and heavy static memory with a gentle one.
SHAPES = st.sampled_from([(3.0, (0.3, 1.2)), (14.0, (1.5, 0.2))])


@FEW
@given(shape=SHAPES, batch=st.integers(1, 48), seq=st.integers(128, 8192),
       change=st.sampled_from([{}, {"liger": True}, {"lora_rank": 16}, {"gradient_checkpointing": False}]))
def test_fitted_memory_never_falls_as_batch_or_sequence_grows(shape, batch, seq, change):
    """For the calibrated setting and its uncalibrated relatives (which the fit corrects through the prior)."""
    predictor = fitted_predictor(*shape)
    setting = CALIBRATED.with_(seq_len=seq, **change)
    here = predictor.predict(setting, batch, H200)
    for bigger in (predictor.predict(setting, batch + 1, H200), predictor.predict(setting.with_(seq_len=seq + 64), batch, H200)):
        for name in ("peak_allocated", "peak_reserved"):
            now, then = getattr(here, name), getattr(bigger, name)
            assert then.mean >= now.mean - 1 and then.upper >= now.upper - 1, (name, here, bigger)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(SHIPPED_MODELS), batch=st.integers(1, 64), seq=st.integers(64, 16384),
       zero=st.sampled_from([(0, False), (2, False), (3, False), (2, True), (3, True)]), gpus=st.sampled_from([1, 2, 8]),
       liger=st.booleans(), checkpointing=st.booleans(), lora=st.sampled_from([0, 8, 64]))
def test_prior_memory_never_falls_as_batch_or_sequence_grows(model, batch, seq, zero, gpus, liger, checkpointing, lora):
    predictor = _prior_only()
    setting = Setting(model, seq_len=seq, zero_stage=zero[0], offload_optimizer=zero[1], gpus=gpus, liger=liger,
                      gradient_checkpointing=checkpointing, lora_rank=lora)
    here = predictor.predict(setting, batch, H200)
    for bigger in (predictor.predict(setting, batch + 1, H200), predictor.predict(setting.with_(seq_len=seq + 64), batch, H200)):
        assert bigger.peak_allocated.upper >= here.peak_allocated.upper
        assert bigger.peak_reserved.upper >= here.peak_reserved.upper


@functools.lru_cache(maxsize=1)
def _prior_only() -> Predictor:
    return Predictor.fit([])


def _request(dataset_size: int = 10_000, epochs: float = 1.0, capacity_gib: float = 80, margin: float = 0.05,
             seq: int = 1024) -> PlanRequest:
    return PlanRequest(base=Setting(MODEL, seq_len=seq), dataset_size=dataset_size, epochs=epochs, gpu=H200,
                       budget=MemoryBudget(int(capacity_gib * GIB), margin), lora_ranks=(16,))


@FEW
@given(shape=SHAPES, capacity_gib=st.floats(24, 141), margin=st.floats(0, 0.3), seq=st.sampled_from([512, 1024, 4096]))
def test_every_planned_batch_is_the_largest_inside_the_usable_memory(shape, capacity_gib, margin, seq):
    predictor = fitted_predictor(*shape)
    request = _request(capacity_gib=capacity_gib, margin=margin, seq=seq)
    plan = make_plan(predictor, request)
    assert plan.recommended is not None
    for setup in plan.ranked + plan.too_slow:
        assert _inside(setup.best, request.budget)
        one_more = predictor.predict(setup.setting, setup.batch + 1, H200)
        assert not _inside(one_more, request.budget) or setup.batch + 1 > request.dataset_size  # nothing left on the table
    for setup in plan.unfit:
        assert not _inside(setup.at_batch_one, request.budget)


def _inside(prediction, budget: MemoryBudget) -> bool:
    """Below any observed wall or OOM, and the upper bound of reserved memory within the usable memory
    or the batch (or a larger one) measured healthy with a peak within the card less the user's margins."""
    wall = prediction.wall_batch
    measured = any(batch >= prediction.micro_batch and peak <= budget.usable_bytes
                   for batch, peak in prediction.measured_healthy)
    return (prediction.peak_reserved.upper <= budget.usable_bytes or measured) and (wall is None or prediction.micro_batch < wall)


@settings(max_examples=200, deadline=None)
@given(seconds=st.floats(1e-3, 1e3), dataset=st.integers(1, 10**9), more=st.integers(0, 10**9),
       epochs=st.floats(0.01, 100), more_epochs=st.floats(0, 100), batch=st.integers(1, 4096), gpus=st.integers(1, 1024))
def test_eta_never_falls_as_the_dataset_or_the_epochs_grow(seconds, dataset, more, epochs, more_epochs, batch, gpus):
    batch = min(batch, largest_micro_batch(dataset, gpus))  # a larger batch never fills a step and is refused
    base = estimate_eta(seconds, dataset, epochs, batch, gpus, price_per_gpu_hour=2.0)
    for bigger in (estimate_eta(seconds, dataset + more, epochs, batch, gpus, 2.0),
                   estimate_eta(seconds, dataset, epochs + more_epochs, batch, gpus, 2.0)):
        assert bigger.steps >= base.steps >= 1
        assert bigger.total_seconds >= base.total_seconds and bigger.cost >= base.cost


@settings(max_examples=6, deadline=None)
@given(shape=SHAPES, dataset=st.integers(1, 100_000), factor=st.integers(2, 50), epochs=st.floats(0.5, 5))
def test_the_recommended_setups_eta_never_falls_as_the_dataset_or_the_epochs_grow(shape, dataset, factor, epochs):
    """Through the whole search, where a larger dataset also lets the per-GPU batch grow."""
    predictor = fitted_predictor(*shape)
    times = [make_plan(predictor, _request(dataset_size=d, epochs=e)).ranked[0].eta.total_seconds
             for d, e in ((dataset, epochs), (dataset * factor, epochs), (dataset, epochs * factor))]
    assert times[1] >= times[0] and times[2] >= times[0]
