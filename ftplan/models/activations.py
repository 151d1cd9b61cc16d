"""Activation and loss bytes per token, counted from the tensors autograd saves in a decoder layer.

Why a count and not a fitted slope: it predicts models and settings nobody calibrated. It is what autograd
keeps, tensor by tensor: `python -m benchmarks.saved_tensors` sums every storage a saved-tensors hook sees in
shrunk models of each family on the CPU and matches the count to 1.2% (full fine-tuning with fp32 or bf16
weights, LoRA; dense and MoE), and on the H200 every ladder's per-sample slope is within 0-2.5% of it (it was
0.90-1.25 before the linears' inputs and the norms were counted as below). Per token and layer, with h = hidden,
q = heads·head_dim, kv = key/value width, I = intermediate, m = matmul-output bytes, s = residual-stream bytes
(fp32 when Trainer autocasts an fp32 model, else m), SDPA/flash attention (no seq² scores):
- Norms (Hugging Face's RMSNorm): the input in fp32 (4 bytes a value), and, where the weight trains, the
  normalised tensor it multiplies: in the input's dtype (Llama: weight · x.to(input_dtype)) or in fp32 (Gemma,
  OLMo 2 multiply first). Liger's RMSNorm saves its input only. q/k norms (Qwen3, Gemma 3, OLMo 2, OLMoE)
  read a projection's output.
- Linears save their input for the weight's gradient. Trainable ones reading one tensor share it, unless
  autocast casts it for each: an fp32 model's q, k and v each save a bf16 copy of the normed stream (3h·m, and
  2h·m for gate and up). o_proj reads SDPA's saved output. A frozen LoRA base saves none; every LoRA adapter
  saves a copy of its own input (PEFT casts it to the fp32 adapter's dtype, autocast back) plus lora_A's
  rank-wide output: q, k, v, gate and up each save h, o saves q.
- Attention saves the rotated q and k, v and its output (q + 2kv + q); RoPE saves only its cos and sin. Phi-3's
  v is a view of the fused qkv output, so where no repeat_kv copies it the whole output stays (q + kv more).
- A gated MLP saves gate, silu(gate) and up (Liger recomputes silu: gate and up), and down_proj its input,
  the product (I).
- Mixture of experts (per MoE layer and token, k = experts per token, I = expert width): the router's fp32
  softmax (E); each of the k routed copies, in the experts' dtype (autocast leaves their grouped matmuls
  alone), saves its gathered input (h), its gate_up output (2I), silu(gate) and the product (2I) and its
  output before weighting (h): k·(2h + 4I); frozen experts (LoRA that leaves them alone) 3I + h. A Qwen2-MoE
  shared expert is one more gated MLP, whose output its sigmoid gate saves. The experts' weights are all held
  (core/architecture.py counts them), but activations scale with k, not with E.
- The attention path (Setting.masked): with no mask, SDPA runs grouped-query attention natively on the
  flash kernel and saves k and v at the KV width. A padding mask (any padded batch) makes transformers
  expand k and v to every query head (`repeat_kv` in integrations/sdpa_attention.py, taken whenever a mask
  is passed on CUDA) and SDPA leaves flash for the memory-efficient kernel, which saves the expanded k and v
  (2·q_width instead of 2·kv) and an additive bias that SDPA converts from the boolean (batch, 1, seq, seq)
  mask on every call (seq half-precision values per token, per layer). Eager attention always expands k and v
  and saves, per score (heads·seq a token), its fp32 softmax (softmax(dtype=float32) keeps its output) and the
  half-precision probabilities the value matmul reads; Gemma 2's attention softcapping keeps its tanh too.
  On shrunk models that count is within 0.2% of what autograd saves (`python -m benchmarks.saved_tensors`).
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

from ftplan.core.architecture import EXPERTS_TARGET, Architecture
from ftplan.core.settings import Setting
from ftplan.models.bytes_per_param import FP32_BYTES, HALF_BYTES, HALF_PRECISIONS, activation_bytes, weight_bytes

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
    """What one gated MLP of this width saves before its down projection: gate, silu(gate) and up (Liger
    recomputes silu). The product is down_proj's input (_linear_input_bytes)."""
    return (2 if setting.liger else 3) * width * activation_bytes(setting)


