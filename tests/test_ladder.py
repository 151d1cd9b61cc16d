"""The batch-size ladder finds the largest fitting batch exactly and resumes without repeating a trial."""

from hypothesis import given
from hypothesis import strategies as st

from ftplan.calibration.ladder import largest_fitting, next_step, remaining_estimate


def walk(fits_up_to: int, max_batch: int, known: dict | None = None, batch_sizes=None) -> tuple[list[int], dict]:
    """Run the ladder against a machine where batches up to fits_up_to fit; return batches tried."""
    outcomes = dict(known or {})
    tried = []
    while (batch := next_step(outcomes, max_batch, batch_sizes).batch) is not None:
        assert batch not in outcomes, f"batch {batch} repeated"
        tried.append(batch)
        outcomes[batch] = "ok" if batch <= fits_up_to else "oom"
    return tried, outcomes


def test_doubles_until_the_first_oom_then_bisects_the_gap():
    tried, outcomes = walk(fits_up_to=5, max_batch=1024)
    assert tried == [1, 2, 4, 8, 6, 5]
    assert largest_fitting(outcomes) == 5


def test_stops_at_max_batch_when_nothing_runs_out_of_memory():
    assert walk(fits_up_to=10**6, max_batch=10)[0] == [1, 2, 4, 8, 10]


def test_batch_one_not_fitting_ends_the_ladder():
    tried, outcomes = walk(fits_up_to=0, max_batch=64)
    assert tried == [1] and largest_fitting(outcomes) is None
    assert next_step(outcomes, 64).reason == "done: batch 1 does not fit"


def test_an_error_stops_the_ladder_and_is_not_taken_for_an_oom():
    step = next_step({1: "ok", 2: "error"}, 64)
    assert step.batch is None and "batch 2 failed with an error (not an OOM)" in step.reason
    assert largest_fitting({1: "ok", 2: "error"}) == 1


def test_listed_batch_sizes_replace_the_ladder_and_skip_sizes_above_an_oom():
    tried, _ = walk(fits_up_to=3, max_batch=1024, batch_sizes=[1, 2, 4, 8, 3])
    assert tried == [1, 2, 4, 3]
    assert next_step({1: "ok", 2: "ok", 4: "oom", 3: "ok"}, 1024, [1, 2, 4, 8, 3]).reason.startswith("done: skipped 8")


@given(fits_up_to=st.integers(0, 300), max_batch=st.integers(1, 256))
def test_the_ladder_always_finds_the_exact_largest_fitting_batch(fits_up_to, max_batch):
    tried, outcomes = walk(fits_up_to, max_batch)
    assert largest_fitting(outcomes) == (min(fits_up_to, max_batch) or None)
    assert max(tried) <= max_batch


@given(fits_up_to=st.integers(0, 300), max_batch=st.integers(1, 256), killed_after=st.integers(0, 20))
def test_resuming_from_any_point_continues_the_same_ladder_without_repeats(fits_up_to, max_batch, killed_after):
    full, _ = walk(fits_up_to, max_batch)
    known = {b: ("ok" if b <= fits_up_to else "oom") for b in full[:killed_after]}
    rest, _ = walk(fits_up_to, max_batch, known)
    assert full[:killed_after] + rest == full


@given(fits_up_to=st.integers(0, 300), max_batch=st.integers(1, 256))
def test_remaining_estimate_never_undercounts_once_the_first_oom_is_known(fits_up_to, max_batch):
    tried, outcomes = walk(fits_up_to, max_batch)
    first_oom = next((i for i, b in enumerate(tried) if b > fits_up_to), len(tried) - 1)
    known = {b: outcomes[b] for b in tried[:first_oom + 1]}
    left = len(tried) - first_oom - 1
    assert left <= remaining_estimate(known, max_batch) <= left + 1


def test_remaining_estimate_before_any_trial_counts_the_doubling_ladder():
    assert remaining_estimate({}, 8) == 4
    assert remaining_estimate({}, 10) == 5
    assert remaining_estimate({1: "ok", 2: "error"}, 8) == 0
