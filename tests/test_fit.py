"""Fits of memory and time against batch: convex curves, the allocator wall, monotone predictions."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.external import DEFAULT_DIR, load_external
from ftplan.core.settings import Setting
from ftplan.models.fit import compute_rate_for, fit_setting
from ftplan.models.fitset import FitSet, fit_records
from ftplan.models.prior import ladder_slopes
from ftplan.models.safe_batch import MemoryBudget, fit_largest_safe_batch
from tests.helpers import GIB, SETTING, synthetic_records

needs_external = pytest.mark.skipif(not DEFAULT_DIR.is_dir(), reason="public measurements not present")


def external_fit(alloc_conf: str):
    records = [r for r in load_external() if r["model"] == "llama-3-8b" and r["alloc_conf"] == alloc_conf]
    return fit_setting(records)


def test_large_batches_follow_the_steeper_phase_not_the_line_through_small_ones():
    shape_only = SETTING.with_(model="synthetic-architecture")  # no prior: the points' own phases alone
    fit = fit_setting(synthetic_records([1, 2, 3], setting=shape_only))
    truth = synthetic_records([16], setting=shape_only)[0]["peak_allocated_bytes"]
    assert fit.peak_allocated(16, 2048).mean == pytest.approx(truth, rel=0.005)


def test_a_ladder_whose_step_time_falls_warns_and_never_prices_a_large_batch_at_a_small_ones_time():
    """A loaded 2-core host calibrated batch 1 in 4.18 s, 2 in 5.01 and 4 in 3.22: the flat fit priced batch 432
    at 4.1 s a step. Without a compute rate (a CPU) a sample now costs at least the best measured per-sample time."""
    from ftplan.models.fit import NoisyLadderWarning

    times = {1: 4.18, 2: 5.01, 4: 3.22}
    noisy = synthetic_records([1, 2, 4], seconds=lambda b, s: times[b], setting=SETTING.with_(model="tiny-llama"))
    with pytest.warns(NoisyLadderWarning, match="step time fell as the batch grew"):
        fit = fit_setting(noisy)
    assert fit.seconds_per_step(432, 2048).mean >= 432 * 3.22 / 4 * 0.99
    assert fit.seconds_per_step(4, 2048).mean == pytest.approx(times[4], rel=0.3)  # measured batches keep their fit
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoisyLadderWarning)  # a real, growing ladder: no warning, no floor
        steady = fit_setting(synthetic_records([1, 2, 4], setting=SETTING.with_(model="tiny-llama")))
        flat = {1: 0.101, 2: 0.100, 4: 0.099}  # a launch-bound GPU ladder, flat within noise: no floor either
        launch_bound = fit_setting(synthetic_records([1, 2, 4], seconds=lambda b, s: flat[b],
                                                     setting=SETTING.with_(model="tiny-llama")))
    assert steady.seconds_per_step(4, 2048).mean == pytest.approx(0.2 + 0.1 * 4, rel=0.01)
    assert launch_bound.seconds_per_step(8, 2048).mean < 0.2


def test_concave_noise_in_three_points_gives_one_line():
    fit = fit_setting(synthetic_records([1, 2, 3], memory=lambda b, s: [0, 10, 14, 17][b] * GIB))
    assert len(fit.allocated.lines) == 1


@needs_external
def test_expandable_segments_wall_found_where_memory_stalls_and_time_jumps():
    fit = external_fit("expandable_segments:True")
    assert fit.wall_batches(2048) == [14]
    assert fit.n_points == 13  # the wall point is kept out of the line
    assert fit.largest_ok_batch(2048) == 14
    assert fit_largest_safe_batch(fit, 2048, MemoryBudget(fit.capacity_bytes)) < 14


@needs_external
def test_first_oom_bounds_the_safe_batch_of_public_8b_run():
    fit = external_fit("")
    assert fit.smallest_oom_batch(2048) == 13 and fit.wall_batches(2048) == []
    assert fit_largest_safe_batch(fit, 2048, MemoryBudget(10 * fit.capacity_bytes)) == 12  # a bigger card does not hide the OOM
    assert 0 < fit_largest_safe_batch(fit, 2048, MemoryBudget(fit.capacity_bytes)) <= 12


@needs_external
def test_public_8b_fit_explains_memory_and_time():
    fit = external_fit("")
    assert fit.r2["memory"] > 0.99 and fit.r2["time"] > 0.99


def test_allocator_retries_mark_the_top_batch_as_wall():
    records = synthetic_records([1, 2, 3, 4, 5])
    records[-1]["num_alloc_retries"] = 3
    assert fit_setting(records).wall_batches(2048) == [5]


def test_slow_step_in_the_middle_of_the_ladder_is_not_a_wall():
    records = synthetic_records([1, 2, 3, 4, 5, 6])
    records[3]["seconds_per_step"] *= 2
    assert fit_setting(records).wall_batches(2048) == []


def test_setting_with_one_batch_size_is_skipped_with_a_warning():
    with pytest.warns(UserWarning, match="fewer than two healthy batch sizes"):
        assert fit_records(synthetic_records([4])).fits == ()


def test_sequence_lengths_generalise_to_an_uncalibrated_one():
    quadratic = lambda b, s: 8 * GIB + 0.5 * GIB * b * s / 2048 + 0.2 * GIB * b * (s / 2048) ** 2  # noqa: E731
    fits = fit_records(synthetic_records([1, 2, 4, 8], seq_lens=(512, 1024, 2048), memory=quadratic))
    fit = fits.lookup(SETTING.with_(seq_len=1536), "H200")
    assert fit.peak_allocated(6, 1536).mean == pytest.approx(quadratic(6, 1536), rel=0.02)


def test_one_sequence_length_does_not_claim_another():
    fits = fit_records(synthetic_records([1, 2, 4]))
    assert fits.lookup(SETTING, "H200") is not None
    assert fits.lookup(SETTING.with_(seq_len=4096), "H200") is None
    assert fits.lookup(SETTING, "A100-80GB") is None


def test_reserved_bound_is_wider_than_allocated_and_above_it():
    fit = fit_setting(synthetic_records([1, 2, 3, 4, 6, 8]))
    allocated, reserved = fit.peak_allocated(12, 2048), fit.peak_reserved(12, 2048)
    assert reserved.mean >= allocated.mean and reserved.upper >= reserved.mean
    assert reserved.upper - reserved.mean >= allocated.upper - allocated.mean


def test_reserved_overhead_grows_with_the_logits_the_unfused_loss_strands():
    """A 1 GiB gap at small batches says nothing about batch 31, where qwen2.5-0.5b's fp32 logits
    are 36 GiB: the H200 ladders left 0.35-0.92 of them reserved but unusable."""
    # the activation phase, at about qwen2.5-0.5b's measured 6.3 GiB a sample: no phase left unseen
    fit = fit_setting(synthetic_records([1, 2, 4], memory=lambda b, s: 7 * GIB + 6.3 * GIB * b * s / 2048))
    assert fit.overhead.step_blocks == 0
    logits = 31 * 2048 * 151936 * 4
    share = GIB / (4 * 2048 * 151936 * 4)  # the 1 GiB overhead at batch 4, per byte of its logits
    assert fit.peak_reserved(31, 2048).mean == pytest.approx(fit.peak_allocated(31, 2048).mean + share * logits)
    assert fit.peak_reserved(31, 2048).upper == pytest.approx(fit.peak_allocated(31, 2048).upper + 0.92 * logits)
    assert fit.peak_reserved(1, 2048).mean == pytest.approx(fit.peak_allocated(1, 2048).mean + GIB)


def test_fused_loss_keeps_the_constant_overhead():
    fit = fit_setting(synthetic_records([1, 2, 4], setting=SETTING.with_(liger=True)))
    assert fit.logit_bytes_per_token == 0
    assert fit.peak_reserved(31, 2048).upper == pytest.approx(fit.peak_allocated(31, 2048).upper + GIB)


@settings(max_examples=15, deadline=None)
@given(slopes=st.lists(st.floats(0.01, 3.0), min_size=2, max_size=2),
       noise=st.lists(st.floats(-0.02, 0.02), min_size=12, max_size=12),
       batch=st.integers(1, 64), seq=st.integers(256, 4096))
def test_memory_predictions_never_fall_as_batch_or_sequence_grows(slopes, noise, batch, seq):
    """Even from noisy, non-convex measurements at several lengths."""
    def memory(b, s):
        return GIB * (4 + slopes[0] * b * s / 1024 + slopes[1] * b * (s / 1024) ** 2) * (1 + noise[(b + s) % 12])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = fit_setting(synthetic_records([1, 2, 3, 5], seq_lens=(512, 1024, 2048), memory=memory))
    for predict in (fit.peak_allocated, fit.peak_reserved):
        here = predict(batch, seq)
        for bigger in (predict(batch + 1, seq), predict(batch, seq + 64)):
            assert bigger.mean >= here.mean - 1e-3 and bigger.upper >= here.upper - 1e-3


def test_cpu_timing_noise_at_the_top_is_not_an_allocator_wall():
    records = synthetic_records([1, 2, 3, 4, 5], device="cpu")
    records[-1]["seconds_per_step"] *= 2
    assert fit_setting(records).wall_batches(2048) == []


def test_launch_bound_small_batches_far_from_capacity_are_not_a_wall():
    """H200, small model: flat step time up to batch 8, then linear; half the card free."""
    times = {1: 0.25, 2: 0.20, 4: 0.22, 8: 0.25, 16: 0.34, 32: 0.58}
    fit = fit_setting(synthetic_records(list(times), seconds=lambda b, s: times[b]))
    assert fit.wall_batches(2048) == []
    assert fit.seconds_per_step(32, 2048).mean == pytest.approx(0.58, rel=0.05)


def test_compute_rate_from_other_settings_lifts_a_launch_bound_slope():
    """Batches 1-4 on a flat launch floor say nothing about the slope; other settings' ladders do."""
    floor = lambda b, s: max(0.3, 0.02 + 0.1 * b)  # noqa: E731 - launch-bound up to batch 2
    own = synthetic_records([1, 2, 3], seconds=floor)
    others = synthetic_records([8, 16, 32], seconds=floor, setting=SETTING.with_(gradient_checkpointing=False))
    rate = compute_rate_for("H200", ladder_slopes(others))
    plain, informed = fit_setting(own), fit_setting(own, rate)
    assert plain.seconds_per_step(16, 2048).mean < 0.8 * floor(16, 2048)
    assert informed.seconds_per_step(16, 2048).mean > plain.seconds_per_step(16, 2048).mean
    for record in own:  # the added line stays at or below every calibrated point
        assert informed.seconds_per_step(record["micro_batch"], 2048).mean == pytest.approx(
            plain.seconds_per_step(record["micro_batch"], 2048).mean, rel=1e-6)


