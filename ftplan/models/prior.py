"""The analytic prior: per-GPU peak memory and step time from the architecture and setting alone.

Memory is the largest of three phase peaks, each built from models/bytes_per_param.py and
models/activations.py:
  backward start = resident states + autocast copies + early lm_head gradient + batch·(activations + loss)
  backward end   = resident states + all gradients
  optimizer step = resident states + all gradients + step temporaries
so the curve in batch is convex and piecewise linear. Time is a per-step overhead, plus per sample
the matmul FLOPs over the GPU's bf16 dense throughput × MFU and the unfused loss's logit traffic,
eager attention's score traffic and LoRA's adapter traffic over its memory bandwidth (`ComputeRate`,
models/traffic.py), plus the optimizer step (GPU: memory-bandwidth bound; offloaded: CPU Adam).

Where calibration records exist, `fit_constants` learns the free constants from them (a scale on
the static and on the per-sample memory term, the reserved/allocated ratio, the compute rate from
the ladders' large-batch slopes, the per-step overhead and CPU-Adam speed);
the defaults below are only for when there are none, and each says where it came from.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ftplan.core.architecture import EXPERTS_TARGET, Architecture, cached_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import GpuSpec, find_gpu
from ftplan.core.settings import Setting
from ftplan.models.activations import liger_lm_head_grad_bytes, peak_bytes_per_token, stream_bytes
from ftplan.models.bytes_per_param import (
    HALF_BYTES,
    activation_bytes,
    frozen_param_bytes,
    quantized_base_bytes,
    trainable_param_bytes,
    weight_bytes,
)
from ftplan.models.curve import fit_convex_curve
from ftplan.models.traffic import (
    LORA_SECONDS_PER_ADAPTER_STEP,
    lora_adapters,
    memory_bound_bytes,
    memory_bound_seconds,
)
from ftplan.models.wall import healthy_points

# Defaults, used only when no calibration record is available: the values fit_constants learns from
# the public measurements in ../shared/external/seed000 (gpjt/fine-tune-2024-04: Qwen1.5-0.5B on an
# RTX 3090, Llama-3-8B on 8×A100, HF Trainer + DeepSpeed ZeRO-2/3, fp16), as printed by
# `python -m benchmarks.prior_accuracy`. The memory scales stay 1.0: the bare tensor count.
DEFAULT_MFU = 0.49
DEFAULT_LOSS_BYTES_PER_LOGIT = 0.0    # not identifiable there: no Liger ladder (see fit_compute_rate)
DEFAULT_STEP_OVERHEAD_SECONDS = 0.0   # their steps are compute-bound (the median excess is negative)
DEFAULT_FRAGMENTATION = 1.29
DEFAULT_CPU_ADAM_SECONDS_PER_PARAM = 8.8e-10
# Relative upper-bound half-widths of the uncorrected prior: its largest errors on those public
# measurements (allocated −28%, reserved −34%, time −32%), rounded up.
DEFAULT_MEMORY_MARGIN = 0.30
DEFAULT_RESERVED_MARGIN = 0.35
# Records at or above this share of their card inform the worst fragmentation: the safe batch is decided there.
NEAR_CAPACITY = 0.5
DEFAULT_TIME_MARGIN = 0.35
# AdamW reads weight, gradient and two moments and writes weight and both moments: 7 fp32 arrays.
ADAM_BYTES_TOUCHED_PER_PARAM = 28
MIN_RECORDS_TO_FIT = 2
MIN_RECORDS_FOR_MARGIN = 10  # _upper_margin's quantile needs as many; fewer keep the margin over every record
UPPER_QUANTILE = 0.95


@dataclass(frozen=True)
class MemoryTerms:
    """Per-GPU bytes of each phase; only the backward-start phase grows with the batch."""

    backward_start_static: float
    per_sample: float
    backward_end: float
    optimizer_step: float

    def peak(self, batch: int, static_scale: float = 1.0, sample_scale: float = 1.0) -> float:
        return max(static_scale * self.backward_start_static + sample_scale * self.per_sample * batch,
                   static_scale * self.backward_end, static_scale * self.optimizer_step)

    def features(self, batch: int) -> tuple[float, float]:
        """(static, per-sample·batch) bytes of the phase that governs at this batch, for fitting scales."""
        if self.backward_start_static + self.per_sample * batch >= max(self.backward_end, self.optimizer_step):
            return self.backward_start_static, self.per_sample * batch
        return max(self.backward_end, self.optimizer_step), 0.0


def memory_terms(arch: Architecture, setting: Setting) -> MemoryTerms:
    """The phase terms of the per-GPU peak for one setting (see the module docstring)."""
    trainable = arch.trainable_params(setting.lora_rank, setting.lora_targets)
    frozen = arch.params_total if setting.lora_rank else 0
    tb, fb = trainable_param_bytes(setting), frozen_param_bytes(setting)
    resident = trainable * tb.resident + frozen * fb.resident
    copies = _autocast_copy_params(arch, setting) * (fb if setting.lora_rank else tb).autocast_copies
    early_grad = 0 if setting.lora_rank else arch.vocab * arch.hidden * tb.gradients
    gathered = zero3_buffer_bytes(arch, setting) if setting.zero_stage == 3 else 0.0
    if setting.quantization:  # QLoRA: 4-bit linears, an fp32 rest whose lm_head autocast copies, one dequantized linear
        base = quantized_base_bytes(arch.linear_weight_params, arch.params_total - arch.linear_weight_params,
                                    max(i * o for i, o in arch.linear_shapes().values()), setting)
        resident = trainable * tb.resident + base.resident
        copies = arch.vocab * arch.hidden * HALF_BYTES + base.workspace_bytes
    per_token = peak_bytes_per_token(arch, setting)
    gradients = trainable * tb.gradients
    return MemoryTerms(
        backward_start_static=resident + copies + early_grad + gathered + liger_lm_head_grad_bytes(arch, setting)
        + merged_expert_bytes(arch, setting),
        per_sample=per_token * setting.seq_len,
        backward_end=resident + gradients,
        optimizer_step=resident + gradients + trainable * tb.step_temporaries,
    )


def accumulated_gradient_bytes(arch: Architecture, setting: Setting) -> float:
    """Per-GPU bytes a micro-step after the first holds through its forward and backward under gradient
    accumulation: every trainable parameter's .grad, kept to be added to. A calibration at accumulation 1 never
    holds them at its peak (set_to_none frees them at each step, and backward builds them as it frees activations).

    On the H100 (Qwen2.5-0.5B full, packed, 494M parameters: 1.84 GiB of fp32 gradients) 12 x 2 peaked 1.86 GiB
    above 12 x 1 allocated and 11 x 3 2.07 GiB above 11 x 1 (benchmarks/gpu/results/emitted_runs_pack_*_h100.jsonl).
    DeepSpeed accumulates into the gradient buffers it holds from the first micro-step (or on the CPU when
    offloading): nothing more is counted there (not measured).
    """
    if setting.uses_deepspeed:
        return 0.0
    return float(arch.trainable_params(setting.lora_rank, setting.lora_targets) * weight_bytes(setting))


def merged_expert_bytes(arch: Architecture, setting: Setting) -> float:
    """The merged expert weights PEFT's LoRA on fused experts keeps for backward: its ParamWrapper adds B·A to
    each layer's stacked experts in forward, and the grouped matmul saves the sum (a full copy of that layer's
    expert weights, in the stream's dtype). Every MoE layer's copy lives until backward; under checkpointing one,
    in the recompute. On the CPU (tests/test_families.py) the saved (experts, in, out) tensors are 1.0× the frozen
    expert weights; on the H200 OLMoE-1B-7B's static memory is 12 GiB above the count without them, its
    expert weights 12.0 GiB in bf16."""
    if not setting.lora_rank or EXPERTS_TARGET not in arch.resolve_lora_targets(setting.lora_targets):
        return 0.0
    per_layer = arch.param_counts.experts / arch.moe_layers * stream_bytes(setting)
    return per_layer * (1 if setting.gradient_checkpointing else arch.moe_layers)


def _autocast_copy_params(arch: Architecture, setting: Setting) -> int:
    """Matmul weights whose half-precision autocast copy is still alive when backward starts (the frozen
    base's under LoRA). A layer saves its copies for backward; under gradient checkpointing the decoder
    layers save only their input and cast again in the recompute, so only the lm_head's copy stays. On the
    H200 this is what the checkpointed ladders show: Llama-3.2-3B + Liger's activation phase starts about
    6 GiB (2 bytes per decoder parameter) below the count that kept every copy."""
    lm_head = arch.vocab * arch.hidden
    return lm_head if setting.gradient_checkpointing else arch.decoder_params + lm_head


# DeepSpeed 0.19.8 defaults (deepspeed/runtime/zero/config.py), which the Trainer keeps when the config
# sets no value: `reduce_bucket_size` 5e8 elements, `stage3_prefetch_bucket_size` 5e7,
# `stage3_max_live_parameters` 1e9.
DS_REDUCE_BUCKET_ELEMENTS = 5e8
DS_PREFETCH_BUCKET_ELEMENTS = 5e7
DS_MAX_LIVE_PARAMETERS = 1e9


def zero3_buffer_bytes(arch: Architecture, setting: Setting) -> float:
    """ZeRO-3's own device buffers, from DeepSpeed's stage3.py: the contiguous-gradient (IPG) bucket of
    `reduce_bucket_size` elements in the half-precision communication dtype, allocated once at start-up;
    and the parameters gathered whole for the module running now plus the prefetch bucket, capped at
    `stage3_max_live_parameters` (the embedding, and an untied lm_head, are the largest such modules).
    On one GPU the gather is a full copy too (the measured one-GPU Llama-3.2-1B ZeRO-3 ladder sits
    2.8 GiB above the bare states)."""
    half = 2
    trainable = arch.trainable_params(setting.lora_rank, setting.lora_targets)
    bucket = min(DS_REDUCE_BUCKET_ELEMENTS, trainable) * half
    embeddings = arch.vocab * arch.hidden * (1 if arch.tied_embeddings else 2)
    live = min(DS_MAX_LIVE_PARAMETERS, embeddings + arch.params_per_layer() + DS_PREFETCH_BUCKET_ELEMENTS)
    return bucket + live * half


def _attention_forward_flops(arch: Architecture, setting: Setting) -> float:
    """Causal attention's score and value products of one sample's forward: 2·seq·q_width per token per
    layer (half of the full square, which flash and SDPA's kernels skip); eager attention multiplies the full
    square and masks it after, twice that."""
    square = 2 if setting.attention == "eager" else 1
    return square * 2 * setting.seq_len * arch.heads * arch.head_dim * arch.layers * setting.seq_len


def _flops_per_sample(arch: Architecture, setting: Setting) -> float:
    """Matmul FLOPs of one sample on one GPU: 2·params·tokens forward, as much again for activation
    gradients and (full fine-tuning only) for weight gradients, +1 forward when checkpointing: 6·P·T,
    8·P·T with checkpointing, 4·P·T for LoRA, with P the parameters a token passes through (of a
    mixture of experts only its top-k). Attention adds its forward and twice that backward; TRL's fused LM
    head recomputes its logits in backward (one more lm_head forward)."""
    lm_head_forward = 2 * arch.vocab * arch.hidden * setting.seq_len
    forward = 2 * arch.active_decoder_params * setting.seq_len + lm_head_forward
    attention_forward = _attention_forward_flops(arch, setting)
    weight_grads = 0 if setting.lora_rank else forward
    recompute = forward + attention_forward if setting.gradient_checkpointing else 0
    lm_head_recompute = lm_head_forward if setting.trl_lm_head else 0
    return 2 * forward + weight_grads + 3 * attention_forward + recompute + lm_head_recompute


def masked_attention_flops(arch: Architecture, setting: Setting) -> float:
    """Attention FLOPs of one sample that run on SDPA's masked path (forward, backward and any recompute).

    With a mask SDPA leaves the flash kernel for one that takes an arbitrary additive mask, over K and V
    expanded to every query head: the same FLOPs, done slower. 0 where no mask reaches SDPA; eager attention's
    matmuls run at the MFU and its score traffic is models/traffic.py's."""
    if not setting.masked or setting.attention != "sdpa":
        return 0.0
    return _attention_forward_flops(arch, setting) * (4 if setting.gradient_checkpointing else 3)


def optimizer_seconds(arch: Architecture, setting: Setting, gpu: GpuSpec, cpu_adam_seconds_per_param: float) -> float:
    """One optimizer step over this rank's partition: bandwidth-bound on the GPU, CPU Adam when offloaded."""
    partition = setting_terms(arch, setting).optimizer_params
    if setting.offload_optimizer:
        return partition * cpu_adam_seconds_per_param
    return partition * ADAM_BYTES_TOUCHED_PER_PARAM / (gpu.memory_bandwidth_gbs * 1e9)


def logit_elements_per_sample(arch: Architecture, setting: Setting) -> int:
    """Logit entries one sample materialises: the unfused loss reads and writes them several times
    in fp32 (upcast, log-softmax, their gradients), memory-bound traffic that FLOPs do not count.
    Liger's fused linear cross-entropy never builds them."""
    return 0 if setting.liger or setting.trl_lm_head else setting.seq_len * arch.vocab


# How much slower per FLOP SDPA's masked kernel runs one flattened packed sequence than a padded batch of its rows:
# the packed step time TRL's padding-free collation adds at k = 8 rows, over the same rows padded and masked, on the
# H200 implies 1.09 (Qwen2.5-0.5B at 2,048 tokens) and 1.11 (Llama-3.2-1B at 1,024) with the shipped constants
# (`python benchmarks/gpu/packed_path.py slowdown`); smaller k hide it under the launch-bound floor. Held out, the
# H100's packed rehearsals through TRL's SFTTrainer (benchmarks/gpu/emitted_runs.py replay) imply 1.18 between 11
# and 12 rows.
FLATTENED_MASK_SLOWDOWN = 1.10


def packed_attention_extra(arch: Architecture, setting: Setting, batch: int) -> tuple[float, float]:
    """(bytes, masked attention FLOPs) a packed micro-batch of `batch` rows costs beyond its rows priced one by one.

    Padding-free collation (TRL's packing) flattens the micro-batch into one sequence of batch × seq tokens, and
    for SDPA transformers masks it block-diagonally with one dense (T, T) mask (masking_utils, from the rows'
    position_ids): the masked kernel computes every query against every key of the flattened sequence, and each
    layer saves that mask for backward. Both grow with batch², so a packed micro-batch of k rows costs k times a
    padded one's attention and mask (checked on transformers 5.25: a (1, 1, 120, 120) bool mask for three packed
    rows). On the H200 the memory packing added matched this to 1.5% at k = 2-8 on Qwen2.5-0.5B and Llama-3.2-1B
    (benchmarks/gpu/packed_path.py). Flash-attention 2 runs the rows as varlen sequences instead: nothing extra.
    Eager is not priced apart.

    The FLOPs are priced at the masked path's rate, and the flattened kernel runs all k² squares of its mask
    FLATTENED_MASK_SLOWDOWN times slower per FLOP than the padded rows' masked kernel runs their k: the FLOPs
    returned are one row's masked attention times (slowdown · k² − k), the k already priced taken out.
    """
    if setting.padding != "packed" or not setting.masked or setting.attention != "sdpa" or batch <= 1:
        return 0.0, 0.0
    pairs = batch * (batch - 1)  # the row pairs one flattened sequence adds to the rows' own squares
    layers_holding = 1 if setting.gradient_checkpointing else arch.layers  # the recomputed layer's, or every layer's
    mask = layers_holding * setting.seq_len**2 * activation_bytes(setting) * pairs
    squares = FLATTENED_MASK_SLOWDOWN * batch**2 - batch
    return float(mask), masked_attention_flops(arch, setting) * squares


def masked_path_seconds(cost: float, terms: SettingTerms, gpu: GpuSpec) -> float:
    """The masked attention path's extra seconds per sample, at `cost` extra seconds per second of its FLOPs at peak."""
    return cost * terms.masked_attention_flops / (gpu.bf16_dense_tflops * 1e12)


@dataclass(frozen=True)
class ComputeRate:
    """What one more sample costs a compute-bound step: matmul FLOPs at an achieved share (MFU) of the
    GPU's bf16 dense peak, plus the unfused loss's traffic over the GPU's memory bandwidth, plus the masked
    attention path's extra time per attention FLOP (`masked_attention_cost`), plus the counted memory-bound
    passes of eager attention and LoRA adapters (models/traffic.py).

    Learned from the large-batch slopes of calibrated ladders (`fit_compute_rate`), so it sees the
    per-sample cost that a setting's own launch-bound small batches hide.
    """

    mfu: float
    loss_bytes_per_logit: float
    n_ladders: int
    masked_attention_cost: float = 0.0  # extra seconds per second of masked attention FLOPs at the GPU's peak

    def seconds_per_sample(self, arch: Architecture, setting: Setting, gpu: GpuSpec) -> float:
        peak = gpu.bf16_dense_tflops * 1e12
        terms = setting_terms(arch, setting)
        traffic = logit_elements_per_sample(arch, setting) * self.loss_bytes_per_logit / (gpu.memory_bandwidth_gbs * 1e9)
        return (terms.flops_per_sample / (peak * self.mfu) + traffic + self.masked_seconds(terms, gpu)
                + memory_bound_seconds(terms.memory_bound_bytes, gpu))

    def masked_seconds(self, terms: SettingTerms, gpu: GpuSpec) -> float:
        """The masked attention path's extra seconds per sample."""
        return masked_path_seconds(self.masked_attention_cost, terms, gpu)

    def packed_seconds(self, flops: float, gpu: GpuSpec) -> float:
        """Seconds of masked attention FLOPs that packing adds (packed_attention_extra): the FLOPs at the MFU
        plus the masked path's extra."""
        return flops / (gpu.bf16_dense_tflops * 1e12) * (1 / self.mfu + self.masked_attention_cost)

    def to_json(self) -> dict:
        return {"mfu": self.mfu, "loss_bytes_per_logit": self.loss_bytes_per_logit, "n_ladders": self.n_ladders,
                "masked_attention_cost": self.masked_attention_cost}

    @classmethod
    def from_json(cls, data: dict | None) -> ComputeRate | None:
        if data is None:
            return None
        return cls(float(data["mfu"]), float(data["loss_bytes_per_logit"]), int(data["n_ladders"]),
                   float(data["masked_attention_cost"]))


@dataclass(frozen=True)
class LadderSlope:
    """Seconds per extra sample at the top of one calibrated ladder (one setting, length and GPU)."""

    arch: Architecture
    setting: Setting
    gpu: GpuSpec
    seconds_per_sample: float


def ladder_slopes(records: list[dict]) -> list[LadderSlope]:
    """Seconds per extra sample at the top of each sequence length's healthy ladder in one setting
    on one GPU (the steepest line of its convex fit); CPU runs and unknown GPUs or architectures give none."""
    healthy, _ = healthy_points(records)
    slopes = []
    for seq in sorted({r["seq_len"] for r in healthy}):
        timed = [r for r in healthy if r["seq_len"] == seq and r.get("seconds_per_step") and r.get("device") != "cpu"]
        if len({r["micro_batch"] for r in timed}) < 2:
            continue
        try:
            arch, gpu = cached_architecture(timed[0]["model"]), find_gpu(str(timed[0].get("gpu_name")))
        except FtplanError:
            continue
        curve = fit_convex_curve([r["micro_batch"] for r in timed], [seq] * len(timed),
                                 [r["seconds_per_step"] for r in timed], floor_fraction=0.0)
        slopes.append(LadderSlope(arch, Setting.from_dict(timed[0]), gpu, max(line.slopes[0] for line in curve.lines)))
    return slopes


# Below this many ladders the loss traffic is not fitted: MFU alone.
MIN_LADDERS_FOR_LOSS_TRAFFIC = 3


def fit_compute_rate(slopes: list[LadderSlope], masked_attention_cost: float = 0.0) -> ComputeRate | None:
    """MFU and loss traffic explaining the ladders' slopes, each ladder weighted by its relative error; the
    masked attention path's share (`fit_masked_attention_cost`, from paired records) is taken out first.

    Both enter linearly (seconds = FLOPs/(peak·MFU) + logits·bytes/bandwidth), so a non-negative least
    squares in (1/MFU, bytes) fits them. The two are told apart only by ladders with and without the
    unfused loss (Liger's fused loss builds no logits); otherwise, or with few ladders, MFU alone: on
    the public RTX 3090 ladders (one model, all unfused) a two-term fit gave MFU 0.79 and 240 bytes
    per logit, an artefact of collinearity.

    Mixture-of-experts ladders are left out where dense ones exist: their experts run as per-expert loops
    whose speed follows the routing, not the FLOPs (OLMoE-1B-7B's two H200 ladders of one setting rose 15.6 and
    68.6 ms a sample), and the one at 15.6 alone moved the H200's MFU from 0.56 to 0.77.
    """
    slopes = [s for s in slopes if s.seconds_per_sample > 0]
    slopes = [s for s in slopes if not s.arch.experts] or slopes
    if not slopes:
        return None
    terms = [setting_terms(s.arch, s.setting) for s in slopes]
    flop_seconds = np.array([t.flops_per_sample / (s.gpu.bf16_dense_tflops * 1e12) for s, t in zip(slopes, terms)])
    logit_seconds = np.array([logit_elements_per_sample(s.arch, s.setting) / (s.gpu.memory_bandwidth_gbs * 1e9)
                              for s in slopes])
    measured = np.array([s.seconds_per_sample - memory_bound_seconds(t.memory_bound_bytes, s.gpu)
                         - masked_path_seconds(masked_attention_cost, t, s.gpu) for s, t in zip(slopes, terms)])
    if len(slopes) >= MIN_LADDERS_FOR_LOSS_TRAFFIC and logit_seconds.any() and not logit_seconds.all():
        weight = 1 / measured
        features = np.column_stack([flop_seconds, logit_seconds]) * weight[:, None]
        from sklearn.linear_model import (
            LinearRegression,  # lazy: a cached plan never fits
        )

        inverse_mfu, loss_bytes = LinearRegression(fit_intercept=False, positive=True).fit(
            features, measured * weight).coef_
        if inverse_mfu > 0:
            return ComputeRate(float(1 / inverse_mfu), float(loss_bytes), len(slopes), masked_attention_cost)
    return ComputeRate(float(np.median(flop_seconds / measured)), 0.0, len(slopes), masked_attention_cost)


# Pairs of one setting, batch and GPU measured with and without a padding mask, below which the masked path's
# cost is not fitted (0: the unmasked time stands for the masked run).
MIN_MASK_PAIRS = 3


def fit_masked_attention_cost(records: Iterable[dict]) -> float:
    """The masked path's extra step time per second of masked attention FLOPs at the GPU's peak, from records
    that differ only in the padding mask: a least-squares line through the origin, so the large batches that
    decide a plan weigh most.

    On the H200 (12 pairs, query/KV head ratios 1, 4 and 7) a padded, masked batch ran 9-12% slower than
    the same rows unpadded at batch 4 and more, about three times its attention FLOPs' time at the MFU: the
    kernel that takes a mask is far slower than flash attention on the same products.
    """
    plain, masked, gpus = {}, [], {}
    for record in records:
        if record.get("status") != "ok" or not record.get("seconds_per_step") or record.get("device", "cuda") != "cuda":
            continue
        try:
            setting = Setting.from_dict(record)
            name = str(record.get("gpu_name"))
            arch, gpu = cached_architecture(setting.model), gpus.get(name) or gpus.setdefault(name, find_gpu(name))
        except FtplanError:
            continue
        key = (setting.with_(padding="none"), int(record["micro_batch"]), gpu.name)
        if setting.padding == "none":
            plain[key] = float(record["seconds_per_step"])
        elif setting.masked and setting.attention == "sdpa" and setting.padding == "max_length":
            flops = masked_attention_flops(arch, setting) * key[1] / (gpu.bf16_dense_tflops * 1e12)
            masked.append((key, float(record["seconds_per_step"]), flops))
    pairs = [(seconds - plain[key], flops) for key, seconds, flops in masked if key in plain]
    if len(pairs) < MIN_MASK_PAIRS:
        return 0.0
    extra, flops = np.array(pairs).T
    return max(0.0, float(extra @ flops / (flops @ flops)))


@dataclass(frozen=True)
class SettingTerms:
    """Everything of the prior that depends only on architecture and setting, computed once per setting."""

    memory: MemoryTerms
    flops_per_sample: float
    optimizer_params: float  # trainable parameters this rank's optimizer updates
    masked_attention_flops: float  # of flops_per_sample, those on SDPA's masked path
    memory_bound_bytes: float  # per sample, the traffic FLOPs miss (models/traffic.py)
    lora_launch_seconds: float  # per step, the LoRA adapters' launches


_TERMS: dict[tuple[str, str, Setting], SettingTerms] = {}


def setting_terms(arch: Architecture, setting: Setting) -> SettingTerms:
    key = (arch.id, arch.hash, setting)
    if key not in _TERMS:
        trainable = arch.trainable_params(setting.lora_rank, setting.lora_targets)
        _TERMS[key] = SettingTerms(memory_terms(arch, setting), _flops_per_sample(arch, setting),
                                   trainable / setting.world_size if setting.uses_deepspeed else trainable,
                                   masked_attention_flops(arch, setting), memory_bound_bytes(arch, setting),
                                   lora_adapters(arch, setting) * LORA_SECONDS_PER_ADAPTER_STEP)
    return _TERMS[key]


def unmodelled(record: dict) -> str | None:
    """Why ftplan has no model of a record's setting (an optimizer or LoRA target it does not know), or None.

    A record of an architecture not available here still informs the fits of its own setting, so only a
    setting the prior cannot price is named: taken in, it would fail every later plan of that model.
    """
    try:
        arch = cached_architecture(record["model"])
    except FtplanError:
        return None
    try:
        setting_terms(arch, Setting.from_dict(record))
    except FtplanError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class PriorConstants:
    """The prior's free constants; `scope` says which calibrations they were learned from."""

    static_scale: float = 1.0
    # One per-sample scale for every setting: the count is what autograd saves (models/activations.py), within 2%
    # of every H200 ladder's slope, Liger and LoRA alike; it used to take three (Liger 1.08, Liger on LoRA 1.25).
    sample_scale: float = 1.0
    fragmentation: float = DEFAULT_FRAGMENTATION
    # Without checkpointing the reserved margin is the prior's error near the card's capacity (allocated at least
    # NEAR_CAPACITY of it), where a safe batch is decided: on the H200 4.6% there, 24% over all batches, whose small
    # ones carry GiBs of cache on a few GiB allocated (up to 1.44 times). Those are bounded apart, by the most
    # reserved-but-free memory seen below that (cached_bytes, 10.6 GiB). Phi-4 and Gemma-2-2B LoRA + Liger, never
    # calibrated, were planned at 4 and 16 where 6 and 20 ran; now 6 and 19.
    cached_bytes: float = 0.0
    mfu: float = DEFAULT_MFU
    loss_bytes_per_logit: float = DEFAULT_LOSS_BYTES_PER_LOGIT
    masked_attention_cost: float = 0.0  # none measured: the unmasked time stands for the masked run
    step_overhead_seconds: float = DEFAULT_STEP_OVERHEAD_SECONDS
    cpu_adam_seconds_per_param: float = DEFAULT_CPU_ADAM_SECONDS_PER_PARAM
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    reserved_margin: float = DEFAULT_RESERVED_MARGIN
    # Recomputing checkpointed layers strands more of the cache: on the H200 reserved/allocated reached 1.24-1.32
    # at the largest batches with checkpointing (Phi-3-mini LoRA, Llama-3.2-3B + Liger), at most 1.11 without.
    # A 95% quantile of all checkpointed records' errors (0.15 with Phi-3-mini left out) did not cover that
    # ladder near capacity (0.23), so the checkpointed bound also takes the worst ratio seen near capacity, and
    # its margin covers every checkpointed record (the largest error, not the 95% quantile): the default allocator's stranded recompute
    # blocks are a heavy tail of few settings, and once the activation count was exact (its errors no longer
    # padding the allocated bound) the quantile left Phi-3-mini's batch 84, with Phi-3 left out, 1% above it.
    checkpointed_fragmentation: float = DEFAULT_FRAGMENTATION
    checkpointed_reserved_margin: float = DEFAULT_RESERVED_MARGIN
    checkpointed_worst_fragmentation: float = DEFAULT_FRAGMENTATION
    time_margin: float = DEFAULT_TIME_MARGIN
    scope: str = "documented defaults (no calibration)"
    n_records: int = 0

    def fragmentation_of(self, setting: Setting) -> tuple[float, float, float]:
        """(median reserved/allocated ratio, its relative upper margin, the ratio the allocated bound is taken
        at too; 0 where the margin suffices) for this setting's checkpointing. ZeRO-3 gathers and frees each
        layer's parameters in backward as checkpointing recomputes each layer's activations, and strands blocks
        alike: with Llama left out (every H200 ZeRO-3 record is Llama-3.2-1B's) the margin near capacity put its
        batch 16 (1.13 reserved per allocated byte) 2% above the bound, so it takes the checkpointed regime."""
        if setting.gradient_checkpointing or setting.zero_stage == 3:
            return (self.checkpointed_fragmentation, self.checkpointed_reserved_margin,
                    self.checkpointed_worst_fragmentation)
        return self.fragmentation, self.reserved_margin, 0.0


@dataclass(frozen=True)
class PriorEstimate:
    """Mean per-GPU bytes and seconds of the prior; the step time split into compute and optimizer step."""

    peak_allocated: float
    peak_reserved: float
    seconds_per_step: float
    compute_seconds: float
    optimizer_seconds: float


def prior_estimate(arch: Architecture, setting: Setting, batch: int, gpu: GpuSpec,
                   constants: PriorConstants = PriorConstants()) -> PriorEstimate:
    """The corrected prior for one case; no communication time (the caller adds it for world_size > 1).

    Compute is a per-step overhead (launches, Trainer bookkeeping; LoRA adapters' launches on top) plus batch ×
    the compute rate's seconds per sample (FLOPs at the MFU, and the memory traffic FLOPs miss)."""
    packed_bytes, packed_flops = packed_attention_extra(arch, setting, batch)
    allocated = setting_terms(arch, setting).memory.peak(batch, constants.static_scale, constants.sample_scale) + packed_bytes
    rate = ComputeRate(constants.mfu, constants.loss_bytes_per_logit, 0, constants.masked_attention_cost)
    compute = (constants.step_overhead_seconds + setting_terms(arch, setting).lora_launch_seconds
               + batch * rate.seconds_per_sample(arch, setting, gpu) + rate.packed_seconds(packed_flops, gpu))
    optimizer = optimizer_seconds(arch, setting, gpu, constants.cpu_adam_seconds_per_param)
    return PriorEstimate(allocated, allocated * constants.fragmentation_of(setting)[0], compute + optimizer, compute,
                         optimizer)


@dataclass(frozen=True)
class _Observation:
    arch: Architecture
    setting: Setting
    batch: int
    gpu: GpuSpec
    allocated: float
    reserved: float | None
    seconds: float | None


def _observations(records: Iterable[dict], catalog: dict[str, GpuSpec] | None) -> list[_Observation]:
    """Usable GPU measurements: ok, on CUDA, a known architecture and GPU, a measured peak."""
    found, gpus = [], {}
    for record in records:
        if record.get("status") != "ok" or record.get("device", "cuda") != "cuda" or not record.get("peak_allocated_bytes"):
            continue
        try:
            observation = _Observation(
                arch=cached_architecture(record["model"]), setting=Setting.from_dict(record),
                batch=int(record["micro_batch"]), gpu=gpus.get(record.get("gpu_name")) or find_gpu(str(record.get("gpu_name", "")), catalog),
                allocated=float(record["peak_allocated_bytes"]), reserved=record.get("peak_reserved_bytes"),
                seconds=record.get("seconds_per_step"))
            setting_terms(observation.arch, observation.setting)  # an optimizer or LoRA target with no model
        except (FtplanError, KeyError, TypeError, ValueError) as exc:
            warnings.warn(f"{record.get('_source', 'record')}: not used by the prior ({exc})", stacklevel=2)
            continue
        gpus[record.get("gpu_name")] = observation.gpu
        found.append(observation)
    return found


def fit_constants(records: Iterable[dict], catalog: dict[str, GpuSpec] | None = None, scope: str = "calibrations",
                  masked_attention_cost: float | None = None) -> PriorConstants:
    """Learn the prior's constants from calibration records; defaults where too few records inform one. The
    masked path's cost is the given one (a kernel's speed, pooled over models) or these records' own."""
    records = list(records)
    observations = _observations(records, catalog)
    if len(observations) < MIN_RECORDS_TO_FIT:
        return PriorConstants()
    terms = [setting_terms(o.arch, o.setting).memory for o in observations]
    features = np.array([t.features(o.batch) for t, o in zip(terms, observations)])
    measured = np.array([o.allocated for o in observations])
    static_scale, sample_scale = _memory_scales(features, measured)
    predicted = _left_out_predictions(terms, observations, features, measured)
    memory_margin = _upper_margin(measured / predicted - 1, DEFAULT_MEMORY_MARGIN)

    reserved = np.array([float(o.reserved or 0) for o in observations])
    checkpointed = np.array([o.setting.gradient_checkpointing for o in observations])
    near_capacity = measured >= NEAR_CAPACITY * np.array([o.gpu.memory_bytes for o in observations])
    pooled = _fragmentation(reserved, measured, predicted, reserved > 0, near_capacity)
    plain = (reserved > 0) & ~checkpointed
    fragmentation, reserved_margin, _ = _fragmentation(reserved, measured, predicted, plain, near_capacity, pooled,
                                                       margin_over=near_capacity)
    cached_bytes = float(np.max((reserved - measured)[plain & ~near_capacity], initial=0.0))
    checkpointed_fragmentation, checkpointed_reserved_margin, checkpointed_worst_fragmentation = _fragmentation(
        reserved, measured, predicted, (reserved > 0) & checkpointed, near_capacity, pooled, quantile=1.0)

    time = _time_constants([o for o in observations if o.seconds], _all_ladder_slopes(records),
                           fit_masked_attention_cost(records) if masked_attention_cost is None else masked_attention_cost)
    return PriorConstants(static_scale=static_scale, sample_scale=sample_scale, fragmentation=fragmentation,
                          cached_bytes=cached_bytes,
                          memory_margin=memory_margin, reserved_margin=reserved_margin,
                          checkpointed_fragmentation=checkpointed_fragmentation,
                          checkpointed_reserved_margin=checkpointed_reserved_margin,
                          checkpointed_worst_fragmentation=checkpointed_worst_fragmentation, scope=scope,
                          n_records=len(observations), **time)


def _fragmentation(reserved: np.ndarray, allocated: np.ndarray, predicted: np.ndarray, chosen: np.ndarray,
                   near_capacity: np.ndarray, fallback: tuple[float, float, float] = (
                       DEFAULT_FRAGMENTATION, DEFAULT_RESERVED_MARGIN, DEFAULT_FRAGMENTATION),
                   quantile: float = UPPER_QUANTILE, margin_over: np.ndarray | None = None) -> tuple[float, float, float]:
    """The chosen records' median reserved/allocated ratio; the margin covering their reserved memory over the
    left-out allocated prediction times that ratio (over those of them margin_over picks, where at least
    MIN_RECORDS_FOR_MARGIN are); the largest ratio of those near the card's capacity, where the safe batch is
    decided. The fallback when too few records were chosen."""
    if chosen.sum() < MIN_RECORDS_TO_FIT:
        return fallback
    ratios = reserved[chosen] / allocated[chosen]
    ratio = float(np.median(ratios))
    # never below the fallback's worst, and so never below DEFAULT_FRAGMENTATION (1.29: the public fp16 runs with
    # checkpointing, median): with Phi-3-mini left out the H200's checkpointed records near capacity reach 1.27,
    # and its own batch 84 ran at 1.32
    worst = float(np.max(ratios[near_capacity[chosen]], initial=fallback[2]))
    if margin_over is not None and (chosen & margin_over).sum() >= MIN_RECORDS_FOR_MARGIN:
        chosen = chosen & margin_over
    return ratio, _upper_margin(reserved[chosen] / (predicted[chosen] * ratio) - 1, fallback[1], quantile), worst


def _left_out_predictions(terms: list[MemoryTerms], observations: list[_Observation], features: np.ndarray,
                          measured: np.ndarray) -> np.ndarray:
    """Each record predicted with scales learned from every *other* setting: the margins built on these
    errors are those of a setting the prior never saw, which is when the prior alone answers (in-sample
    errors made its bound 12% too tight for ZeRO-3 on 8×A100 and for Llama-3-8B LoRA + Liger)."""
    keys = [o.setting.with_(seq_len=0 + 1) for o in observations]
    predicted = np.empty(len(observations))
    for key in set(keys):
        held = np.array([k == key for k in keys])
        scales = _memory_scales(features[~held], measured[~held]) if (~held).sum() >= MIN_RECORDS_TO_FIT else (1.0, 1.0)
        for index in np.flatnonzero(held):
            predicted[index] = terms[index].peak(observations[index].batch, *scales)
    return predicted


def _all_ladder_slopes(records: list[dict]) -> list[LadderSlope]:
    """Ladder slopes of every (setting, GPU) among the records."""
    ladders: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        if record.get("status") == "ok" and record.get("setting_key"):
            ladders.setdefault((record["setting_key"], str(record.get("gpu_name"))), []).append(record)
    return [slope for ladder in ladders.values() for slope in ladder_slopes(ladder)]


def _memory_scales(features: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """Non-negative (static, per-sample) scales minimising the squared error; 1.0 for a term the data cannot see."""
    seen = features[:, 1:].any(axis=0)
    if not seen.any():
        return (float(np.median(measured / features[:, 0])),) + (1.0,) * len(seen)
    from scipy.optimize import (
        nnls,  # what positive least squares runs on, without scikit-learn's import cost
    )

    columns = np.concatenate([[True], seen])
    coefficients, _ = nnls(features[:, columns], measured)
    scales = iter(float(c) if c > 0 else 1.0 for c in coefficients)
    return tuple(next(scales) if used else 1.0 for used in columns)


def _time_constants(observations: list[_Observation], slopes: list[LadderSlope], masked_attention_cost: float) -> dict:
    """The compute rate from the ladders' large-batch slopes; the per-step overhead as the median of
    what runs with the optimizer on the GPU spent beyond it; CPU-Adam speed from offloaded runs;
    and the time margin."""
    rate = (fit_compute_rate(slopes, masked_attention_cost)
            or ComputeRate(DEFAULT_MFU, DEFAULT_LOSS_BYTES_PER_LOGIT, 0, masked_attention_cost))

    def beyond_compute(o: _Observation) -> float:
        return (o.seconds - o.batch * rate.seconds_per_sample(o.arch, o.setting, o.gpu)
                - setting_terms(o.arch, o.setting).lora_launch_seconds)

    on_gpu = [o for o in observations if not o.setting.offload_optimizer]
    overheads = [beyond_compute(o) - optimizer_seconds(o.arch, o.setting, o.gpu, 0.0) for o in on_gpu]
    overhead = max(0.0, statistics.median(overheads)) if overheads else DEFAULT_STEP_OVERHEAD_SECONDS
    speeds = [(beyond_compute(o) - overhead) / setting_terms(o.arch, o.setting).optimizer_params
              for o in observations if o.setting.offload_optimizer and beyond_compute(o) > overhead]
    time = {"mfu": rate.mfu, "loss_bytes_per_logit": rate.loss_bytes_per_logit,
            "masked_attention_cost": rate.masked_attention_cost, "step_overhead_seconds": overhead,
            "cpu_adam_seconds_per_param": statistics.median(speeds) if speeds else DEFAULT_CPU_ADAM_SECONDS_PER_PARAM}
    if not observations:
        return {**time, "time_margin": DEFAULT_TIME_MARGIN}
    constants = PriorConstants(**time)
    errors = [o.seconds / prior_estimate(o.arch, o.setting, o.batch, o.gpu, constants).seconds_per_step - 1
              for o in observations]
    return {**time, "time_margin": _upper_margin(np.array(errors), DEFAULT_TIME_MARGIN)}


def _upper_margin(relative_errors: np.ndarray, default: float, quantile: float = UPPER_QUANTILE) -> float:
    """Relative half-width covering ~95% of the fitted records' errors; at least the default when few records."""
    if len(relative_errors) < 10:
        return max(default, float(np.max(np.abs(relative_errors), initial=0.0)))
    return float(np.quantile(np.abs(relative_errors), quantile))
