"""Batching strategies over fixed length distributions whose numbers can be derived by hand, and plans
from a long-tailed dataset that differ (correctly) from the padded-to-max plan."""

from __future__ import annotations

import json
from dataclasses import replace
import math

import numpy as np
import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.architecture import load_architecture
from ftplan.core.hardware import CPU, GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.prediction import Estimate, Prediction
from ftplan.models.safe_batch import MemoryBudget
from ftplan.models.batching import (
    LengthStats,
    apply_limit,
    batching,
    expected_max_length,
    group_padded_lengths,
    pack_rows,
    saturating_batch,
    split_global_batch,
    steps_per_epoch,
    worst_length,
)
from ftplan.planner.dataset_plan import (
    DatasetOptions,
    dataset_plan_to_dict,
    describe_batching,
    describe_lengths,
    plan_from_lengths,
)
from ftplan.planner.search import PlanRequest

ONE_TO_EIGHT = list(range(1, 9))


def test_pad_plans_every_sample_at_the_longest():
    shape = batching("pad", ONE_TO_EIGHT, micro_batch=2)
    assert (shape.rows, shape.memory_length, shape.time_length, shape.real_tokens_per_row) == (8, 8, 8.0, 4.5)
    assert shape.padding_fraction == pytest.approx(1 - 4.5 / 8)


def test_dynamic_padding_time_is_the_expected_longest_of_each_batch_and_memory_the_longest_sample():
    # E[max of 2 drawn from 1..8] = sum_i i * (i-1) / C(8, 2) = 168 / 28 = 6
    shape = batching("dynamic", ONE_TO_EIGHT, micro_batch=2)
    assert shape.time_length == pytest.approx(6.0)
    assert shape.memory_length == 8
    assert expected_max_length([1, 2, 3, 4], 2) == pytest.approx(20 / 6)
    # two GPUs of one sample each: the step waits for the longer of the two
    assert batching("dynamic", ONE_TO_EIGHT, micro_batch=1, world_size=2).time_length == pytest.approx(6.0)


def test_expected_longest_matches_enumeration():
    from itertools import combinations
    lengths = np.random.default_rng(1).integers(1, 50, size=14)
    by_hand = np.mean([max(c) for c in combinations(lengths, 3)])
    assert expected_max_length(lengths, 3) == pytest.approx(by_hand)


def test_group_by_length_sorted_megabatch_pads_each_batch_to_its_neighbours():
    # one megabatch of all 8, sorted longest first: batches (8,7) (6,5) (4,3) (2,1) padded to 8, 6, 4, 2
    assert group_padded_lengths(ONE_TO_EIGHT, 2, megabatch=8).tolist() == [8, 6, 4, 2]
    shape = batching("group", ONE_TO_EIGHT, micro_batch=2, megabatch=8)
    assert (shape.time_length, shape.memory_length) == (5.0, 8)


def test_group_by_length_pads_less_than_random_order_on_a_spread_of_lengths():
    lengths = np.random.default_rng(0).lognormal(5, 1, 5000).astype(int) + 1
    group = batching("group", lengths, micro_batch=8).time_length
    dynamic = batching("dynamic", lengths, micro_batch=8).time_length
    assert lengths.mean() < group < 0.5 * dynamic


def test_packing_best_fit_decreasing_by_hand():
    # capacity 8: 6 opens A (2 free), 5 opens B (3), 4 opens C (4), 3 fills B, 2 fills A
    assert sorted(pack_rows([6, 5, 4, 3, 2], 8).tolist()) == [4, 8, 8]
    shape = batching("pack", [6, 5, 4, 3, 2], micro_batch=2, pack_length=8)
    assert (shape.rows, shape.memory_length, shape.real_tokens_per_row) == (3, 8, pytest.approx(20 / 3))
    with pytest.raises(FtplanError, match="pack length"):
        batching("pack", [6, 5], micro_batch=1)


def test_too_long_samples_are_counted_then_truncated_or_dropped():
    truncated = apply_limit([1, 5, 10], 6, "truncate")
    assert (truncated.lengths.tolist(), truncated.over, truncated.tokens_lost) == ([1, 5, 6], 1, 4)
    dropped = apply_limit([1, 5, 10], 6, "drop")
    assert (dropped.lengths.tolist(), dropped.over, dropped.tokens_lost) == ([1, 5], 1, 10)
    with pytest.raises(FtplanError, match="removes them all"):
        apply_limit([10, 12], 6, "drop")


