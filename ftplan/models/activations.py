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
- Per family: q is heads·head_dim wide (Gemma and Qwen3 differ from h); Gemma's four norms a layer and
  q/k norms (Qwen3, Gemma 3, OLMo 2, OLMoE) save two fp32 tensors each too. Fused projections (Phi-3)
  save the same tensors as separate ones. Sliding windows change nothing under SDPA/flash attention
  (no seq² scores either way).
- Mixture of experts (per MoE layer and token, k = experts per token, I = expert width): the router's
  logits (E, matmul dtype) and their fp32 softmax; each of the k routed copies saves its gathered input
  (h), its gate_up output (2I), silu(gate) and the product (2I) and its output before weighting (h):
  k·(2h + 4I)·m; a Qwen2-MoE shared expert is one more SwiGLU of its width. The experts' weights are
  all held (core/architecture.py counts them), but activations scale with k, not with E.
- The attention path (Setting.masked): with no mask, SDPA runs grouped-query attention natively on the
  flash kernel and saves k and v at the KV width. A padding mask (any padded batch) makes transformers
  expand k and v to every query head (`repeat_kv` in integrations/sdpa_attention.py, taken whenever a mask
  is passed on CUDA) and SDPA leaves flash for the memory-efficient kernel, which saves the expanded k and v
  (2·q_width instead of 2·kv) and an additive bias that SDPA converts from the boolean (batch, 1, seq, seq)
  mask on every call (seq half-precision values per token, per layer). Eager attention also saves the
  scores and their softmax (heads·seq each).
- Gradient checkpointing keeps one residual-stream tensor per layer (h·s) and, during the
  recompute of one layer, that layer's full activations; the loss's tensors are gone by then
  (peak_bytes_per_token).
- Loss: Trainer's causal-LM loss upcasts the logits to fp32; the peak, at the start of backward,
  holds the fp32 log-softmax output, its gradient and the gradient of the upcast: 3 × 4 bytes per
  vocabulary entry (Gemma 2's final soft-capping saves two more logits tensors, the scaled logits and
  their tanh, in the matmul dtype). Liger's fused linear cross-entropy never builds them: it processes chunks of
  about hidden/vocab of the tokens, so per token it holds about h fp32 logits, their gradient and
  the half-precision input gradient (h·(8 + m)), plus one gradient of the lm_head weight.
