"""Bytes each parameter costs on one GPU: the one definition every memory estimate imports.

Why these numbers (Hugging Face Trainer, AdamW):
- Without DeepSpeed, Trainer keeps the model in fp32 and autocasts matmuls to bf16/fp16, so a
  trainable parameter costs fp32 weight 4 + fp32 gradient 4 + AdamW's two fp32 moments 8 = 16 bytes,
  with no separate master copy; autocast additionally keeps a half-precision copy of each matmul
  weight (2 bytes) alive from forward until its backward.
- With DeepSpeed bf16/fp16 (ZeRO, Rajbhandari et al. 2020, "K = 12"): half-precision weight 2 +
  half-precision gradient 2 + fp32 master 4 + fp32 moments 8 = 16 bytes. Stage 1 partitions master
  and moments over the data-parallel ranks, stage 2 also the gradients, stage 3 also the weights.
  During the step each rank upcasts its gradient partition to fp32 (4 bytes, transient).
- Pure bf16 (the model loaded in bf16 and trained by Trainer, no DeepSpeed): weight 2 + gradient 2
  + AdamW's two moments in the weights' dtype 4 = 8 bytes, no master copy and no autocast copies.
- CPU optimizer offload (ZeRO-Offload) moves master weights and moments to host memory.
- LoRA: the frozen base weights cost only their storage (half precision under bf16/fp16);
  adapters pay the trainable price.
- Multi-GPU DDP (no DeepSpeed) keeps a second, bucketed copy of the gradients for the all-reduce
  (PyTorch DDP docs, `gradient_as_bucket_view`: "the saved memory size will be equal to the total
  gradients size"), so gradients count twice when world_size > 1.
- torch's foreach AdamW (Trainer's `adamw_torch`) allocates one fp32 temporary per parameter
  (sqrt of the second moment) during the step; the fused variants do not.
- bitsandbytes' 8-bit AdamW (`adamw_bnb_8bit`, alias `adamw_8bit`; `paged_adamw_8bit` in paged
  memory that can spill to the host): two uint8 moments plus one fp32 absmax per 256-value block of
  each (bitsandbytes' optimizer blocksize), 2·(1 + 4/256) bytes, updated in one fused kernel.
- QLoRA (Dettmers et al. 2023): each linear weight of the frozen base is 4-bit NF4 (0.5 bytes) with
  one absmax per 64-weight block, itself quantized to 8 bits with one fp32 constant per 256 of them
  (double quantization: 8/64 + 32/(64·256) bits = 0.127 bits per weight). Everything bitsandbytes
  does not quantize (embeddings, lm_head, norms, fused MoE experts) is cast to fp32 by
  `prepare_model_for_kbit_training`, as users call it. Each 4-bit linear dequantizes its weight to
  the compute dtype for its matmul: a transient workspace the size of the largest linear.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting

HALF_PRECISIONS = ("bf16", "bf16-pure", "fp16")
FP32_BYTES = 4
HALF_BYTES = 2

# fp32 optimizer-state bytes per trainable parameter, and step temporaries, by Trainer `optim` name.
BNB_8BIT_STATE_BYTES = 2 * (1 + FP32_BYTES / 256)
OPTIMIZER_STATE_BYTES = {"adamw_torch": 8, "adamw_torch_fused": 8, "adamw_hf": 8, "adamw_apex_fused": 8,
                         "adamw_bnb_8bit": BNB_8BIT_STATE_BYTES, "adamw_8bit": BNB_8BIT_STATE_BYTES,
                         "paged_adamw_8bit": BNB_8BIT_STATE_BYTES, "paged_adamw_32bit": 8}
OPTIMIZER_STEP_TEMP_BYTES = {"adamw_torch": 4, "adamw_torch_fused": 0, "adamw_hf": 4, "adamw_apex_fused": 0,
                             "adamw_bnb_8bit": 0, "adamw_8bit": 0, "paged_adamw_8bit": 0, "paged_adamw_32bit": 0}
NF4_BLOCK, NF4_CONSTANTS_BLOCK = 64, 256
NF4_BYTES = 0.5 + 1 / NF4_BLOCK + FP32_BYTES / (NF4_BLOCK * NF4_CONSTANTS_BLOCK)  # 0.5159 bytes per weight


def same_state_optimizers(optimizer: str) -> tuple[str, ...]:
    """Other optimizers keeping the same state (Trainer's default adamw_torch_fused and the adamw_torch that
    calibration ran): a fit of one is evidence for the other, up to the step temporaries."""
    state = OPTIMIZER_STATE_BYTES.get(optimizer)
    return tuple(name for name, size in OPTIMIZER_STATE_BYTES.items() if size == state and name != optimizer)


@dataclass(frozen=True)
class ParamBytes:
    """Bytes per parameter resident on one GPU, already divided by the ZeRO partition factor."""

    weights: float
    gradients: float
    master_weights: float
    optimizer_states: float
    step_temporaries: float   # alive only during the optimizer step
    autocast_copies: float    # half-precision weight copies alive from forward to backward

    @property
    def resident(self) -> float:
        """What stays on the GPU between steps (weights, master copy, optimizer moments)."""
        return self.weights + self.master_weights + self.optimizer_states


def weight_bytes(setting: Setting) -> int:
    """Storage bytes of one weight: fp32 unless DeepSpeed or a bf16-loaded model holds it in half precision."""
    pure = setting.precision == "bf16-pure"
    return HALF_BYTES if pure or (setting.uses_deepspeed and setting.precision in HALF_PRECISIONS) else FP32_BYTES


def activation_bytes(setting: Setting) -> int:
    """Bytes of one matmul output: half precision under bf16/fp16 (autocast or DeepSpeed), else fp32."""
    return HALF_BYTES if setting.precision in HALF_PRECISIONS else FP32_BYTES


def trainable_param_bytes(setting: Setting) -> ParamBytes:
    """Per-GPU bytes of one trainable parameter under the setting's precision, ZeRO stage and offload."""
    if setting.optimizer not in OPTIMIZER_STATE_BYTES:
        raise FtplanError(f"optimizer '{setting.optimizer}' has no memory model; supported: {', '.join(OPTIMIZER_STATE_BYTES)}")
    n = setting.world_size
    stage = setting.zero_stage
    weight = weight_bytes(setting)
    half_weights = weight == HALF_BYTES
    master = FP32_BYTES if half_weights else 0
    moments = OPTIMIZER_STATE_BYTES[setting.optimizer]
    if setting.uses_deepspeed:
        temporaries = FP32_BYTES  # fp32 upcast of the gradient partition
        on_gpu = 0.0 if setting.offload_optimizer else 1.0
        return ParamBytes(
            weights=weight / (n if stage >= 3 else 1),
            gradients=weight / (n if stage >= 2 else 1),
            master_weights=on_gpu * master / n,
            optimizer_states=on_gpu * moments / n,
            step_temporaries=on_gpu * temporaries / n,
            autocast_copies=0.0,
        )
    ddp_buckets = 2 if n > 1 else 1
    if setting.precision == "bf16-pure":  # torch's AdamW keeps its moments and temporaries in the weights' dtype
        return ParamBytes(weights=weight, gradients=weight * ddp_buckets, master_weights=0.0,
                          optimizer_states=moments * HALF_BYTES / FP32_BYTES,
                          step_temporaries=OPTIMIZER_STEP_TEMP_BYTES[setting.optimizer] * HALF_BYTES / FP32_BYTES,
                          autocast_copies=0.0)
    return ParamBytes(
        weights=weight, gradients=weight * ddp_buckets, master_weights=master, optimizer_states=moments,
        step_temporaries=OPTIMIZER_STEP_TEMP_BYTES[setting.optimizer],
        autocast_copies=HALF_BYTES if setting.precision in HALF_PRECISIONS else 0.0,
    )