def test_fits_keep_their_compute_rate_through_json(tmp_path):
    records = synthetic_records([1, 2, 3]) + synthetic_records([4, 8], setting=SETTING.with_(liger=True))
    fits = fit_records(records)
    assert all(fit.compute_rate is not None for fit in fits.fits)
    path = tmp_path / "fits.json"
    fits.save(path)
    assert FitSet.load(path).fits == fits.fits


@needs_external
def test_safe_batch_of_public_3090_ladder_is_safe_and_one_short():
    """Upper bound of reserved = allocated bound + the larger of the overhead seen and 0.92 of the
    fp32 logits; 2% of the card kept free. This ladder stranded only 0.19 of its logits, so the
    bound costs one batch here (5 fits, 6 ran out of memory)."""
    records = [r for r in load_external() if r["offload_optimizer"]]
    fit = fit_setting([r for r in records if r["micro_batch"] <= 3])
    assert fit_largest_safe_batch(fit, 2048, MemoryBudget(fit.capacity_bytes)) == 4


def test_an_unseen_activation_phase_carries_the_optimizer_steps_stranded_blocks():
    """Points flat in the optimizer step's phase (Llama-3.2-3B with checkpointing and Liger on the H200: 59.91 GiB
    from batch 1 to 16, then 25 GiB of freed step blocks the activations could not reuse): beyond the measured
    peak the reserved memory carries the step's height above the activation line; at the points it does not."""
    setting = Setting("llama-3.2-3b", gradient_checkpointing=True, liger=True)
    fit = fit_setting(synthetic_records([1, 2, 4], memory=lambda b, s: 59.91 * GIB, setting=setting))
    assert 15 * GIB < fit.overhead.step_blocks < 25 * GIB
    assert fit.peak_reserved(4, 2048).mean == pytest.approx(fit.peak_allocated(4, 2048).mean + GIB)
    large = fit.peak_allocated(64, 2048)
    assert large.mean > 1.1 * 59.91 * GIB
    assert fit.peak_reserved(64, 2048).mean == pytest.approx(large.mean + fit.overhead.step_blocks)


