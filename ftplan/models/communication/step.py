"""Seconds per data-parallel step: the slowest rank's compute, the collectives that do not hide behind backward,
host transfers.

Every step waits for the slowest rank: with step times spread by a coefficient of variation cv,
the expected maximum of N of them is mean x (1 + cv x z_N), z_N the expected maximum of N standard
normal draws (Blom's approximation; it grows like sqrt(2 ln N)).

Gradient accumulation over k micro-batches changes what a step communicates, by stack
(data_parallel_step_seconds(micro_steps=k, zero_stage=...)): DDP under no_sync and ZeRO-1 reduce
once, in the last backward, and the ranks meet once, so the slowest rank's lead is that of a sum of
k micro-steps (its spread shrinks as 1/sqrt(k)); ZeRO-2 and ZeRO-3 reduce-scatter after every
backward, because each rank keeps only its own partition of the gradients (deepspeedai/DeepSpeed#2252),
and ZeRO-1/2 all-gather the updated parameters once, after the optimizer step.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ftplan.core.errors import FtplanError
from ftplan.models.communication.collectives import (
    DDP_BUCKET_BYTES,
    bucketed_seconds,
    exposed_bucket_seconds,
    host_transfer_seconds,
)
from ftplan.models.communication.links import Links
from ftplan.models.communication.traffic import (
    DEFAULT_BACKWARD_FRACTION,
    DEFAULT_OVERLAP,
    StepTraffic,
    exposed_communication_seconds,
)


def expected_max_normal(ranks: int) -> float:
    """E[max of `ranks` standard normal draws] by Blom's approximation, Phi^-1((N - 0.375)/(N + 0.25)):
    0.589 at N=2 (exact 0.564), within 1% of the exact value from N=8 on (2.58 at 128), where
    sqrt(2 ln N) overstates it (1.18 at 2, 3.11 at 128)."""
    if ranks <= 1:
        return 0.0
    return -statistics.NormalDist().inv_cdf(0.625 / (ranks + 0.25))  # the upper tail by symmetry: exact for any N


def straggler_factor(step_time_cv: float, ranks: int) -> float:
    """Expected slowest of `ranks` step times over their mean: 1 + cv x E[max of N standard normals]."""
    return 1.0 + step_time_cv * expected_max_normal(ranks)


@dataclass(frozen=True)
class _DataParallelStep:
    """The arguments of data_parallel_step_seconds, checked once, so each stack's pricing reads only its own terms."""

    compute_seconds: float
    traffic: StepTraffic
    gpus_per_node: int
    nodes: int
    links: Links
    overlap: float
    step_time_cv: float
    backward_fraction: float
    bucket_bytes: int
    micro_steps: int
    zero_stage: int

    def __post_init__(self) -> None:
        if self.compute_seconds < 0 or self.traffic.gradient_bytes < 0 or self.traffic.gathered_parameter_bytes < 0:
            raise FtplanError("compute seconds and traffic bytes must be >= 0")
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise FtplanError(f"GPU and node counts must be positive, got {self.gpus_per_node} x {self.nodes}")
        if not 0 <= self.overlap <= 1 or not 0 <= self.backward_fraction <= 1:
            raise FtplanError(f"overlap and backward fraction must lie in [0, 1], got {self.overlap} and "
                              f"{self.backward_fraction}")
        if self.step_time_cv < 0:
            raise FtplanError(f"step-time coefficient of variation must be >= 0, got {self.step_time_cv}")
        if self.bucket_bytes < 1:
            raise FtplanError(f"gradient bucket size must be positive, got {self.bucket_bytes}")
        if self.micro_steps < 1 or self.zero_stage not in (0, 1, 2, 3):
            raise FtplanError(f"micro-steps must be positive and the ZeRO stage 0-3, got {self.micro_steps} and "
                              f"{self.zero_stage}")

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def backward_seconds(self) -> float:
        return self.backward_fraction * self.compute_seconds

    def seconds(self) -> float:
        """The stacks differ in when gradients travel, so each has its own sum; host transfers are never hidden."""
        if self.ranks == 1:
            return self.micro_steps * self.compute_seconds  # a one-GPU step already holds its own host transfers
        host = host_transfer_seconds(self.traffic.offloaded_bytes, self.ranks, self.links)
        if self.traffic.gathered_parameter_bytes or self.zero_stage == 3:
            return self._gathering_every_micro_step() + host
        if self.zero_stage == 2 and self.micro_steps > 1:
            return self._scattering_every_micro_step() + host
        return self._reducing_once() + host

    def _gathering_every_micro_step(self) -> float:
        """ZeRO-3 gathers parameters and reduce-scatters gradients in every micro-step, so each one meets the other
        ranks."""
        exposed = exposed_communication_seconds(self.traffic, self.compute_seconds, self.backward_seconds,
                                                self.gpus_per_node, self.nodes, self.links, self.overlap,
                                                self.bucket_bytes)
        return self.micro_steps * (self.compute_seconds * straggler_factor(self.step_time_cv, self.ranks) + exposed)

    def _scattering_every_micro_step(self) -> float:
        """ZeRO-2 keeps only its gradient partition, so it reduce-scatters after every backward; the all-gather of
        the updated parameters (as many bytes) comes once, after the optimizer step, where nothing hides it."""
        gradient_bytes = self.traffic.gradient_bytes
        one_pass = bucketed_seconds(gradient_bytes, 1, self.gpus_per_node, self.nodes, self.links, self.bucket_bytes)
        scheduled = exposed_bucket_seconds(gradient_bytes, self.backward_seconds, 1, self.gpus_per_node, self.nodes,
                                           self.links, self.bucket_bytes)
        scatter = one_pass - self.overlap * (one_pass - scheduled)
        gather = one_pass
        return (self.micro_steps * (self.compute_seconds * straggler_factor(self.step_time_cv, self.ranks) + scatter)
                + gather)

    def _reducing_once(self) -> float:
        """DDP under no_sync and ZeRO-1 reduce in the last backward only: the ranks meet once, on the sum of their
        micro-steps, whose spread is cv / sqrt(micro_steps) if micro-steps vary independently."""
        exposed = exposed_communication_seconds(StepTraffic(self.traffic.gradient_bytes), self.compute_seconds,
                                                self.backward_seconds, self.gpus_per_node, self.nodes, self.links,
                                                self.overlap, self.bucket_bytes)
        spread = self.step_time_cv / math.sqrt(self.micro_steps)
        return self.micro_steps * self.compute_seconds * straggler_factor(spread, self.ranks) + exposed


