"""The prior's LoRA adapter traffic is PEFT's own: one adapted linear's forward and backward under the recipe's
bf16 autocast, recounted through torch's dispatcher, bytes per token beyond the frozen base matmul."""

from __future__ import annotations

import pytest

from ftplan.core.architecture import load_architecture
from ftplan.core.settings import Setting
from ftplan.models.traffic import LORA_BACKWARD_BYTES, LORA_FORWARD_BYTES, lora_adapter_bytes

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")


def _traffic(fan_in: int, fan_out: int, tokens: int, rank: int, lora: bool) -> tuple[int, int]:
    """(forward, backward) bytes the ops read and write through one bias-free bf16 linear, adapted by PEFT's LoRA
    or not, under CPU bf16 autocast as the Trainer's bf16 runs it."""
    from tests.dispatch_traffic import Traffic

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(fan_in, fan_out, bias=False)

        def forward(self, x):
            return self.proj(x)

    torch.manual_seed(0)
    model = Block().to(torch.bfloat16)
    if lora:
        model = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["proj"]))
    x = torch.randn(1, tokens, fan_in, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), Traffic() as forward:
        y = model(x)
    with Traffic() as backward:
        y.backward(torch.ones_like(y))
    return forward.bytes, backward.bytes


def _per_token(fan_in: int, fan_out: int, rank: int) -> tuple[float, float]:
    """LoRA's bytes per token beyond the base linear's: differences at two lengths cancel per-step terms."""
    def extra(tokens: int) -> tuple[int, int]:
        adapted, base = _traffic(fan_in, fan_out, tokens, rank, True), _traffic(fan_in, fan_out, tokens, rank, False)
        return adapted[0] - base[0], adapted[1] - base[1]

    (f1, b1), (f2, b2) = extra(32), extra(64)
    return (f2 - f1) / 32, (b2 - b1) / 32


@pytest.mark.parametrize("fan_in,fan_out,rank", [(64, 96, 16), (128, 96, 16), (64, 192, 8), (256, 128, 32)])
def test_a_lora_linear_moves_what_the_prior_counts(fan_in, fan_out, rank):
    dims = (fan_in, fan_out, rank)
    assert _per_token(*dims) == (sum(c * d for c, d in zip(LORA_FORWARD_BYTES, dims)),
                                 sum(c * d for c, d in zip(LORA_BACKWARD_BYTES, dims)))


def test_adapter_traffic_counts_every_adapted_linear_and_checkpointing_runs_the_forward_twice():
    arch = load_architecture("phi-3-mini-4k")  # fused qkv_proj and gate_up_proj: all-linear adapts those
    lora = Setting("phi-3-mini-4k", lora_rank=16)
    assert lora_adapter_bytes(arch, lora.with_(lora_rank=0)) == 0
    per_layer = {name: (fan_in, fan_out) for name, fan_in, fan_out in
                 [("qkv_proj", 3072, 9216), ("o_proj", 3072, 3072), ("gate_up_proj", 3072, 16384),
                  ("down_proj", 8192, 3072)]}

    def per_token(forward_passes: int) -> int:
        return arch.layers * sum((forward_passes * f + b) * d for fan_in, fan_out in per_layer.values()
                                 for f, b, d in zip(LORA_FORWARD_BYTES, LORA_BACKWARD_BYTES, (fan_in, fan_out, 16)))

    assert lora_adapter_bytes(arch, lora) == per_token(1) * lora.seq_len
    assert lora_adapter_bytes(arch, lora.with_(gradient_checkpointing=True)) == per_token(2) * lora.seq_len
