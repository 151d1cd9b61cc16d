"""QLoRA's 4-bit base and bitsandbytes' 8-bit optimizers: bytes, setting key, and the trial's model."""

from __future__ import annotations

import hashlib
import json
import warnings

import pytest

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.settings import KEYLESS_DEFAULTS, Setting
from ftplan.models.bytes_per_param import NF4_BYTES, OPTIMIZER_STATE_BYTES
from ftplan.models.prior import memory_terms


def test_a_setting_without_quantization_keeps_the_key_records_were_written_with():
    setting = Setting("llama-3-8b", lora_rank=16)
    old = {k: v for k, v in setting.to_dict().items() if k not in KEYLESS_DEFAULTS}
    assert setting.key() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert setting.with_(quantization="nf4").key() != setting.key()


def test_nf4_with_double_quantization_costs_0_127_bits_of_constants_per_weight():
    assert (NF4_BYTES - 0.5) * 8 == pytest.approx(0.127, abs=5e-4)


def test_8bit_adamw_keeps_two_bytes_and_block_constants():
    assert OPTIMIZER_STATE_BYTES["paged_adamw_8bit"] == pytest.approx(2.03125)


def test_qlora_needs_lora_and_no_deepspeed():
    with pytest.raises(FtplanError, match="QLoRA"):
        Setting("llama-3-8b", quantization="nf4")
    with pytest.raises(FtplanError, match="QLoRA"):
        Setting("llama-3-8b", lora_rank=16, zero_stage=2, quantization="nf4")


def test_a_4bit_base_holds_its_linears_in_nf4_and_the_rest_in_fp32():
    arch, lora = load_architecture("llama-3-8b"), Setting("llama-3-8b", lora_rank=16)
    qlora = lora.with_(quantization="nf4")
    bf16, nf4 = memory_terms(arch, lora).backward_end, memory_terms(arch, qlora).backward_end
    linears = arch.linear_weight_params
    expected = nf4 - (bf16 - arch.params_total * 2) - (arch.params_total - linears) * 4
    assert expected == pytest.approx(linears * NF4_BYTES)
    assert nf4 < 0.55 * bf16  # Llama-3-8B: 1.05e9 embedding and lm_head parameters go fp32


def test_the_trial_builds_the_qlora_model_users_build():
    pytest.importorskip("bitsandbytes")
    from ftplan.calibration.trial import build_model

    setting = Setting("tiny-llama", lora_rank=8, quantization="nf4", gradient_checkpointing=True)
    model, arch = build_model(setting, "cpu")
    assert type(model.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
    assert model.get_nb_trainable_parameters()[0] == arch.lora_params(8)


def test_plan_offers_qlora_only_when_allowed():
    from ftplan.planner.api import plan

    allowed = plan("llama-3-8b", 1000, "H200", allow=("qlora",))
    assert any(c.setting.quantization == "nf4" for c in allowed.plan.candidates)
    assert not any(c.setting.quantization for c in plan("llama-3-8b", 1000, "H200").plan.candidates)


def test_a_qlora_setup_from_the_prior_says_its_dequantization_is_not_counted():
    """phi-4 on an H100 recommended 'ddp liger qlora16' from the prior at LoRA's step time, without a word."""
    from ftplan.planner.api import plan

    result = plan("phi-4", 10000, "H100", allow=("qlora",), training="lora").plan
    qlora = next(c for c in result.candidates if c.setting.quantization)
    assert qlora.best.source == "prior" and any("dequantizes each linear" in n for n in qlora.best.notes)


def test_qlora_on_a_mixture_of_experts_says_its_experts_stay_unquantized():
    """Its QLoRA setups needed about twice bf16 LoRA's memory with no line saying why."""
    from ftplan.planner.api import plan

    with pytest.warns(UserWarning, match=r"QLoRA on olmoe-1b-7b: .*9\d% of its parameters are fused experts"):
        plan("olmoe-1b-7b", 1000, "H200", allow=("qlora",), training="lora")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        plan("llama-3-8b", 1000, "H200", allow=("qlora",), training="lora")  # a dense model: nothing to say