def frozen_param_bytes(setting: Setting) -> ParamBytes:
    """Per-GPU bytes of one frozen (LoRA base) parameter: its storage, partitioned only by ZeRO-3.

    Under bf16/fp16 the frozen base is loaded in half precision (the usual LoRA recipe, and what
    `ftplan calibrate` runs), and autocast caches half copies only of weights that require grad, so
    a frozen weight costs its 2 bytes and nothing more. The shipped H200 Llama-3-8B LoRA ladders
    show it: about 15.6 GiB of static memory for 8.0e9 parameters.
    """
    trainable = trainable_param_bytes(setting)
    weights = activation_bytes(setting) / (setting.world_size if setting.zero_stage >= 3 else 1)
    return ParamBytes(weights=weights, gradients=0.0, master_weights=0.0, optimizer_states=0.0,
                      step_temporaries=0.0, autocast_copies=0.0 if weights < trainable.weights else trainable.autocast_copies)


@dataclass(frozen=True)
class QuantizedBase:
    """Bytes of a QLoRA base on one GPU: the 4-bit linears, the fp32 rest, and the dequantization workspace."""

    quantized_bytes: float
    fp32_bytes: float
    workspace_bytes: float

    @property
    def resident(self) -> float:
        return self.quantized_bytes + self.fp32_bytes


def quantized_base_bytes(quantized_params: int, other_params: int, largest_linear_params: int,
                         setting: Setting) -> QuantizedBase:
    """The frozen base of a QLoRA setting (quantization "nf4"), from its parameter split."""
    return QuantizedBase(quantized_bytes=quantized_params * NF4_BYTES, fp32_bytes=other_params * FP32_BYTES,
                         workspace_bytes=largest_linear_params * activation_bytes(setting))
