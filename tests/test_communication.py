"""The data-parallel time model obeys its own limits, and links come from the catalog or from records."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting
from ftplan.models.communication.collectives import allreduce_seconds, collective_seconds
from ftplan.models.communication.estimates import estimate_overlap, step_time_cv
from ftplan.models.communication.links import Links, calibrated_links, find_link, links_from_catalog, parse_bandwidth
from ftplan.models.communication.step import data_parallel_step_seconds, expected_max_normal
from ftplan.models.communication.traffic import DEFAULT_OVERLAP, communication_seconds, step_traffic

LLAMA_7B = load_architecture("llama-2-7b")
FULL = Setting("llama-2-7b")
LORA = Setting("llama-2-7b", lora_rank=16)
CLOUD = links_from_catalog("nvlink4", "cloud")

bandwidths = st.floats(0.05, 500)
latencies = st.floats(0, 1e-3)
counts = st.integers(1, 16)
byte_counts = st.integers(0, 30 * 10**9)


def links(intra=450.0, inter=0.6, intra_lat=3e-6, inter_lat=2.5e-4, host=31.5) -> Links:
    return Links(intra, inter, intra_lat, inter_lat, host)


def traffic(setting):
    return step_traffic(setting, LLAMA_7B.params_total, LLAMA_7B.trainable_params(setting.lora_rank))


@settings(max_examples=200, deadline=None)
@given(compute=st.floats(0.01, 100), nbytes=byte_counts, per_node=counts, nodes=counts,
       overlap=st.floats(0, 1), cv=st.floats(0, 0.5), gathered=byte_counts)
def test_efficiency_never_exceeds_one(compute, nbytes, per_node, nodes, overlap, cv, gathered):
    one = data_parallel_step_seconds(compute, nbytes, 1, 1, CLOUD, overlap, cv, gathered_parameter_bytes=gathered)
    many = data_parallel_step_seconds(compute, nbytes, per_node, nodes, CLOUD, overlap, cv, gathered_parameter_bytes=gathered)
    assert many >= one * (1 - 1e-12)  # efficiency = one / many <= 1


@settings(max_examples=200, deadline=None)
@given(nbytes=byte_counts, per_node=counts, nodes=counts, slow=bandwidths, factor=st.floats(1, 100),
       which=st.sampled_from(["intra", "inter"]))
def test_more_bandwidth_is_never_slower(nbytes, per_node, nodes, slow, factor, which):
    base = links(**{which: slow})
    faster = links(**{which: slow * factor})
    assert allreduce_seconds(nbytes, per_node, nodes, faster) <= allreduce_seconds(nbytes, per_node, nodes, base)


@settings(max_examples=200, deadline=None)
@given(nbytes=byte_counts, per_node=counts, nodes=counts, low=latencies, extra=latencies,
       which=st.sampled_from(["intra_lat", "inter_lat"]), passes=st.sampled_from([1, 2]))
def test_more_latency_is_never_faster(nbytes, per_node, nodes, low, extra, which, passes):
    quick, slow = links(**{which: low}), links(**{which: low + extra})
    assert collective_seconds(nbytes, passes, per_node, nodes, slow) >= collective_seconds(nbytes, passes, per_node, nodes, quick)


@given(compute=st.floats(0.01, 100), nbytes=byte_counts, cv=st.floats(0, 1))
def test_one_gpu_spends_nothing_on_communication(compute, nbytes, cv):
    assert data_parallel_step_seconds(compute, nbytes, 1, 1, CLOUD, overlap=0.0, step_time_cv=cv) == compute


def test_lora_traffic_is_a_small_fraction_of_full_traffic():
    full, lora = traffic(FULL), traffic(LORA)
    assert lora.gradient_bytes * 100 < full.gradient_bytes
    assert allreduce_seconds(lora.gradient_bytes, 8, 16, CLOUD) * 100 < allreduce_seconds(full.gradient_bytes, 8, 16, CLOUD)


def test_zero3_moves_three_times_the_parameters_where_an_allreduce_moves_two():
    zero2 = step_traffic(Setting("llama-2-7b", zero_stage=2), LLAMA_7B.params_total, LLAMA_7B.params_total)
    zero3 = step_traffic(Setting("llama-2-7b", zero_stage=3), LLAMA_7B.params_total, LLAMA_7B.params_total)
    no_latency = links(intra_lat=0, inter_lat=0)
    ratio = communication_seconds(zero3, 8, 4, no_latency) / communication_seconds(zero2, 8, 4, no_latency)
    assert ratio == pytest.approx(1.5, rel=1e-3)  # NCCL's base latency per collective aside


def test_lora_under_zero3_still_gathers_every_frozen_weight():
    lora3 = step_traffic(Setting("llama-2-7b", zero_stage=3, lora_rank=16), LLAMA_7B.params_total,
                         LLAMA_7B.trainable_params(16))
    assert lora3.gathered_parameter_bytes == LLAMA_7B.params_total * 2


def test_gradients_travel_in_fp32_under_plain_ddp_and_half_precision_under_deepspeed():
    params = LLAMA_7B.params_total
    assert step_traffic(FULL, params, params).gradient_bytes == 4 * params
    assert step_traffic(FULL.with_(zero_stage=2), params, params).gradient_bytes == 2 * params


def test_tree_keeps_latency_logarithmic_for_small_messages_at_many_nodes():
    lat = 1e-4
    one_gpu_nodes = links(inter=1.0, inter_lat=lat)
    seconds = allreduce_seconds(1024, 1, 128, one_gpu_nodes)
    assert seconds < 2 * 127 * lat / 4  # a ring would pay 2(N-1) hops
    assert seconds >= 2 * math.log2(128) * lat


def test_large_messages_cost_the_ring_bandwidth_term():
    nbytes = 10**10
    seconds = allreduce_seconds(nbytes, 8, 1, links(intra=100.0, intra_lat=0))
    assert seconds == pytest.approx(2 * 7 / 8 * nbytes / 100e9, rel=1e-3)


def test_overlap_hides_communication_only_up_to_the_backward_pass():
    nbytes = 10**9
    exposed = data_parallel_step_seconds(1.0, nbytes, 8, 4, CLOUD, overlap=0.0)
    hidden = data_parallel_step_seconds(1.0, nbytes, 8, 4, CLOUD, overlap=1.0)
    assert 0 < exposed - hidden <= 2 / 3


def test_stragglers_follow_the_expected_maximum_of_step_times():
    step = data_parallel_step_seconds(1.0, 0, 8, 16, CLOUD, overlap=0.0, step_time_cv=0.1)
    assert step == pytest.approx(1 + 0.1 * expected_max_normal(128))
    assert 1 + 0.1 * 2.5 < step < 1 + 0.1 * math.sqrt(2 * math.log(128))


def test_cpu_offload_adds_each_ranks_share_of_host_transfers():
    plain = data_parallel_step_seconds(1.0, 0, 4, 1, CLOUD, 0.0)
    offload = data_parallel_step_seconds(1.0, 0, 4, 1, CLOUD, 0.0, offloaded_bytes=4 * 31.5 * 10**9)
    assert offload - plain == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs", [{"overlap": 1.5}, {"overlap": -0.1}, {"step_time_cv": -1.0}])
def test_bad_model_parameters_are_one_line_errors(kwargs):
    arguments = {"overlap": 0.0, **kwargs}
    with pytest.raises(FtplanError):
        data_parallel_step_seconds(1.0, 10, 2, 1, CLOUD, **arguments)


def test_links_reject_non_positive_bandwidth():
    with pytest.raises(FtplanError, match="positive"):
        links(inter=0.0)


def test_catalog_links_are_found_by_the_gpu_catalogs_interconnect_text():
    assert find_link("NVLink 4 (900 GB/s bidirectional)").bandwidth_gbs == 450
    assert find_link("PCIe 4.0 x16").name == "pcie4-x16"
    with pytest.raises(FtplanError, match="did you mean"):
        find_link("nvlnk4")


@pytest.mark.parametrize("text, gbs", [("600MB/s", 0.6), ("25Gbit/s", 3.125), ("100Gbps", 12.5), ("0.6", 0.6),
                                       ("1.2 GB/s", 1.2), ("cloud", 0.625), ("10GbE", 1.25)])
def test_bandwidth_text_is_read_in_gigabytes_per_second(text, gbs):
    assert parse_bandwidth(text) == pytest.approx(gbs)


@pytest.mark.parametrize("text", ["fast", "-3GB/s", "0MB/s", ""])
def test_unreadable_bandwidth_is_a_one_line_error(text):
    with pytest.raises(FtplanError):
        parse_bandwidth(text)


def test_calibrated_links_replace_only_what_was_measured():
    intra = {"backend": "nccl", "ranks": 8, "nodes": 1, "ranks_per_node": 8, "bandwidth_gbs": 300.0,
             "latency_s": 5e-6, "timestamp": "2025-01-01T00:00:00+00:00"}
    loopback = {**intra, "backend": "gloo", "bandwidth_gbs": 0.2, "timestamp": "2025-02-01T00:00:00+00:00"}
    measured = calibrated_links([intra, loopback], CLOUD)
    assert (measured.intra_node_gbs, measured.inter_node_gbs, measured.source) == (300.0, CLOUD.inter_node_gbs, "calibrated")
    assert calibrated_links([loopback], CLOUD) == CLOUD


def test_step_time_spread_pools_every_records_deviations_from_its_own_mean():
    records = [{"status": "ok", "step_seconds": [1.0, 1.2, 0.8]}, {"status": "ok", "step_seconds": [2.0, 2.0, 2.0]},
               {"status": "ok", "step_seconds": [1.0, 3.0, 2.0]}, {"status": "oom", "step_seconds": [9.0, 1.0, 5.0]}]
    assert step_time_cv(records) == pytest.approx(math.sqrt((0.04 + 0.04 + 0.25 + 0.25) / 6))
    assert step_time_cv([]) == 0.0


def _record(setting: Setting, seconds: float, batch: int = 4) -> dict:
    params = LLAMA_7B.params_total
    return {**setting.to_dict(), "setting_key": setting.key(), "micro_batch": batch, "status": "ok",
            "seconds_per_step": seconds, "params_total": params, "params_trainable": params}


def test_overlap_is_recovered_from_multi_gpu_against_single_gpu_records():
    single, multi = FULL.with_(zero_stage=2), FULL.with_(zero_stage=2, gpus=8)
    nvlink = links_from_catalog("nvlink4", "cloud")
    params = LLAMA_7B.params_total
    expected = data_parallel_step_seconds(2.0, step_traffic(multi, params, params).gradient_bytes, 8, 1, nvlink, 0.4)
    estimate = estimate_overlap([_record(single, 2.0), _record(multi, expected)], nvlink)
    assert estimate.pairs == 1
    assert estimate.overlap == pytest.approx(0.4)


def test_without_multi_gpu_records_no_overlap_is_assumed():
    estimate = estimate_overlap([_record(FULL, 2.0)], CLOUD)
    assert (estimate.overlap, estimate.pairs) == (DEFAULT_OVERLAP, 0)
    assert "default" in estimate.source


def test_a_cpu_calibration_never_sets_the_gpu_ranks_spread(tmp_path):
    """A busy host's CPU ladder in ./calibrations/ raised the pooled cv from 0.034 and slowed an 8-GPU Mixtral
    plan on the H200 by 9%: a CPU's steps say nothing of how GPU ranks straggle."""
    from ftplan.core.paths import calibrations_dir
    from ftplan.evidence.workspace import Workspace
    from ftplan.store.records import build_record

    shipped = Workspace.open("H200").links.step_time_cv
    noisy = [build_record(Setting("tiny-llama", seq_len=256, precision="fp32"), batch, "ok", device="cpu",
                          gpu_name="cpu", gpu_memory_total_bytes=24 * 2**30, peak_allocated_bytes=2**30,
                          peak_reserved_bytes=2**30, seconds_per_step=1.5, num_alloc_retries=0,
                          step_seconds=[2.5, 1.9, 1.1, 0.7]) for batch in (1, 2, 4)]
    (tmp_path / "cpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in noisy))
    with_cpu = Workspace.open("H200", [*sorted(calibrations_dir().glob("*.jsonl")), tmp_path / "cpu.jsonl"])
    assert with_cpu.links.step_time_cv == pytest.approx(shipped) and shipped < 0.1
    assert Workspace.open("cpu", [tmp_path / "cpu.jsonl"]).links.step_time_cv > 0.3
