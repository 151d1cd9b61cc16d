"""What a FLOP count misses: bytes that eager attention's scores and PEFT's LoRA adapters move, and the adapters'
per-step launches.

Both run elementwise passes and thin matmuls whose time is set by memory bandwidth, not by the matmul
throughput the prior's MFU prices, so they move with the card's bandwidth (an H100 has 0.70 of an H200's at
the same bf16 peak). The bytes are counted op by op in transformers' and PEFT's code; tests/test_eager_traffic.py
and tests/test_lora_traffic.py recount them through torch's dispatcher on the installed libraries.
"""

from __future__ import annotations

from ftplan.core.architecture import EXPERTS_TARGET, Architecture
from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.structure import Linear

# Bytes each element of eager attention's (batch, heads, seq, seq) scores moves through memory, counted op by op in
# transformers' eager_attention_forward (llama's; gemma2's adds the softcap): forward, the QK product writes the
# scores in bf16 (2), the scaling multiply reads and writes them (4), the mask add (4), softmax's fp32 upcast
# (2 + 4), softmax (4 + 4), the downcast (4 + 2), the PV product reads them (2): 32. Backward: the PV product's
# gradient writes dP and its weight gradient reads P (4), the downcast's and upcast's gradients (6 + 6), softmax's
# backward reads the gradient and the output and writes in fp32 (12), the scaling's (4), the QK product's two
# gradients read dS (4): 36. Softcapping (divide, tanh, multiply) adds 12 forward and 14 backward (tanh's gradient
# reads its output too). Dropout at p = 0 runs nothing. tests/test_eager_traffic.py recounts it through torch's
# dispatcher on the installed transformers. Gradient checkpointing runs the forward twice.
EAGER_FORWARD_BYTES_PER_SCORE = 32
EAGER_BACKWARD_BYTES_PER_SCORE = 36
SOFTCAP_FORWARD_BYTES_PER_SCORE = 12
SOFTCAP_BACKWARD_BYTES_PER_SCORE = 14


def eager_attention_bytes(arch: Architecture, setting: Setting) -> float:
    """Memory traffic of one sample's eager attention scores: elementwise passes over layers · heads · seq²
    elements, each bound by memory bandwidth (SDPA and flash-attention never build the square: 0)."""
    if setting.attention != "eager":
        return 0.0
    forward, backward = EAGER_FORWARD_BYTES_PER_SCORE, EAGER_BACKWARD_BYTES_PER_SCORE
    if arch.attention_softcapping:
        forward, backward = forward + SOFTCAP_FORWARD_BYTES_PER_SCORE, backward + SOFTCAP_BACKWARD_BYTES_PER_SCORE
    passes = forward * (2 if setting.gradient_checkpointing else 1) + backward
    return float(arch.layers * arch.heads * setting.seq_len**2 * passes)


# The share of the datasheet memory bandwidth memory-bound passes reach, measured on eager attention's and taken
# for LoRA's too (nothing fitted to LoRA; held out, the H200's rehearsals replay within 7% where calibrated,
# 12% from the prior alone, benchmarks/gpu/emitted_runs.py replay): on an H100 (driver 580, torch
# 2.11, transformers 5.17) eager ran 0.060-0.158 s a step slower than SDPA's masked path on the same padded rows,
# which the counted bytes explain at 0.68-0.70 of 3.35 TB/s for Llama-3.2-1B (4 query heads per KV head) and
# Qwen2.5-0.5B (7), batches 1-4 (benchmarks/gpu/results/eager_path_h100_2026-12-07.jsonl, benchmarks/paired_paths.py).
MEMORY_BOUND_BANDWIDTH_SHARE = 0.69


# Bytes one token moves through one PEFT LoRA linear beyond its frozen base matmul, under the recipe's autocast
# (bf16 base, adapters kept in fp32 by PEFT), per input feature, output feature and rank, as torch's dispatcher
# counts them on PEFT 0.21 (tests/test_lora_traffic.py): forward, the input cast to the adapters' fp32 and back
# to bf16 by autocast, lora_A reading it (14 per input feature); lora_B writing its output, the scaling multiply
# and the add onto the base output (12 per output feature); the rank-r intermediate written and read (4).
# Backward, both casts' gradients, lora_A's weight gradient reading the input and the input gradient written and
# summed with the base path's (20); the scaling's gradient and lora_B's products over the output gradient (6);
# the intermediate's gradient (8). Per-step terms (the adapter weights' casts and gradients) are left out: they
# do not grow with the batch.
LORA_FORWARD_BYTES = (14, 12, 4)
LORA_BACKWARD_BYTES = (20, 6, 8)


def _adapted_linears(arch: Architecture, setting: Setting) -> list[Linear]:
    """The decoder's linears LoRA adapts (none for full fine-tuning); an MoE's fused experts (PEFT's
    target_parameters) are not linears and are not counted."""
    if not setting.lora_rank:
        return []
    names = set(arch.resolve_lora_targets(setting.lora_targets)) - {EXPERTS_TARGET}
    return [linear for linear in arch.structure.linears if linear.name in names]


def lora_adapter_bytes(arch: Architecture, setting: Setting) -> float:
    """Memory traffic of one sample through every LoRA adapter; checkpointing runs the forward twice."""
    forward_passes = 2 if setting.gradient_checkpointing else 1
    per_token = sum((forward_passes * f + b) * d
                    for linear in _adapted_linears(arch, setting)
                    for f, b, d in zip(LORA_FORWARD_BYTES, LORA_BACKWARD_BYTES,
                                       (linear.in_features, linear.out_features, setting.lora_rank)))
    return float(per_token * setting.seq_len)


def memory_bound_bytes(arch: Architecture, setting: Setting) -> float:
    """Bytes per sample of eager attention's score traffic and LoRA's adapter traffic."""
    return eager_attention_bytes(arch, setting) + lora_adapter_bytes(arch, setting)


def memory_bound_seconds(traffic_bytes: float, gpu: GpuSpec) -> float:
    """Seconds those bytes take at the share of the GPU's memory bandwidth such passes reach."""
    return traffic_bytes / (gpu.memory_bandwidth_gbs * 1e9 * MEMORY_BOUND_BANDWIDTH_SHARE)


# What each LoRA adapter adds to a step whatever the batch: its ~20 kernel launches forward and backward and PEFT's
# Python around them. On an H100 host (2026-12-07, torch 2.11, PEFT 0.21) LoRA on every linear against q_proj and
# v_proj only added 13.2 ms a step over 80 more adapters (Llama-3.2-1B) and 19.1 over 120 (Qwen2.5-0.5B) at zero
# batch (the intercept through batches 2-8; benchmarks/gpu/results/lora_traffic_h100_2026-12-07.jsonl,
# `python benchmarks/paired_paths.py lora`): 165 and 159 µs an adapter. A host-side cost: another CPU moves it.
LORA_SECONDS_PER_ADAPTER_STEP = 160e-6


def lora_adapters(arch: Architecture, setting: Setting) -> int:
    """How many LoRA adapters a step launches (each costs LORA_SECONDS_PER_ADAPTER_STEP)."""
    return len(_adapted_linears(arch, setting))
