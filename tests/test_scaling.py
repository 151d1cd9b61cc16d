"""Scaling tables: speed-up and efficiency per GPU count, the GPU count to rent, and the range parser."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.cli.plots import plot_scaling
from ftplan.core.errors import FtplanError
from ftplan.models.communication.links import Links, links_from_catalog
from ftplan.models.scaling import (
    choose_gpu_count,
    node_layout,
    parse_gpu_counts,
    scaling_table,
    with_eta,
)

CLOUD = links_from_catalog("nvlink4", "cloud")
FULL_7B_BYTES = 6_738_415_616 * 2
LORA_7B_BYTES = 39_976_960 * 2


def table(gradient_bytes: int, links: Links = CLOUD, counts=(1, 8, 32, 128), seconds: float = 1.0):
    return scaling_table(seconds, gradient_bytes, micro_batch=4, gpu_counts=list(counts), gpus_per_node=8, links=links)


@pytest.mark.parametrize("text, counts", [("8", [8]), ("1,2,4,8", [1, 2, 4, 8]), ("8,1,8", [1, 8]),
                                          ("1..128", [1, 2, 4, 8, 16, 32, 64, 128]), ("3..20", [3, 6, 12, 20]),
                                          ("1..8,12", [1, 2, 4, 8, 12]), ("4..4", [4])])
def test_gpu_counts_read_single_values_lists_and_doubling_ranges(text, counts):
    assert parse_gpu_counts(text) == counts


@pytest.mark.parametrize("text", ["", "0", "-8", "8..1", "0..8", "1...8", "two", "1,,2", "2.5"])
def test_unreadable_gpu_counts_are_one_line_errors(text):
    with pytest.raises(FtplanError) as error:
        parse_gpu_counts(text)
    assert "\n" not in str(error.value)


def test_nodes_fill_up_before_new_ones_are_added():
    assert node_layout(1, 8) == (1, 1)
    assert node_layout(8, 8) == (8, 1)
    assert node_layout(12, 8) == (6, 2)
    assert node_layout(128, 8) == (8, 16)


def test_one_gpu_is_the_baseline_of_speedup():
    row = table(FULL_7B_BYTES).iloc[0]
    assert (row["gpus"], row["speedup"], row["efficiency"]) == (1, 1.0, 1.0)


def test_lora_scales_far_better_than_full_fine_tuning_over_a_slow_network():
    full, lora = table(FULL_7B_BYTES).set_index("gpus"), table(LORA_7B_BYTES).set_index("gpus")
    assert full.loc[128, "efficiency"] < 0.1
    assert lora.loc[128, "efficiency"] > 5 * full.loc[128, "efficiency"]


@settings(max_examples=60, deadline=None)
@given(seconds=st.floats(0.01, 60), nbytes=st.integers(0, 3 * 10**10), inter=st.floats(0.05, 100))
def test_efficiency_stays_within_zero_and_one(seconds, nbytes, inter):
    links = Links(450.0, inter, 3e-6, 1e-4, 31.5)
    result = table(nbytes, links, counts=(1, 2, 8, 24, 128), seconds=seconds)
    assert ((result["efficiency"] > 0) & (result["efficiency"] <= 1 + 1e-12)).all()
    assert (result["samples_per_second"] == 4 * result["gpus"] / result["seconds_per_step"]).all()


def test_eta_bills_every_gpu_for_the_whole_run():
    eta = with_eta(table(LORA_7B_BYTES, counts=(1, 8)), dataset_size=10_000, epochs=2, price_per_gpu_hour=3.0)
    one = eta.iloc[0]
    assert one["steps"] == 5000 and one["hours"] == pytest.approx(5000 / 3600)
    assert one["cost"] == pytest.approx(one["hours"] * 3.0)


def test_without_a_deadline_the_run_that_finishes_first_is_chosen():
    choice = choose_gpu_count(table(LORA_7B_BYTES), 100_000, 1, price_per_gpu_hour=2.0)
    assert choice["gpus"] == 128


def test_ranked_by_cost_without_a_deadline_the_cheapest_count_is_chosen():
    """--by cost was ignored among GPU counts: 8 GPUs of full fine-tuning (17.25) over 1 GPU of LoRA (16.01)."""
    counts = table(LORA_7B_BYTES, counts=(1, 2, 4, 8, 16, 32, 64, 128))
    eta = with_eta(counts, 100_000, 1, 2.0)
    choice = choose_gpu_count(counts, 100_000, 1, 2.0, by="cost")
    assert choice["cost"] == eta["cost"].min() and choice["gpus"] != 128


def test_with_a_deadline_the_cheapest_count_that_meets_it_is_chosen():
    counts = table(LORA_7B_BYTES, counts=(1, 2, 4, 8, 16, 32, 64, 128))
    eta = with_eta(counts, 100_000, 1, 2.0).set_index("gpus")
    deadline = eta.loc[8, "hours"] * 1.01  # 8 GPUs just make it; fewer do not, more cost more
    choice = choose_gpu_count(counts, 100_000, 1, 2.0, max_hours=deadline)
    assert choice["gpus"] == 8
    assert choice["cost"] == eta.loc[eta["hours"] <= deadline, "cost"].min()


def test_an_impossible_deadline_names_the_fastest_option():
    with pytest.raises(FtplanError, match=r"no GPU count finishes within 0.01 h; the fastest, \d+ GPUs"):
        choose_gpu_count(table(FULL_7B_BYTES), 1_000_000, 3, 2.0, max_hours=0.01)


def test_scaling_plot_is_written_as_png(tmp_path):
    path = plot_scaling({"full": table(FULL_7B_BYTES), "LoRA r16": table(LORA_7B_BYTES)}, tmp_path / "plots" / "scaling.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