def test_degenerate_numbers_fit_without_numpy_warnings_reaching_the_user():
    """Step times of 1e-200 s underflowed the knot search's floor (log of 0), and a batch measured twice near the
    card's capacity divided a memory step by a zero batch step: both printed numpy's RuntimeWarning."""
    near_full = lambda b, s: (100 + 10 * b) * GIB  # noqa: E731 - within the wall zone of the 141 GiB card
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fit_setting(synthetic_records([1, 2, 3, 4, 5], seconds=lambda b, s: 1e-200 * b))
        twice = synthetic_records([1, 2, 3], memory=near_full) + synthetic_records([3], memory=near_full)
        fit_setting(twice)


def test_a_two_point_fit_widens_its_bound_with_the_distance_it_extrapolates():
    """Two batches fix a line exactly: the 2% floor alone let OLMoE's ladder of batches 1 and 2 plan batch 19 with
    its bound 2% above the mean. Three points keep the residual-based bound."""
    two = fit_setting(synthetic_records([1, 2], memory=lambda b, s: (20 + 5 * b) * GIB))
    near, far = two.peak_allocated(2, 2048), two.peak_allocated(20, 2048)
    assert near.upper / near.mean == pytest.approx(1.02, abs=0.005)
    assert far.upper / far.mean == pytest.approx(1 + 0.02 * 10, abs=0.01)
    three = fit_setting(synthetic_records([1, 2, 4], memory=lambda b, s: (20 + 5 * b) * GIB))
    assert three.peak_allocated(40, 2048).upper / three.peak_allocated(40, 2048).mean < 1.05