def test_worst_length_is_the_longest_sample_once_the_run_sees_an_epoch():
    lengths = list(range(1, 101))
    assert worst_length(lengths, 100) == 100
    # 10 of 100 drawn: P(max <= i) = C(i, 10) / C(100, 10); the smallest i reaching 50%
    by_hand = next(i for i in range(10, 101) if math.comb(i, 10) / math.comb(100, 10) >= 0.5)
    assert worst_length(lengths, 10, confidence=0.5) == by_hand == 94
    assert batching("dynamic", lengths, 2, epochs=0.1, confidence=0.5).memory_length < 100


def test_steps_and_global_batch_split():
    assert steps_per_epoch(10, micro_batch=2, accumulation=2, world_size=1) == 3
    assert split_global_batch(64, 1, 16, lambda b: b) == (16, 4)      # faster with larger batches: the largest
    assert split_global_batch(64, 2, 16, lambda b: 1.0) == (16, 2)    # a tie goes to the larger batch
    assert split_global_batch(64, 1, 16, lambda b: -abs(b - 4)) == (4, 16)
    with pytest.raises(FtplanError, match="multiple of 4"):
        split_global_batch(6, 4, 16, lambda b: b)


def test_saturating_batch_is_where_throughput_stops_improving():
    # rows/s = b / (1 + b): 0.5, .667, .8, .889, .941, .970, .985 for 1..64; 95% of .985 = .935 -> 16
    assert saturating_batch(64, lambda b: b / (1 + b)) == 16
    assert saturating_batch(64, lambda b: b / (1 + 0.1 * b)) == 64


def test_length_stats():
    stats = LengthStats.of(ONE_TO_EIGHT)
    assert (stats.count, stats.total_tokens, stats.max, stats.min, stats.mean) == (8, 36, 8, 1, 4.5)
    assert stats.percentiles[50] == 4.5


# A token-driven stand-in for the predictor: memory and time linear in tokens per micro-batch.
GPU = GpuSpec("TEST-80", 80, 100, 1000)
STATIC_GIB, GIB_PER_TOKEN = 10.0, 0.005
SECONDS_FIXED, SECONDS_PER_TOKEN = 0.1, 1e-4


class TokenPredictor:
    def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction:
        tokens = micro_batch * setting.seq_len
        memory = (STATIC_GIB + GIB_PER_TOKEN * tokens) * GIB
        seconds = SECONDS_FIXED + SECONDS_PER_TOKEN * tokens
        return Prediction(setting, micro_batch, gpu.name, Estimate(memory, memory), Estimate(memory, memory),
                          Estimate(seconds, seconds), "measured")


# Long tail: 990 samples of 100 tokens, 10 of 1000.
LONG_TAIL = np.array([100] * 990 + [1000] * 10)
BUDGET = MemoryBudget(GPU.memory_bytes)
LARGEST = int((BUDGET.usable_bytes / GIB - STATIC_GIB) / (GIB_PER_TOKEN * 1000))


def _plan(strategy: str, gpu: GpuSpec = GPU, **options):
    request = PlanRequest(base=Setting(model="llama-3-8b", seq_len=1000), dataset_size=1, epochs=1.0, gpu=gpu,
                          budget=BUDGET, lora_ranks=(16,), precision="bf16")
    return plan_from_lengths(TokenPredictor(), request, LONG_TAIL, DatasetOptions(strategy=strategy, **options))


def test_long_tail_plans_memory_at_the_longest_batch_and_time_at_the_real_tokens():
    pad, dynamic = _plan("pad"), _plan("dynamic")
    b = LARGEST
    assert pad.plan.recommended.batch == dynamic.plan.recommended.batch == b  # memory: the long samples still come
    assert dynamic.plan.recommended.best.setting.seq_len == 1000
    steps = math.ceil(1000 / b)
    assert pad.plan.recommended.eta.total_seconds == pytest.approx(steps * (SECONDS_FIXED + SECONDS_PER_TOKEN * b * 1000))
    # a batch of b holds a long sample with probability 1 - C(990, b) / C(1000, b)
    expected = 100 + 900 * (1 - math.comb(990, b) / math.comb(1000, b))
    assert dynamic.recommended.batching.time_length == pytest.approx(expected)
    per_step = SECONDS_FIXED + SECONDS_PER_TOKEN * b * round(expected)
    assert dynamic.plan.recommended.eta.total_seconds == pytest.approx(steps * per_step)
    assert dynamic.plan.recommended.eta.total_seconds < 0.5 * pad.plan.recommended.eta.total_seconds


