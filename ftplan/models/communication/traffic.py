"""What one optimizer step sends between ranks, and how much of that the step waits for once backward hides
what it can."""

from __future__ import annotations

from dataclasses import dataclass

from ftplan.core.settings import Setting
from ftplan.models.bytes_per_param import weight_bytes
from ftplan.models.communication.collectives import (
    DDP_BUCKET_BYTES,
    bucketed_seconds,
    collective_seconds,
    exposed_bucket_seconds,
    gradient_buckets,
)
from ftplan.models.communication.links import Links

DEFAULT_BACKWARD_FRACTION = 2 / 3  # backward is about twice the forward's FLOPs
# The fraction of what the bucket schedule can hide behind backward that is hidden. 1 is DDP's own
# schedule (buckets launched as they fill); multi-GPU calibrations measure it (estimate_overlap).
DEFAULT_OVERLAP = 1.0


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one optimizer step moves.

    gradient_bytes are all-reduced (ZeRO 0-2; stages 1-2 reduce-scatter then all-gather, the same
    volume) or only reduce-scattered (ZeRO-3, which instead all-gathers gathered_parameter_bytes in
    forward and again in backward: 3x the parameter bytes against 2x for an all-reduce).
    offloaded_bytes cross the host link each step with CPU offload, split over the ranks.
    """

    gradient_bytes: int
    gathered_parameter_bytes: int = 0
    offloaded_bytes: int = 0


def step_traffic(setting: Setting, params_total: int, params_trainable: int) -> StepTraffic:
    """Traffic of one step. Gradients travel in the weights' dtype (fp32 under plain DDP, half under
    DeepSpeed: ftplan.models.bytes_per_param); LoRA sends only the adapters' gradients, ZeRO-3 still gathers
    every frozen parameter."""
    size = weight_bytes(setting)
    return StepTraffic(
        gradient_bytes=params_trainable * size,
        gathered_parameter_bytes=params_total * size if setting.zero_stage == 3 else 0,
        offloaded_bytes=2 * params_trainable * size if setting.offload_optimizer else 0,  # gradients down, parameters up
    )


def communication_seconds(traffic: StepTraffic, gpus_per_node: int, nodes: int, links: Links,
                          bucket_bytes: int = DDP_BUCKET_BYTES) -> float:
    """Collective time of one step if nothing overlapped (host transfers excluded), bucket by bucket."""
    if traffic.gathered_parameter_bytes:
        gathers = 2 * bucketed_seconds(traffic.gathered_parameter_bytes, 1, gpus_per_node, nodes, links, bucket_bytes)
        return gathers + bucketed_seconds(traffic.gradient_bytes, 1, gpus_per_node, nodes, links, bucket_bytes)
    return bucketed_seconds(traffic.gradient_bytes, 2, gpus_per_node, nodes, links, bucket_bytes)


def exposed_communication_seconds(traffic: StepTraffic, compute_seconds: float, backward_seconds: float,
                                  gpus_per_node: int, nodes: int, links: Links, overlap: float = DEFAULT_OVERLAP,
                                  bucket_bytes: int = DDP_BUCKET_BYTES) -> float:
    """Collective seconds the step waits for.

    Without ZeRO-3 the gradient buckets hide behind backward as scheduled (exposed_bucket_seconds).
    ZeRO-3 also gathers every parameter in forward and again in backward, prefetched ahead of the
    layers that need them: the gathers and the gradient reduce-scatter hide behind the whole
    forward and backward, and what exceeds them, or at least the last bucket, is exposed.
    overlap scales the hidden part: 0 exposes everything, 1 hides what the schedule allows.
    """
    total = communication_seconds(traffic, gpus_per_node, nodes, links, bucket_bytes)
    if total <= 0:
        return 0.0
    if traffic.gathered_parameter_bytes:
        last = collective_seconds(gradient_buckets(traffic.gradient_bytes, bucket_bytes)[-1], 1, gpus_per_node,
                                  nodes, links) if traffic.gradient_bytes else 0.0
        scheduled = max(total - compute_seconds, last)
    else:
        scheduled = exposed_bucket_seconds(traffic.gradient_bytes, backward_seconds, 2, gpus_per_node, nodes, links,
                                           bucket_bytes)
    return total - overlap * (total - scheduled)