def _norm_bytes(arch: Architecture, setting: Setting) -> int:
    """What one layer's RMSNorms save per token. Liger's saves its input. Hugging Face's keeps its input in fp32
    (the square and the scaling save it) and, where the norm's weight trains (not on a LoRA base), the normalised
    tensor the weight multiplies: in the input's dtype (Llama: weight · x.to(input_dtype)), or in fp32 where the
    family multiplies first and casts after (Gemma, OLMo 2). q/k norms read a projection's output."""
    family = arch.family
    layer_norms = family.norms_per_layer if family else 2
    qk_width = arch.heads * arch.head_dim + arch.kv_heads * arch.head_dim if family and family.qk_norm else 0
    m, s = activation_bytes(setting), stream_bytes(setting)
    if setting.liger:
        return layer_norms * arch.hidden * s + qk_width * m
    trainable = not setting.lora_rank
    fp32_weight = bool(family and family.fp32_norm_weight)

    def saved(width: int, input_bytes: int) -> int:
        return FP32_BYTES * width + ((FP32_BYTES if fp32_weight else input_bytes) * width if trainable else 0)

    return layer_norms * saved(arch.hidden, s) + saved(qk_width, m)


def _dense_groups(arch: Architecture) -> list[tuple[tuple[str, ...], int, str]]:
    """A dense layer's linears as (the readers of one input, its width, where the input comes from)."""
    h, q = arch.hidden, arch.heads * arch.head_dim
    if arch.family and arch.family.fused_projections:
        return [(("qkv_proj",), h, "stream"), (("o_proj",), q, "attention"),
                (("gate_up_proj",), h, "stream"), (("down_proj",), arch.intermediate, "product")]
    return [(("q_proj", "k_proj", "v_proj"), h, "stream"), (("o_proj",), q, "attention"),
            (("gate_proj", "up_proj"), h, "stream"), (("down_proj",), arch.intermediate, "product")]


def _moe_groups(arch: Architecture) -> list[tuple[tuple[str, ...], int, str]]:
    """An MoE layer's linears: attention's, and the router (with a shared expert's gate, up and sigmoid gate, as
    in Qwen2-MoE) on the normed stream; the routed experts' inputs are in their routed copies (_moe_bytes)."""
    h, q = arch.hidden, arch.heads * arch.head_dim
    groups = [(("q_proj", "k_proj", "v_proj"), h, "stream"), (("o_proj",), q, "attention")]
    if arch.shared_expert_intermediate:
        return groups + [(("router", "gate_proj", "up_proj", "shared_expert_gate"), h, "stream"),
                         (("down_proj",), arch.shared_expert_intermediate, "product")]
    return groups + [(("router",), h, "stream")]


def _linear_input_bytes(arch: Architecture, setting: Setting, moe_layer: bool) -> int:
    """What one layer's linears save of their inputs for their weights' gradients, per token.

    A trainable linear saves its input, and linears reading one tensor share it, unless autocast casts it for
    each (fp32 weights under the Trainer's bf16: q, k and v each save a bf16 copy of the normed stream). o_proj
    reads SDPA's output, which SDPA saves anyway. A frozen base linear saves nothing; each LoRA adapter saves a
    copy of its input of its own (_adapter_input_bytes) and lora_B the rank-wide output of lora_A. PEFT adapts
    a router through its weight (target_parameters), so the router then saves its input as a trainable one does.
    """
    m = activation_bytes(setting)
    groups = _moe_groups(arch) if moe_layer else _dense_groups(arch)
    if setting.lora_rank:
        return _adapter_input_bytes(arch, setting, groups)
    cast = stream_bytes(setting) != m
    copies = {"stream": lambda readers: len(readers) if cast else 1, "attention": lambda readers: 0,
              "product": lambda readers: 1}
    return sum(copies[source](readers) * width * m for readers, width, source in groups)


def _adapter_input_bytes(arch: Architecture, setting: Setting, groups: list[tuple[tuple[str, ...], int, str]]) -> int:
    """What a LoRA model's linears save of their inputs: each adapter its own copy under the Trainer's autocast
    (PEFT keeps adapters in fp32 and casts the input to them, autocast casts back); under DeepSpeed, which holds
    the adapters in half precision and does not autocast, the adapters reading one tensor share it, as trainable
    linears do. On the H200, Llama-3-8B LoRA with ZeRO-2 offload holds 14.2 GiB a sample, plain DDP 16.2."""
    m, rank = activation_bytes(setting), setting.lora_rank
    adapted = set(arch.resolve_lora_targets(setting.lora_targets))
    router = any("router" in readers for readers, *_ in groups) and EXPERTS_TARGET in adapted
    total = router * arch.hidden * m
    for readers, width, source in groups:
        n = sum(r in adapted for r in readers)
        if setting.precision in HALF_PRECISIONS and not setting.uses_deepspeed:
            total += n * (width + rank) * m
        else:
            total += (min(n, 1) * width * (source != "attention") + n * rank) * m
    return total