def test_packing_a_long_tail_counts_packed_rows():
    # a row of 1000 holds one long sample or ten short ones: 10 + 990 / 10 = 109 rows, all full
    packed = _plan("pack", pack_length=1000)
    choice = packed.recommended
    assert (choice.batching.rows, choice.batching.real_tokens_per_row) == (109, 1000.0)
    assert packed.plan.recommended.eta.steps == math.ceil(109 / choice.micro_batch)


class QuadraticPredictor(TokenPredictor):
    """Packed SDPA attention: a micro-batch's time grows with the square of its rows (models/prior.py)."""

    def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction:
        linear = super().predict(setting, micro_batch, gpu)
        seconds = linear.seconds_per_step.mean + 0.01 * micro_batch**2
        return replace(linear, seconds_per_step=Estimate(seconds, seconds))


def test_packing_runs_the_fastest_micro_batch_not_the_largest_that_fits():
    request = PlanRequest(base=Setting(model="llama-3-8b", seq_len=1000), dataset_size=1, epochs=1.0, gpu=GPU,
                          budget=BUDGET, lora_ranks=(16,), precision="bf16")
    packed = plan_from_lengths(QuadraticPredictor(), request, LONG_TAIL, DatasetOptions(strategy="pack", pack_length=1000))
    # rows/s = b / (0.1 + 0.1 b + 0.01 b²) peaks at b = sqrt(0.1 / 0.01) = 3.16: 3, where more fit
    assert (packed.recommended.micro_batch, packed.recommended.largest_fitting) == (3, LARGEST)


class NoFixedCostPredictor(TokenPredictor):
    """Time in proportion to the padded tokens alone: no per-step cost for a larger batch to spread."""

    def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction:
        linear = super().predict(setting, micro_batch, gpu)
        seconds = SECONDS_PER_TOKEN * micro_batch * setting.seq_len
        return replace(linear, seconds_per_step=Estimate(seconds, seconds))


def test_dynamic_padding_on_a_long_tail_runs_the_batch_that_pads_least_when_it_is_clearly_faster():
    request = PlanRequest(base=Setting(model="llama-3-8b", seq_len=1000), dataset_size=1, epochs=1.0, gpu=GPU,
                          budget=BUDGET, lora_ranks=(16,), precision="bf16")
    lengths = np.array([100] * 900 + [1000] * 100)  # one row in ten is long: a batch of b pads to it ever more often
    dynamic = plan_from_lengths(NoFixedCostPredictor(), request, lengths, DatasetOptions(strategy="dynamic"))
    assert dynamic.recommended.micro_batch == 1 < dynamic.recommended.largest_fitting
    padded = plan_from_lengths(NoFixedCostPredictor(), request, lengths, DatasetOptions(strategy="pad"))
    assert padded.recommended.micro_batch == padded.recommended.largest_fitting  # padding to the length: all alike


def test_truncating_the_tail_plans_memory_at_the_limit():
    capped = _plan("dynamic", max_length=200)
    assert capped.limited.over == 10 and capped.limited.tokens_lost == 8000
    assert capped.recommended.batching.memory_length == 200
    assert capped.plan.recommended.batch > LARGEST
    assert any("10 samples are longer than 200" in line for line in describe_lengths(capped.stats, capped.limited, "ids"))


def test_global_batch_is_micro_batch_times_accumulation():
    plan = _plan("dynamic", global_batch=2 * LARGEST)
    choice = plan.recommended
    assert choice.micro_batch * choice.accumulation == 2 * LARGEST and choice.micro_batch <= LARGEST
    assert plan.plan.recommended.eta.steps == math.ceil(1000 / (2 * LARGEST))
    assert any("gradient accumulation" in line for line in describe_batching(choice, "dynamic"))


@pytest.mark.parametrize("strategy", ["dynamic", "group"])
def test_variable_shapes_on_a_gpu_note_the_allocators_growth_and_keep_the_safe_batch(strategy):
    plan = _plan(strategy)
    (note,) = plan.notes
    assert "1.8×" in note and "expandable_segments:True" in note and "6.7%" in note
    assert "dataset_memory_h200_2026-12-03.txt" in note and "emitted_runs_h100_2026-12-07.jsonl" in note
    assert plan.plan.recommended.batch == LARGEST  # the note changes no bound
    assert dataset_plan_to_dict(plan, [])["notes"] == [note]


