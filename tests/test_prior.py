"""The analytic prior: bytes per parameter against hand-computed cases, and the physics it must obey."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.core.architecture import load_architecture
from ftplan.core.hardware import find_gpu
from ftplan.store.records import build_record
from ftplan.core.settings import Setting
from ftplan.models.bytes_per_param import frozen_param_bytes, trainable_param_bytes
from ftplan.models.prior import (
    ComputeRate,
    LadderSlope,
    PriorConstants,
    fit_compute_rate,
    fit_constants,
    memory_terms,
    prior_estimate,
    setting_terms,
)

LLAMA_1B = load_architecture("llama-3.2-1b")
H200 = find_gpu("H200")


def _state_bytes(setting: Setting) -> float:
    b = trainable_param_bytes(setting)
    return b.weights + b.gradients + b.master_weights + b.optimizer_states


def test_trainer_mixed_precision_full_adamw_costs_16_bytes_per_param_without_master_copy():
    b = trainable_param_bytes(Setting("llama-3.2-1b"))
    assert (b.weights, b.gradients, b.master_weights, b.optimizer_states) == (4, 4, 0, 8)
    assert b.autocast_copies == 2  # bf16 copies of the fp32 weights live from forward to backward


def test_deepspeed_bf16_keeps_half_weights_and_grads_plus_fp32_master_and_moments():
    b = trainable_param_bytes(Setting("llama-3.2-1b", zero_stage=1))
    assert (b.weights, b.gradients, b.master_weights, b.optimizer_states) == (2, 2, 4, 8)


@pytest.mark.parametrize("stage, expected", [(1, 2 + 2 + 12 / 8), (2, 2 + (2 + 12) / 8), (3, 16 / 8)])
def test_zero_stages_partition_optimizer_then_gradients_then_weights(stage, expected):
    assert _state_bytes(Setting("llama-3.2-1b", zero_stage=stage, gpus=8)) == pytest.approx(expected)


def test_offload_moves_master_weights_and_moments_off_the_gpu():
    b = trainable_param_bytes(Setting("llama-3.2-1b", zero_stage=2, offload_optimizer=True))
    assert (b.master_weights, b.optimizer_states, b.step_temporaries) == (0, 0, 0)
    assert _state_bytes(Setting("llama-3.2-1b", zero_stage=2, offload_optimizer=True)) == 4


def test_plain_ddp_counts_gradients_twice_for_its_buckets():
    assert trainable_param_bytes(Setting("llama-3.2-1b", gpus=2)).gradients == 8


def test_frozen_lora_base_costs_only_its_storage():
    b = frozen_param_bytes(Setting("llama-3.2-1b", lora_rank=16))
    assert (b.gradients, b.master_weights, b.optimizer_states) == (0, 0, 0)


@pytest.mark.parametrize("cheaper", [
    Setting("llama-3.2-1b", lora_rank=16),
    Setting("llama-3.2-1b", zero_stage=2, offload_optimizer=True),
])
def test_lora_and_offload_shrink_model_states(cheaper):
    full = memory_terms(LLAMA_1B, Setting("llama-3.2-1b"))
    smaller = memory_terms(LLAMA_1B, cheaper)
    assert smaller.optimizer_step < full.optimizer_step / 2


@pytest.mark.parametrize("change, at_most", [({"liger": True}, 0.5), ({"gradient_checkpointing": True}, 0.6)])
def test_liger_and_checkpointing_shrink_per_sample_memory(change, at_most):
    base = Setting("llama-3.2-1b")
    assert memory_terms(LLAMA_1B, base.with_(**change)).per_sample < at_most * memory_terms(LLAMA_1B, base).per_sample


def test_liger_removes_the_logits_that_dominate_checkpointed_samples():
    checkpointed = Setting("llama-3.2-1b", gradient_checkpointing=True)
    with_liger = memory_terms(LLAMA_1B, checkpointed.with_(liger=True)).per_sample
    assert with_liger < memory_terms(LLAMA_1B, checkpointed).per_sample / 3


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_per_gpu_memory_shrinks_as_world_size_grows(stage):
    peaks = [prior_estimate(LLAMA_1B, Setting("llama-3.2-1b", zero_stage=stage, gpus=n), 4, H200).peak_allocated
             for n in (1, 2, 8)]
    assert peaks[0] > peaks[1] > peaks[2]


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 64), seq_len=st.integers(64, 8192), zero_stage=st.sampled_from([0, 1, 2, 3]),
       liger=st.booleans(), gc=st.booleans(), lora=st.sampled_from([0, 16]))
def test_memory_and_time_never_fall_as_batch_or_length_grow(batch, seq_len, zero_stage, liger, gc, lora):
    setting = Setting("llama-3.2-1b", seq_len=seq_len, zero_stage=zero_stage, liger=liger,
                      gradient_checkpointing=gc, lora_rank=lora)
    here = prior_estimate(LLAMA_1B, setting, batch, H200)
    for bigger in (prior_estimate(LLAMA_1B, setting, batch + 1, H200),
                   prior_estimate(LLAMA_1B, setting.with_(seq_len=seq_len + 64), batch, H200)):
        assert bigger.peak_allocated >= here.peak_allocated
        assert bigger.peak_reserved >= here.peak_reserved
        assert bigger.seconds_per_step > here.seconds_per_step


def test_full_fine_tuning_costs_one_extra_forward_of_flops_over_lora():
    full, lora = Setting("llama-3.2-1b"), Setting("llama-3.2-1b", lora_rank=16)
    matmul_params = LLAMA_1B.layers * LLAMA_1B.params_per_layer() + LLAMA_1B.vocab * LLAMA_1B.hidden
    extra = setting_terms(LLAMA_1B, full).flops_per_sample - setting_terms(LLAMA_1B, lora).flops_per_sample
    assert extra == 2 * matmul_params * 2048


def _records_from_prior(constants: PriorConstants) -> list[dict]:
    """Records the prior itself would produce with known constants: a fit must recover them."""
    records = []
    for setting in (Setting("llama-3.2-1b"), Setting("llama-3.2-1b", gradient_checkpointing=True),
                    Setting("qwen2.5-0.5b", zero_stage=2, offload_optimizer=True)):
        arch = load_architecture(setting.model)
        for batch in (1, 2, 4, 8):
            e = prior_estimate(arch, setting, batch, H200, constants)
            records.append(build_record(setting, batch, "ok", device="cuda", gpu_name="NVIDIA H200",
                                        peak_allocated_bytes=e.peak_allocated, peak_reserved_bytes=e.peak_reserved,
                                        seconds_per_step=e.seconds_per_step))
    return records


def test_fit_constants_recovers_the_constants_behind_the_records():
    truth = PriorConstants(static_scale=1.2, sample_scale=0.9, fragmentation=1.1, mfu=0.3,
                           cpu_adam_seconds_per_param=2e-9)
    fitted = fit_constants(_records_from_prior(truth))
    for name in ("static_scale", "sample_scale", "fragmentation", "mfu", "cpu_adam_seconds_per_param"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    assert fitted.n_records == 12


def test_without_records_the_documented_defaults_apply():
    assert fit_constants([]) == PriorConstants()


def test_frozen_lora_base_is_half_precision_without_autocast_copies_under_bf16():
    """H200 Llama-3-8B LoRA r16: ~15.6 GiB static for 8.0e9 parameters, i.e. 2 bytes each."""
    frozen = frozen_param_bytes(Setting("llama-3-8b", lora_rank=16))
    assert (frozen.resident, frozen.autocast_copies) == (2, 0)
    assert frozen_param_bytes(Setting("llama-3-8b", lora_rank=16, precision="fp32")).resident == 4


def test_compute_rate_tells_loss_traffic_from_mfu_only_with_fused_and_unfused_ladders():
    truth = ComputeRate(mfu=0.4, loss_bytes_per_logit=60.0, n_ladders=0)
    settings = [Setting("qwen2.5-0.5b"), Setting("qwen2.5-0.5b", liger=True), Setting("llama-3.2-1b"),
                Setting("llama-3.2-1b", liger=True)]
    ladders = [LadderSlope(load_architecture(s.model), s, H200,
                           truth.seconds_per_sample(load_architecture(s.model), s, H200)) for s in settings]
    fitted = fit_compute_rate(ladders)
    assert (fitted.mfu, fitted.loss_bytes_per_logit) == (pytest.approx(0.4), pytest.approx(60.0))
    unfused_only = fit_compute_rate([ladder for ladder in ladders if not ladder.setting.liger])
    assert unfused_only.loss_bytes_per_logit == 0.0  # not identifiable: MFU alone


def test_zero3_buffers_follow_deepspeeds_defaults():
    """The IPG bucket (5e8 half-precision elements) and the largest gathered module: Llama-3-8B's untied
    embedding and lm_head (2 × 128256 × 4096) plus one layer and the 5e7 prefetch, under the 1e9 live cap."""
    from ftplan.models.prior import zero3_buffer_bytes

    arch = load_architecture("llama-3-8b")
    expected = 5e8 * 2 + min(1e9, 2 * 128256 * 4096 + arch.params_per_layer() + 5e7) * 2
    assert zero3_buffer_bytes(arch, Setting("llama-3-8b", zero_stage=3, gpus=8)) == expected
    lora = zero3_buffer_bytes(arch, Setting("llama-3-8b", zero_stage=3, lora_rank=16))
    assert lora < expected  # the bucket never exceeds the trainable parameters


def _timed(setting: Setting, batch: int, seconds: float) -> dict:
    return build_record(setting, batch, "ok", gpu_name="NVIDIA H200", seconds_per_step=seconds,
                        peak_allocated_bytes=1e9)


def test_masked_attention_cost_is_what_padded_masked_batches_add_per_attention_flop():
    """Pairs of one setting and batch, padded and masked against equal-length rows: the line through the origin
    of their extra seconds over the masked attention FLOPs' time at peak gives back the cost it was made with."""
    from ftplan.models.prior import fit_masked_attention_cost, masked_attention_flops

    cost, records = 5.0, []
    for model in ("qwen2.5-0.5b", "llama-3.2-1b", "qwen1.5-0.5b"):  # query/KV head ratios 7, 4 and 1
        plain = Setting(model)
        padded = plain.with_(padding="max_length")
        for batch in (4, 8):
            extra = cost * masked_attention_flops(load_architecture(model), padded) * batch / (H200.bf16_dense_tflops * 1e12)
            records += [_timed(plain, batch, 0.1 * batch), _timed(padded, batch, 0.1 * batch + extra)]
    assert fit_masked_attention_cost(records) == pytest.approx(cost)
    assert fit_masked_attention_cost(records[:4]) == 0.0  # two pairs: too few to price the path
    assert masked_attention_flops(LLAMA_1B, Setting("llama-3.2-1b")) == 0  # no mask reaches SDPA
    assert masked_attention_flops(LLAMA_1B, Setting("llama-3.2-1b", padding="longest", attention="flash_attention_2")) == 0


