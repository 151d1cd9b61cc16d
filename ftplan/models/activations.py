"""Activation and loss bytes per token, counted from the tensors autograd saves in a Llama/Qwen2 block.

Why a count and not a fitted slope: it predicts models and settings nobody calibrated; calibration
then corrects it by a fitted scale (models/prior.py). Counts per token and per layer, with
h = hidden, kv = key/value width, I = intermediate, m = matmul-output bytes, s = residual-stream
bytes (fp32 when Trainer autocasts an fp32 model, else m), SDPA/flash attention (no seq² scores):
- Hugging Face modules: each RMSNorm saves two fp32 tensors of h (8h bytes); each linear saves its
  half-precision input (2 normed inputs: 2h·m); attention saves q, k before RoPE (h + kv), q, k, v
  after it (h + 2kv) and its output (h); SwiGLU saves gate, silu(gate), up and their product (4I).
- Liger kernels: RMSNorm saves only its input (h·s); RoPE works in place; SwiGLU recomputes silu,
  saving gate, up and the product (3I).
- The attention path (Setting.masked): with no mask, SDPA runs grouped-query attention natively on the
  flash kernel and saves k and v at the KV width. A padding mask (any padded batch) makes transformers
  expand k and v to every query head (`repeat_kv` in integrations/sdpa_attention.py, taken whenever a mask
  is passed on CUDA) and SDPA leaves flash for the memory-efficient kernel, which saves the expanded k and v
  (2·q_width instead of 2·kv) and an additive bias that SDPA converts from the boolean (batch, 1, seq, seq)
  mask on every call (seq half-precision values per token, per layer). Eager attention also saves the
  scores and their softmax (heads·seq each).
- Gradient checkpointing keeps one residual-stream tensor per layer (h·s) and, during the
  recompute of one layer, that layer's full activations.
- Loss: Trainer's causal-LM loss upcasts the logits to fp32; the peak, at the start of backward,
  holds the fp32 log-softmax output, its gradient and the gradient of the upcast: 3 × 4 bytes per
  vocabulary entry. Liger's fused linear cross-entropy never builds them: it processes chunks of
  about hidden/vocab of the tokens, so per token it holds about h fp32 logits, their gradient and
  the half-precision input gradient (h·(8 + m)), plus one gradient of the lm_head weight.
"""

from __future__ import annotations

from ftplan.core.architecture import Architecture
from ftplan.core.settings import Setting
from ftplan.models.bytes_per_param import FP32_BYTES, activation_bytes, weight_bytes

NORM_FP32_TENSORS = 2
LOSS_FP32_TENSORS = 3
LIGER_LOSS_FP32_TENSORS = 2


def stream_bytes(setting: Setting) -> int:
    """Bytes of a residual-stream element: the weights' dtype, since the embedding output sets it."""
    return weight_bytes(setting)


def layer_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """Bytes one decoder layer saves for backward, per token, without checkpointing."""
    h, kv, inter = arch.hidden, arch.kv_heads * arch.head_dim, arch.intermediate
    m, s = activation_bytes(setting), stream_bytes(setting)
    if setting.liger:
        norms = 2 * h * s
        attention = (h + 2 * kv + h) * m
        mlp = 3 * inter * m
    else:
        norms = 2 * NORM_FP32_TENSORS * FP32_BYTES * h
        attention = ((h + kv) + (h + 2 * kv) + h) * m
        mlp = 4 * inter * m
    linear_inputs = 2 * h * m
    return norms + linear_inputs + attention + mlp + masked_attention_bytes_per_token(arch, setting)


def masked_attention_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """What one layer saves per token beyond the unmasked flash path: expanded k and v and the additive mask
    (see the module docstring); eager attention's scores and probabilities. 0 for unmasked SDPA or flash-attention 2."""
    m, q_width, kv = activation_bytes(setting), arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    if setting.attention == "eager":
        return 2 * (q_width - kv) * m + 2 * arch.heads * setting.seq_len * m
    if not setting.masked or setting.attention != "sdpa":
        return 0
    return 2 * (q_width - kv) * m + setting.seq_len * m


def activations_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """Bytes all layers hold per token at the start of backward (checkpointing changes what is kept)."""
    per_layer = layer_bytes_per_token(arch, setting)
    if setting.gradient_checkpointing:
        return arch.layers * arch.hidden * stream_bytes(setting) + per_layer
    return arch.layers * per_layer


def loss_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """Bytes of the logits and loss per token at their peak (Liger's fused loss is chunked)."""
    if setting.liger:
        return arch.hidden * (LIGER_LOSS_FP32_TENSORS * FP32_BYTES + activation_bytes(setting))
    return arch.vocab * LOSS_FP32_TENSORS * FP32_BYTES


def liger_lm_head_grad_bytes(arch: Architecture, setting: Setting) -> int:
    """Liger's fused loss computes the lm_head weight gradient during forward: one extra weight-sized buffer."""
    return arch.vocab * arch.hidden * weight_bytes(setting) if setting.liger and setting.lora_rank == 0 else 0