def test_variable_shapes_under_expandable_segments_get_no_advice_to_set_them():
    from ftplan.planner.dataset_plan import allocator_notes

    assert allocator_notes("dynamic", GPU.name)
    assert not allocator_notes("dynamic", GPU.name, "expandable_segments:True,garbage_collection_threshold:0.8")


@pytest.mark.parametrize("strategy, gpu", [("pad", GPU), ("pack", GPU), ("dynamic", GpuSpec(CPU, 80, 1, 40))])
def test_fixed_shapes_or_a_cpu_get_no_allocator_note(strategy, gpu):
    plan = _plan(strategy, gpu, **({"pack_length": 1000} if strategy == "pack" else {}))
    assert plan.notes == () and dataset_plan_to_dict(plan, [])["notes"] == []


def test_plan_cli_from_a_dataset_prints_the_distribution_and_plans_at_the_longest_batch(tmp_path, capsys, monkeypatch):
    import json

    from tests.helpers import run_ftplan
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [0] * int(n)}) + "\n" for n in LONG_TAIL))
    args = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset", data]
    code, out, err = run_ftplan([*args, "--json", "--global-batch", "32"], capsys, monkeypatch)
    assert code == 0, err
    report = json.loads(out)["dataset"]
    assert report["lengths"]["count"] == 1000 and report["lengths"]["max"] == 1000
    chosen = report["recommended"]
    assert chosen["memory_length"] == 1000 and chosen["global_batch"] == 32
    assert chosen["micro_batch"] * chosen["gradient_accumulation"] == 32
    assert any("expandable_segments:True" in note for note in report["notes"])
    code, out, err = run_ftplan(args, capsys, monkeypatch)  # dynamic padding, the default: one note, printed
    assert code == 0, err
    assert out.count("note: dynamic padding changes the micro-batch's shape every step") == 1
    code, out, err = run_ftplan([*args, "--batching", "pack", "--pack-length", "1000"], capsys, monkeypatch)
    assert code == 0, err
    assert "Dataset: 1,000 samples, 109,000 tokens" in out and "109 packed rows per epoch" in out
    assert "expandable_segments" not in out
    code, out, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H200"], capsys, monkeypatch)
    assert code != 0 and "--dataset-size" in out + err


def test_a_global_batch_or_gpu_count_beyond_the_dataset_is_refused(tmp_path):
    """8 samples planned as a global batch of 100 (micro-batch 5 × 20) once, an ETA of samples that do not exist."""
    from ftplan.planner import api
    from ftplan.planner.dataset_plan import DatasetOptions

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": "word " * 50}) + "\n" for _ in range(8)))
    with pytest.raises(FtplanError, match="a global batch of 100 for the dataset's 8 samples"):
        api.plan("llama-3.2-1b", gpu="H200", dataset=data, chars_per_token=4.0,
                 dataset_options=DatasetOptions(global_batch=100))
    with pytest.raises(FtplanError, match="16 GPUs for the dataset's 8 samples"):
        api.plan("llama-3.2-1b", gpu="H200", dataset=data, chars_per_token=4.0, gpus=16)


def test_split_global_batch_keeps_an_accumulating_micro_batch_within_what_fits_with_the_kept_gradients():
    assert split_global_batch(64, 1, 16, lambda b: b, max_accumulating_micro_batch=10) == (8, 8)
    assert split_global_batch(16, 1, 16, lambda b: b, max_accumulating_micro_batch=0) == (16, 1)  # no accumulation
    with pytest.raises(FtplanError, match="no micro-batch fits"):
        split_global_batch(64, 1, 16, lambda b: b, max_accumulating_micro_batch=0)