def test_masked_run_is_priced_slower_than_the_same_rows_unmasked():
    constants = PriorConstants(masked_attention_cost=5.0)
    plain = prior_estimate(LLAMA_1B, Setting("llama-3.2-1b"), 8, H200, constants)
    masked = prior_estimate(LLAMA_1B, Setting("llama-3.2-1b", padding="longest"), 8, H200, constants)
    assert masked.seconds_per_step > plain.seconds_per_step
    assert masked.peak_allocated > plain.peak_allocated  # K/V expanded to every query head


def test_a_packed_micro_batch_adds_the_flattened_sequences_mask_and_attention_as_measured_on_the_h200():
    """benchmarks/gpu/packed_path.py, 2026-12-04: k rows packed and flattened against the same rows padded, one
    training step each; what packing added to peak allocated memory is the prior's extra to within 2%, and at 8 rows
    its step time to within 5%, with the flattened kernel's slowdown those rows imply (the masked path's cost is
    fitted on padded batches; without the slowdown the extra was 9-11% short)."""
    import json
    import statistics
    from pathlib import Path

    from benchmarks.gpu.packed_path import MIN_ROWS_FOR_SLOWDOWN, implied_slowdowns
    from ftplan.evidence.workspace import Workspace
    from ftplan.models.prior import FLATTENED_MASK_SLOWDOWN, packed_attention_extra

    rows = [json.loads(line) for line in
            (Path(__file__).parents[1] / "benchmarks/gpu/results/packed_path_h200.jsonl").read_text().splitlines()]
    for row in (r for r in rows if r["k"] > 1):
        setting = Setting(row["model"], seq_len=row["seq"], padding="packed")
        extra, flops = packed_attention_extra(load_architecture(row["model"]), setting, row["k"])
        assert extra == row["prior_extra_bytes"]
        assert row["packed_bytes"] - row["padded_bytes"] == pytest.approx(extra, rel=0.02)
        constants = Workspace.open("H200").predictor.constants_for(row["model"])
        added = ComputeRate(constants.mfu, 0.0, 0, constants.masked_attention_cost).packed_seconds(flops, H200)
        if row["k"] >= MIN_ROWS_FOR_SLOWDOWN:  # below, the launch-bound floor hides the extra
            assert row["packed_seconds"] - row["padded_seconds"] == pytest.approx(added, rel=0.05)
    slowdowns = [slowdown for *_, slowdown in implied_slowdowns()]
    assert len(slowdowns) >= 2 and FLATTENED_MASK_SLOWDOWN == pytest.approx(statistics.mean(slowdowns), abs=0.02)
    one = Setting("qwen2.5-0.5b", padding="packed")
    assert packed_attention_extra(load_architecture("qwen2.5-0.5b"), one, 1) == (0.0, 0.0)  # one row: as padded
    flash = one.with_(attention="flash_attention_2")
    assert packed_attention_extra(load_architecture("qwen2.5-0.5b"), flash, 8) == (0.0, 0.0)  # varlen rows


