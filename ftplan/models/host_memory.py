"""Host RAM per node that DeepSpeed's CPU optimizer offload (ZeRO-Offload) fills.

Why: the shipped H200 calibration of llama-3-8b ZeRO-2 + offload was killed by the host's OOM killer
on a 125 GiB host (data/calibrations/README.md) while qwen2.5-0.5b ran; GPU memory alone cannot say
which offload setups a machine can run.

What DeepSpeed 0.19.8 allocates on the CPU when `offload_optimizer.device` is "cpu", per rank, for
its 1/world_size partition of the trainable parameters (pinned when `pin_memory` is true):
- fp32 master weights, 4 bytes: `single_partition_of_fp32_groups` (runtime/zero/stage_1_and_2.py,
  `weights_partition ... .to(device=self.device, dtype=master_weights_and_grads_dtype)`, device 'cpu'),
  `fp32_partitioned_groups_flat` in stage3.py;
- fp32 gradients, 4 bytes: `single_grad_partition` set as the fp32 partition's `.grad`
  (`initialize_optimizer_states` in stage_1_and_2.py; `subgroup_gradient_buffer` in stage3.py);
- Adam moments, 8 bytes: DeepSpeedCPUAdam's `exp_avg` and `exp_avg_sq`, `zeros_like` the fp32
  partition on the CPU (ops/adam/cpu_adam.py);
- one half-precision (model dtype) copy of the partition: stage 1/2's
  `param_buffer_of_bit16_for_cpu_offload_groups`, stage 3's `grad_partitions_flat_buffer` (dtype
  `grad_accum_dtype`, which defaults to the model dtype, runtime/engine.py `get_data_types`).
So 18 bytes per trainable parameter under bf16, summed over the node's ranks. DeepSpeed's own
`estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs` count the first
three (16 bytes, "per CPU") and multiply by an `additional_buffer_factor` of 1.5; ZeRO-Offload
(Ren et al. 2021) likewise keeps fp32 parameters, gradients and optimizer states on the CPU.
Stage 1/2 also pins one staging buffer of the largest trainable tensor per rank
(`temp_grad_buffer_for_cpu_offload`, model dtype), not partitioned.

Not counted, for want of a measurement (our records carry no host-memory figure): the process itself
(Python, CUDA and NCCL host allocations, the data loader), the model as loaded on the CPU before
DeepSpeed moves it to the GPU (DeepSpeed's estimator allows 4 bytes per parameter per rank for it),
and gradient-accumulation buffers (`accumulated_grads_in_cpu`, only with accumulation > 1, which the
planner does not use). The figure is therefore a lower bound on what a node needs.
"""

from __future__ import annotations

import math

from ftplan.core.architecture import Architecture
from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.bytes_per_param import (
    FP32_BYTES,
    OPTIMIZER_STATE_BYTES,
    weight_bytes,
)

MASTER_WEIGHT_BYTES = FP32_BYTES      # DeepSpeed's fp32 master copy of the partition
FP32_GRADIENT_BYTES = FP32_BYTES      # the fp32 gradient partition the CPU Adam step reads


def offload_bytes_per_param(setting: Setting) -> int:
    """Host bytes of one trainable parameter under CPU optimizer offload, before ZeRO partitioning."""
    if not setting.offload_optimizer:
        return 0
    if setting.optimizer not in OPTIMIZER_STATE_BYTES:
        raise FtplanError(f"optimizer '{setting.optimizer}' has no memory model; supported: {', '.join(OPTIMIZER_STATE_BYTES)}")
    return MASTER_WEIGHT_BYTES + FP32_GRADIENT_BYTES + OPTIMIZER_STATE_BYTES[setting.optimizer] + weight_bytes(setting)


def largest_trainable_tensor(arch: Architecture, setting: Setting) -> int:
    """Elements of the largest trainable tensor: the embedding (or a linear) for full fine-tuning, a LoRA factor else."""
    shapes = arch.linear_shapes()
    if setting.lora_rank:
        targets = [t for t in arch.resolve_lora_targets(setting.lora_targets) if t in shapes]
        return setting.lora_rank * max((max(shapes[t]) for t in targets), default=arch.hidden)
    return arch.largest_tensor_params


def host_bytes_per_node(arch: Architecture, setting: Setting) -> int:
    """Host RAM each node's ranks pin for offloaded optimizer states, master weights and gradient
    buffers (0 without offload); a lower bound, see the module docstring for what is left out."""
    per_param = offload_bytes_per_param(setting)
    if per_param == 0:
        return 0
    trainable = arch.trainable_params(setting.lora_rank, setting.lora_targets)
    per_rank = math.ceil(trainable / setting.world_size) * per_param
    if setting.zero_stage < 3:
        per_rank += largest_trainable_tensor(arch, setting) * weight_bytes(setting)
    return per_rank * setting.gpus  # setting.gpus is the ranks on one node


def usable_host_bytes(host_memory_gib: float, safety_margin: float) -> int:
    """The host RAM per node the offload may fill: what the user has, less the same margin as the GPU budget."""
    if not (math.isfinite(host_memory_gib * GIB) and host_memory_gib > 0):  # 1e300 GiB overflows to inf bytes
        raise FtplanError(f"host memory must be a positive number of GiB, got {host_memory_gib:g}")
    return int(host_memory_gib * GIB * (1 - safety_margin))