def _moe_bytes(arch: Architecture, setting: Setting) -> int:
    """What one MoE layer's router and experts save per token beyond their linears' inputs.

    The router's fp32 softmax (E values). Each of the k routed copies, in the experts' dtype (autocast leaves
    their grouped matmuls alone): trainable experts save its gathered input (h), gate_up output (2I), silu(gate)
    and the product (2I) and its output before weighting (h); frozen ones (LoRA that leaves the fused experts
    alone, as on Qwen2-MoE) keep only gate_up, silu(gate) and the output (3I + h). A shared expert is one more
    gated MLP of its width, whose output its sigmoid gate saves (h)."""
    h, width, k = arch.hidden, arch.expert_intermediate, arch.experts_per_token
    trainable = not setting.lora_rank or EXPERTS_TARGET in arch.resolve_lora_targets(setting.lora_targets)
    routed = k * ((2 * h + 4 * width) if trainable else (3 * width + h)) * stream_bytes(setting)
    shared = arch.shared_expert_intermediate
    shared_expert = _swiglu_bytes(shared, setting) + h * activation_bytes(setting) if shared else 0
    return arch.experts * FP32_BYTES + routed + shared_expert


def _fused_qkv_bytes(arch: Architecture, setting: Setting) -> int:
    """Phi-3's v is a view of the fused qkv output: where it reaches SDPA uncopied (no mask, or as many KV as query
    heads, so no repeat_kv), the whole output stays saved beside the rotated copies of q and k (CUDA's kernels
    take strided inputs; the CPU's copy them, so benchmarks/saved_tensors.py cannot show it)."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    if not (arch.family and arch.family.fused_projections) or (kv < q and (setting.masked or setting.attention == "eager")):
        return 0
    return (q + kv) * activation_bytes(setting)


def layer_bytes_per_token(arch: Architecture, setting: Setting, layer: int = 0) -> int:
    """Bytes one decoder layer saves for backward, per token, without checkpointing."""
    q, kv, m = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, activation_bytes(setting)
    moe_layer = arch.is_moe_layer(layer)
    attention = (q + 2 * kv + q) * m + _fused_qkv_bytes(arch, setting) + masked_attention_bytes_per_token(arch, setting)
    shared = _norm_bytes(arch, setting) + _linear_input_bytes(arch, setting, moe_layer) + attention
    return shared + (_moe_bytes(arch, setting) if moe_layer else _swiglu_bytes(arch.intermediate, setting))


def masked_attention_bytes_per_token(arch: Architecture, setting: Setting) -> int:
    """What one layer saves per token beyond the unmasked flash path: expanded k and v and the additive mask
    (see the module docstring); eager attention's scores and probabilities. 0 for unmasked SDPA or flash-attention 2."""
    m, q_width, kv = activation_bytes(setting), arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    if setting.attention == "eager":
        per_score = FP32_BYTES + m + (m if arch.attention_softcapping else 0)
        return 2 * (q_width - kv) * m + arch.heads * setting.seq_len * per_score
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
    """Bytes of the logits and loss per token at their peak. Liger's fused loss and TRL's fused LM head are
    chunked: about h fp32 values a token and the half-precision hidden state they read (TRL's: packed runs on an
    H100 within 3.1% allocated, `python benchmarks/gpu/emitted_runs.py replay`)."""
    if setting.liger or setting.trl_lm_head:
        return arch.hidden * (LIGER_LOSS_FP32_TENSORS * FP32_BYTES + activation_bytes(setting))
    softcap = SOFTCAP_LOGIT_TENSORS * activation_bytes(setting) if arch.final_logit_softcapping else 0
    return arch.vocab * (LOSS_FP32_TENSORS * FP32_BYTES + softcap)


def liger_lm_head_grad_bytes(arch: Architecture, setting: Setting) -> int:
    """Liger's fused loss computes the lm_head weight gradient during forward: one extra weight-sized buffer.
    Not under TRL's SFTTrainer (packing), which turns Liger's fused loss off for its own LM head."""
    fused_in_forward = setting.liger and not setting.trl_lm_head and setting.lora_rank == 0
    return arch.vocab * arch.hidden * weight_bytes(setting) if fused_in_forward else 0