def test_a_relative_never_predicts_less_reserved_than_allocated_memory():
    """A fit moved far along the sequence length (2,048 to 64 tokens) by the prior's change once came out at 1.5 GiB
    reserved against 28 allocated; the allocator cannot hold less than it hands out."""
    from ftplan.evidence.workspace import Workspace

    workspace = Workspace.open("H200")
    for seq, batch in ((64, 100), (128, 8), (2048, 8)):
        prediction = workspace.predict(Setting(model="llama-3.2-1b", seq_len=seq, liger=True, padding="packed"), batch)
        assert prediction.peak_reserved.mean >= prediction.peak_allocated.mean
        assert prediction.peak_reserved.upper >= prediction.peak_allocated.upper


def test_the_gradients_accumulation_keeps_are_what_an_accumulating_rehearsal_added_on_the_h100():
    """12 x 2 against 12 x 1 of the same emitted packed folder (Qwen2.5-0.5B full): the second micro-step holds
    every fp32 gradient on top of the first's peak."""
    import json
    from pathlib import Path

    from ftplan.models.prior import accumulated_gradient_bytes

    results = Path(__file__).parents[1] / "benchmarks/gpu/results/emitted_runs_pack_whole_rows_h100.jsonl"
    runs = {(r["micro_batch"], r["accumulation"]): r for r in map(json.loads, results.read_text().splitlines())
            if r["status"] == "ok"}
    added = runs[12, 2]["peak_allocated_bytes"] - runs[12, 1]["peak_allocated_bytes"]
    setting = Setting.from_dict(runs[12, 2])
    assert added == pytest.approx(accumulated_gradient_bytes(load_architecture(setting.model), setting), rel=0.03)
    assert accumulated_gradient_bytes(load_architecture(setting.model), setting.with_(zero_stage=2)) == 0.0