def data_parallel_step_seconds(compute_seconds: float, gradient_bytes: int, gpus_per_node: int, nodes: int,
                               links: Links, overlap: float = DEFAULT_OVERLAP, step_time_cv: float = 0.0,
                               backward_fraction: float = DEFAULT_BACKWARD_FRACTION, *,
                               gathered_parameter_bytes: int = 0, offloaded_bytes: int = 0,
                               bucket_bytes: int = DDP_BUCKET_BYTES, micro_steps: int = 1,
                               zero_stage: int = 0) -> float:
    """Seconds per optimizer step of micro_steps micro-batches on gpus_per_node x nodes GPUs.

    compute_seconds is one GPU's micro-step without communication (per-step overheads and the
    optimizer step included: they stay whole with more GPUs); backward is backward_fraction of it.
    Every synchronisation waits for the slowest rank (straggler_factor); collectives hide behind
    backward as the bucket schedule allows (exposed_communication_seconds); host transfers of CPU
    offload are not hidden.

    With micro_steps > 1 (gradient accumulation) zero_stage says when gradients travel: 0 (DDP's
    no_sync) and 1 all-reduce once, in the last backward, and the ranks wait for each other once,
    on the sum of their micro-steps, whose spread is cv / sqrt(micro_steps) if micro-steps vary
    independently; 2 reduce-scatters the gradients after every backward and all-gathers the updated
    parameters (as many bytes as the gradients) once, after the optimizer step, where nothing hides
    it; ZeRO-3 (gathered_parameter_bytes > 0) gathers and reduce-scatters in every micro-step.
    With one micro-step and zero_stage 0 or 1 a ZeRO-2 step is costed as the all-reduce it equals
    in volume.
    """
    traffic = StepTraffic(gradient_bytes, gathered_parameter_bytes, offloaded_bytes)
    return _DataParallelStep(compute_seconds, traffic, gpus_per_node, nodes, links, overlap, step_time_cv,
                             backward_fraction, bucket_bytes, micro_steps, zero_stage).seconds()