def test_an_accumulating_plan_predicts_and_fits_memory_with_the_kept_gradients():
    """A full fine-tuning that accumulates holds every fp32 gradient through its micro-steps: the plan's memory
    carries them, and its micro-batch fits with them."""
    from ftplan.models.prior import accumulated_gradient_bytes

    setting = Setting(model="qwen2.5-0.5b", seq_len=1000)
    request = PlanRequest(base=setting, dataset_size=1, epochs=1.0, gpu=GPU, budget=BUDGET, lora_ranks=(),
                          precision="bf16", training="full")
    kept = accumulated_gradient_bytes(load_architecture("qwen2.5-0.5b"), setting)
    assert kept == pytest.approx(494_032_768 * 4)  # every parameter's fp32 .grad
    plan = plan_from_lengths(TokenPredictor(), request, LONG_TAIL, DatasetOptions(strategy="pad", global_batch=64))
    setup = next(s for s in plan.plan.ranked if not s.setting.uses_deepspeed)  # DeepSpeed keeps its own buffers
    choice = plan.setups[setup.setting]
    assert choice.accumulation > 1
    plain = TokenPredictor().predict(setup.setting, choice.micro_batch, GPU).peak_reserved.upper
    assert setup.best.peak_reserved.upper == pytest.approx(plain + kept)
    assert setup.best.peak_reserved.upper <= BUDGET.usable_bytes
    assert any("gradient accumulation keeps 1.84 GiB" in note for note in setup.best.notes)


def test_a_batch_measured_without_accumulation_proves_no_accumulating_batch_safe():
    """A calibration's measured peak at 16 proves 16 x 1 safe; 16 x 2 also holds the kept gradients, so it is no
    measurement and proves nothing below them."""
    from ftplan.models.predictor import with_accumulation
    from ftplan.models.safe_batch import proven_batch

    peak = 120 * GIB
    measured = Prediction(Setting("qwen2.5-0.5b"), 16, GPU.name, Estimate(peak, peak), Estimate(peak, peak),
                          Estimate(1.0, 1.1), "measured", measured_healthy=((16, peak),))
    accumulating = with_accumulation(measured, 2)
    assert accumulating.source == "extrapolated" and with_accumulation(measured, 1) is measured
    assert proven_batch(measured.measured_healthy, 121 * GIB) == 16
    assert proven_batch(accumulating.measured_healthy, 121 * GIB) is None  # 120 GiB + 1.84 kept


def test_setups_that_fit_no_split_of_the_global_batch_are_named_not_dropped_silently():
    """Full fine-tuning of an 8B model keeps 30 GiB of fp32 gradients through accumulation: beyond what fits
    here, so a global batch that needs accumulation leaves those setups out, and the plan says which."""
    class FullFineTuningNearTheCard(TokenPredictor):
        def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction:
            linear = super().predict(setting, micro_batch, gpu)
            if setting.lora_rank or setting.offload_optimizer:
                return linear
            full = linear.peak_reserved.mean + 50 * GIB  # 60 GiB static: the 30 kept GiB do not fit beside it
            return replace(linear, peak_allocated=Estimate(full, full), peak_reserved=Estimate(full, full))

    request = PlanRequest(base=Setting(model="llama-3-8b", seq_len=1000), dataset_size=1, epochs=1.0, gpu=GPU,
                          budget=BUDGET, lora_ranks=(16,), precision="bf16")
    plan = plan_from_lengths(FullFineTuningNearTheCard(), request, LONG_TAIL,
                             DatasetOptions(strategy="pad", global_batch=64))
    assert plan.left_out and all(not s.setting.lora_rank and not s.setting.uses_deepspeed for s in plan.left_out)
    assert all(s.setting not in plan.setups for s in plan.left_out)
    (note,) = [n for n in plan.notes if n.startswith("Left out for --global-batch")]
    assert plan.left_out[0].label in note and "a smaller --global-batch keeps them" in note


def test_split_global_batch_accumulates_more_only_for_a_clearly_faster_micro_batch():
    nearly = {1: 1.009, 2: 1.0, 4: 1.0, 8: 1.0}  # micro-batch 1 is 0.9% faster: noise, not worth 8 micro-steps
    assert split_global_batch(8, 1, 8, nearly.get) == (8, 1)
    clearly = {1: 1.05, 2: 1.0, 4: 1.0, 8: 1.0}
    assert split_global_batch(8, 1, 8, clearly.get) == (1, 8)


def test_a_limit_that_loses_much_of_the_data_is_said_as_a_warning():
    lengths = np.array([100] * 9 + [1000])
    stats = LengthStats.of(lengths)
    assert not any(line.startswith("warning:") for line in describe_lengths(stats, apply_limit(lengths, 900), "ids"))
    lines = describe_lengths(stats, apply_limit(lengths, 50), "ids")  # 1,400 of 1,900 tokens cut
    assert lines[-1].startswith("warning: the limit loses 74% of the dataset's tokens")