"""

from __future__ import annotations

from ftplan.core.architecture import Architecture
from ftplan.core.settings import Setting
from ftplan.models.bytes_per_param import FP32_BYTES, HALF_BYTES, HALF_PRECISIONS, activation_bytes, weight_bytes

NORM_FP32_TENSORS = 2
LOSS_FP32_TENSORS = 3
LIGER_LOSS_FP32_TENSORS = 2
SOFTCAP_LOGIT_TENSORS = 2


def stream_bytes(setting: Setting) -> int:
    """Bytes of a residual-stream element: the embedding's dtype, since its output sets it. A LoRA base is
    loaded in half precision (core/recipe.py), so its stream is half too; QLoRA's non-quantized rest is cast
    to fp32 (peft's prepare_model_for_kbit_training), and so is its stream. On the H200 the checkpointed
    ladders agree: Phi-3-mini LoRA holds 1.14 GiB a sample (a half stream), Llama-3-8B QLoRA 3.97 (fp32)."""
    if setting.lora_rank and not setting.quantization and setting.precision in HALF_PRECISIONS:
        return HALF_BYTES
    return weight_bytes(setting)


def _swiglu_bytes(width: int, setting: Setting) -> int:
    """Saved tensors of one gated MLP of this width: gate, silu(gate), up, product (Liger recomputes silu)."""
    return (3 if setting.liger else 4) * width * activation_bytes(setting)


def layer_bytes_per_token(arch: Architecture, setting: Setting, layer: int = 0) -> int:
    """Bytes one decoder layer saves for backward, per token, without checkpointing."""
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    m, s = activation_bytes(setting), stream_bytes(setting)
    family_norms = arch.family.norms_per_layer if arch.family else 2
    qk_norm_width = (q + kv) if arch.family and arch.family.qk_norm else 0
    if setting.liger:
        norms = family_norms * h * s + qk_norm_width * s
        attention = (q + 2 * kv + q) * m
    else:
        norms = NORM_FP32_TENSORS * FP32_BYTES * (family_norms * h + qk_norm_width)
        attention = ((q + kv) + (q + 2 * kv) + q) * m
    linear_inputs = 2 * h * m
    masked = masked_attention_bytes_per_token(arch, setting)
    if not arch.is_moe_layer(layer):
        return norms + linear_inputs + attention + masked + _swiglu_bytes(arch.intermediate, setting)
    k, experts = arch.experts_per_token, arch.experts
    router = experts * (m + FP32_BYTES)
    routed = k * (2 * h + 4 * arch.expert_intermediate) * m
    shared = _swiglu_bytes(arch.shared_expert_intermediate, setting) if arch.shared_expert_intermediate else 0
    return norms + linear_inputs + attention + masked + router + routed + shared


def masked_attention_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """What one layer saves per token beyond the unmasked flash path: expanded k and v and the additive mask
    (see the module docstring); eager attention's scores and probabilities. 0 for unmasked SDPA or flash-attention 2."""
    m, q_width, kv = activation_bytes(setting), arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    if setting.attention == "eager":
        return 2 * (q_width - kv) * m + 2 * arch.heads * setting.seq_len * m
    if not setting.masked or setting.attention != "sdpa":
        return 0
    return 2 * (q_width - kv) * m + setting.seq_len * m


def _per_layer_bytes(arch: Architecture, setting: Setting) -> list[int]:
    """Each layer's saved bytes per token. Layers differ only in whether they route experts, so each kind is
    priced once: a plan prices hundreds of settings, and pricing every layer of each was a fifth of its time."""
    routed = [arch.is_moe_layer(i) for i in range(arch.layers)]
    kinds = {moe: layer_bytes_per_token(arch, setting, routed.index(moe)) for moe in set(routed)}
    return [kinds[moe] for moe in routed]


def _checkpoint_bytes(arch: Architecture, setting: Setting) -> int:
    """What gradient checkpointing keeps per token: one residual-stream tensor a layer."""
    return arch.layers * arch.hidden * stream_bytes(setting)


def activations_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """Bytes all layers hold per token at the start of backward (checkpointing changes what is kept)."""
    per_layer = _per_layer_bytes(arch, setting)
    if setting.gradient_checkpointing:
        return _checkpoint_bytes(arch, setting) + max(per_layer)
    return sum(per_layer)


def peak_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """Activation and loss bytes per token at the peak of backward. Without checkpointing, and with Liger
    (whose fused loss takes its gradient in forward), the loss's tensors sit on top of every layer's
    activations. Under checkpointing the fp32 loss tensors are freed by the lm_head's backward before the
    last layer is recomputed, so the peak holds the larger of the two beside the checkpoints, not both: on
    the H200 that count is within 2.3% of the per-sample slope of the Phi-3-mini, Llama-3-8B QLoRA and
    Llama-3.2-1B checkpointed ladders, where the sum was 6-28% above it."""
    loss = loss_bytes_per_token(arch, setting)
    if not setting.gradient_checkpointing or setting.liger:
        return activations_bytes_per_token(arch, setting) + loss
    return _checkpoint_bytes(arch, setting) + max(*_per_layer_bytes(arch, setting), loss)


def loss_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """Bytes of the logits and loss per token at their peak (Liger's fused loss is chunked)."""
    if setting.liger:
        return arch.hidden * (LIGER_LOSS_FP32_TENSORS * FP32_BYTES + activation_bytes(setting))
    softcap = SOFTCAP_LOGIT_TENSORS * activation_bytes(setting) if arch.final_logit_softcapping else 0
    return arch.vocab * (LOSS_FP32_TENSORS * FP32_BYTES + softcap)


def liger_lm_head_grad_bytes(arch: Architecture, setting: Setting) -> int:
    """Liger's fused loss computes the lm_head weight gradient during forward: one extra weight-sized buffer."""
    return arch.vocab * arch.hidden * weight_bytes(setting) if setting.liger and setting.lora_rank == 0 else 0
