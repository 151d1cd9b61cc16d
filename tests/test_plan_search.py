"""The setup search: largest safe batch by bisection, enumeration, ranking and filtering."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.prediction import Estimate, Prediction
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner.search import (
    PlanRequest,
    enumerate_settings,
    make_plan,
    safe_prediction,
)
from tests.helpers import FakePredictor

GPU = GpuSpec("TEST-80", 80, 100, 1000)
BASE = Setting(model="llama-3-8b")


def _linear(static_gib: float, per_sample_gib: float, wall: int | None = None):
    def predict(batch: int) -> Prediction:
        memory = (static_gib + per_sample_gib * batch) * GIB
        return Prediction(BASE, batch, GPU.name, Estimate(memory, memory), Estimate(memory, memory * 1.05),
                          Estimate(1.0, 1.1), "measured", wall)
    return predict


@settings(max_examples=200, deadline=None)
@given(static=st.floats(0, 90), per_sample=st.floats(0.01, 30), wall=st.none() | st.integers(1, 300),
       max_batch=st.integers(1, 500))
def test_bisection_finds_the_same_batch_as_a_linear_scan(static, per_sample, wall, max_batch):
    budget = MemoryBudget(GPU.memory_bytes)
    predict = _linear(static, per_sample, wall)
    safe = [b for b in range(1, max_batch + 1)
            if predict(b).peak_reserved.upper <= budget.usable_bytes and (wall is None or b < wall)]
    found = safe_prediction(predict, budget, max_batch)
    assert (found.micro_batch if found else 0) == max(safe, default=0)


def test_search_needs_few_predictions():
    calls = []
    predict = _linear(10, 0.05)
    safe_prediction(lambda b: calls.append(b) or predict(b), MemoryBudget(GPU.memory_bytes), 4096)
    assert len(set(calls)) <= 2 * math.ceil(math.log2(4096)) + 2


def test_no_batch_at_or_above_the_wall_even_with_room_to_spare():
    found = safe_prediction(_linear(1, 0.1, wall=14), MemoryBudget(GPU.memory_bytes))
    assert found.micro_batch == 13


def test_budget_subtracts_margin_and_context_reserve():
    budget = MemoryBudget(100 * GIB, safety_margin=0.05, context_reserve_bytes=2 * GIB)
    assert budget.usable_bytes == 93 * GIB
    assert "93.0 GiB" in budget.describe() and "5%" in budget.describe() and "2 GiB" in budget.describe()


def test_single_gpu_enumeration_keeps_zero_only_as_zero2_with_offload():
    settings_ = enumerate_settings(BASE)
    assert len(settings_) == 2 * 2 * 3 * 2  # (ddp, zero2+offload) × liger × (full, r16, r64) × gc
    assert all(s.zero_stage == 0 or (s.zero_stage == 2 and s.offload_optimizer) for s in settings_)
    assert {s.lora_rank for s in settings_} == {0, 16, 64}


def test_multi_gpu_enumeration_adds_zero3_and_zero_without_offload():
    settings_ = enumerate_settings(BASE.with_(gpus=8))
    assert {(s.zero_stage, s.offload_optimizer) for s in settings_} == {(0, False), (2, True), (3, True), (2, False),
                                                                        (3, False)}
    assert all(s.gpus == 8 for s in settings_)


def test_calibrated_extras_of_the_same_run_are_added_once():
    extra = BASE.with_(zero_stage=3, precision="fp16")
    other_length = BASE.with_(seq_len=1024, zero_stage=3)
    settings_ = enumerate_settings(BASE, extra=[extra, extra, other_length])
    assert settings_.count(extra) == 1 and other_length not in settings_


def _request(**changes) -> PlanRequest:
    fields = dict(base=BASE, dataset_size=19692, epochs=1, gpu=GPU, budget=MemoryBudget(GPU.memory_bytes),
                  price_per_gpu_hour=2.0)
    return PlanRequest(**{**fields, **changes})


def test_plan_is_ranked_by_total_time_and_steps_follow_the_formula():
    plan = make_plan(FakePredictor(), _request(base=BASE.with_(gpus=2), epochs=2))
    times = [s.eta.total_seconds for s in plan.ranked]
    assert times == sorted(times)
    for setup in plan.ranked:
        assert setup.eta.steps == 2 * math.ceil(19692 / 2 / setup.batch)  # per GPU: 9846 samples an epoch
        assert setup.eta.cost == pytest.approx(setup.eta.total_seconds / 3600 * 2.0 * 2)


def test_plan_by_cost_ranks_by_cost():
    plan = make_plan(FakePredictor(), _request(by="cost"))
    costs = [s.eta.cost for s in plan.ranked]
    assert costs == sorted(costs)


def test_every_ranked_batch_fits_the_budget_it_was_given():
    request = _request()
    for setup in make_plan(FakePredictor(), request).ranked:
        assert setup.best.peak_reserved.upper <= request.budget.usable_bytes


def test_max_hours_moves_slow_setups_out_of_the_ranking():
    everything = make_plan(FakePredictor(), _request())
    limit = everything.ranked[len(everything.ranked) // 2].eta.hours
    plan = make_plan(FakePredictor(), _request(max_hours=limit))
    assert plan.ranked and plan.too_slow
    assert all(s.eta.hours <= limit for s in plan.ranked) and all(s.eta.hours > limit for s in plan.too_slow)


def test_recommendation_respects_the_training_choice_but_both_kinds_are_shown():
    full = make_plan(FakePredictor(), _request(training="full"))
    lora = make_plan(FakePredictor(), _request(training="lora"))
    assert full.recommended.training == "full" and lora.recommended.training == "lora"
    assert {s.training for s in full.ranked} == {"full", "lora"}


def test_setups_that_cannot_fit_batch_one_are_listed_apart():
    plan = make_plan(FakePredictor(full_static_gib=90), _request())  # 90 GiB of states > 76 GiB usable
    assert plan.unfit and all(s.setting.lora_rank == 0 and not s.setting.offload_optimizer for s in plan.unfit)
    assert all(s.fits for s in plan.ranked)


def test_no_setup_fitting_at_all_is_one_clear_error():
    with pytest.raises(FtplanError, match="fits on TEST-80 even at batch 1"):
        make_plan(FakePredictor(lora_static_gib=100, offload_static_gib=100, full_static_gib=100), _request())


@pytest.mark.parametrize("changes, message", [
    ({"dataset_size": 0}, "dataset size must be positive"),
    ({"epochs": -1}, "epochs must be positive"),
    ({"by": "cost", "price_per_gpu_hour": None}, "needs --price-per-hour"),
    ({"max_hours": 0}, "max hours must be positive"),
    ({"training": "qlora"}, "training must be one of"),
])
def test_bad_requests_are_refused(changes, message):
    with pytest.raises(FtplanError, match=message):
        _request(**changes)
