"""Fits of calibration records: peak memory and step time against micro-batch, per setting and GPU.

One SettingFit per (setting without seq_len, GPU): it holds the records it came from, curves of
peak allocated memory and seconds per step, the allocator's overhead on top of allocated (which
makes reserved), and what the ladder observed at the top (the allocator wall, the first OOM). The
rule that turns a fit and a card into a batch size lives in models/safe_batch.py.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ftplan.core.architecture import Architecture, cached_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import find_gpu
from ftplan.core.settings import Setting
from ftplan.models.bytes_per_param import FP32_BYTES
from ftplan.models.curve import (
    Curve,
    Line,
    fit_convex_curve,
    line_below_points,
    top_slope,
    with_line,
    with_line_below_points,
)
from ftplan.models.prediction import Estimate
from ftplan.models.prior import (
    ComputeRate,
    LadderSlope,
    fit_compute_rate,
    fit_masked_attention_cost,
    ladder_slopes,
    logit_elements_per_sample,
    memory_terms,
)
from ftplan.models.wall import healthy_points

# Relative floors of the upper prediction bound, for fits whose few points leave residuals near zero.
ALLOCATED_FLOOR = 0.02
TIME_FLOOR = 0.05
# Share of the card kept free beyond the upper bound of reserved memory: the CUDA context (about
# 0.5 GiB, outside torch's reserved bytes) and NCCL buffers. The bound itself already carries the
# uncertainty (allocated upper bound + the largest allocator overhead seen in the setting), so a
# flat 5% on top ruled out every batch that needs more than 95% of the card: on the shipped H200
# ladders the largest fitting batches use 99.2% (qwen2.5-0.5b full, batch 19) and 96.2% (Llama-3-8B
# LoRA r16, batch 7) of it.
SAFETY_MARGIN = 0.02
# Reserved memory the unfused loss strands, per byte of one fp32 logits tensor (batch·seq·vocab·4).
# The caching allocator keeps the freed logits-sized blocks of the loss (upcast, log-softmax and
# their gradients) and cannot fit other tensors into them, so reserved − allocated grows with the
# logits while a constant overhead cannot follow: on the shipped H200 ladders (no Liger, seq 2048)
# it is 0.35 to 0.92 of one logits tensor at the largest fitting batch, median 0.70
# (`python benchmarks/accuracy.py` prints these), and an OOM then strikes with up to 35 GiB
# reserved but free (qwen2.5-0.5b with checkpointing, batch 32). The bound takes the largest share
# seen; the mean the share of the setting's own largest measured batch. Liger's fused loss builds
# no logits; its overhead stays at 1-3 GiB at any batch.
LOGIT_BLOCKS_HIGHEST = 0.92
MAX_BATCH = 4096      # search ceiling when memory stops growing with batch
# Measured per-sample memory (the steepest line of a whole ladder's fit) over the prior's count of
# stored activations and loss (models/activations.py), on every shipped and public ladder of five or
# more batches: 0.842 (Llama-3.2-3B + Liger + checkpointing, whose top line still mixes in the optimizer
# step's phase) to 1.058 (the public Llama-3-8B ZeRO-3 fp16 on 8×A100); every other H200 ladder is within
# 1.00-1.02 (tests/test_phase_model.py recomputes them from the data). The high end keeps room above the
# public runs' 1.058. A fitted slope below the low end means the points sit in another phase (the
# optimizer step), and never sets the large-batch slope.
ACTIVATION_SLOPE_LOW = 0.84
ACTIVATION_SLOPE_HIGH = 1.10


@dataclass(frozen=True)
class Overhead:
    """Reserved minus allocated memory (allocator cache and fragmentation) at each measured batch, in bytes.

    Interpolated between measured batches, not a constant: it grows with the logits the unfused loss
    strands, so the overhead of the largest batch overstated small ones by up to 67% of their
    reserved memory (qwen2.5-0.5b with checkpointing, batch 1: 22.7 GiB predicted, 13.6 GiB measured).
    It jumps by GiBs between neighbouring batches without a trend three points could extrapolate, so
    the bound takes the larger neighbour inside the measured range and the largest seen beyond it.
    A point whose reserved memory the card capped still counts: what the run wanted was at least that.

    step_blocks is set when every point sat in the optimizer step's phase: the step's transients (its peak
    above the activation phase's intercept) leave freed blocks in the cache that the larger, differently
    sized activations of big batches cannot reuse. Once the allocated peak outgrows every measured one
    they sit on top of it: on the H200, Llama-3.2-3B with checkpointing and Liger (a 20 GiB step above
    the activation line) had 20.7-26.9 GiB of overhead at batches 32-80 against 0.4-1.5 GiB at 1-8, and an
    OOM at 81 with 25 GiB reserved but free; Llama-3.2-1B likewise (7 GiB; 6.7-12.5 GiB at 128-240).

    growth is set when the points lie on the activation line: the overhead then grows with the activations
    the cache holds, by its measured share of each allocated byte. On the H200, Phi-3-mini LoRA with
    checkpointing (default allocator) grew 0.34 GiB per allocated GiB from batch 1 to 4 and kept that share
    to batch 84 (32.8 GiB reserved but free; the logits' share predicted 19); Gemma-3-1B LoRA 0.11 to 11.
    """

    points: tuple[tuple[float, float], ...]  # (batch·seq, overhead), sorted by tokens
    step_blocks: float = 0.0
    measured_top: float = 0.0  # the largest allocated peak measured
    growth: float = 0.0  # overhead per allocated byte beyond the measured points

    def grown(self, allocated: float) -> float:
        """The overhead of the largest measured batch, grown by its share of the allocated bytes beyond it."""
        if not self.points:
            return 0.0
        return self.points[-1][1] + self.growth * max(0.0, allocated - self.measured_top)

    def unseen_phase(self, allocated: float) -> float:
        """The optimizer step's stranded blocks, counted once the allocated peak outgrows every measured one
        (by more than the fit's floor, so a flat phase's rounding does not count)."""
        return self.step_blocks if allocated > self.measured_top * (1 + ALLOCATED_FLOOR) else 0.0

    @classmethod
    def fit(cls, records: list[dict]) -> Overhead:
        measured = sorted((float(r["micro_batch"] * r["seq_len"]), float(r["peak_reserved_bytes"] - r["peak_allocated_bytes"]))
                          for r in records if r.get("peak_reserved_bytes"))
        return cls(tuple(measured))

    @property
    def highest(self) -> float:
        return max((gap for _, gap in self.points), default=0.0)

    def at(self, tokens: float) -> Estimate:
        """Mean and bound of the overhead at batch·seq tokens; 0 without measurements (CPU: no caching allocator)."""
        if not self.points:
            return Estimate(0.0, 0.0)
        xs, gaps = zip(*self.points)
        mean = float(np.interp(tokens, xs, gaps))
        if tokens > xs[-1]:
            return Estimate(mean, self.highest)
        above = next(i for i, x in enumerate(xs) if x >= tokens)
        return Estimate(mean, max(gaps[max(0, above - 1)], gaps[above]))

    def to_json(self) -> dict:
        return {"points": [list(p) for p in self.points], "step_blocks": self.step_blocks,
                "measured_top": self.measured_top, "growth": self.growth}

    @classmethod
    def from_json(cls, data: dict) -> Overhead:
        return cls(tuple((float(x), float(gap)) for x, gap in data["points"]), float(data["step_blocks"]),
                   float(data["measured_top"]), float(data["growth"]))


@dataclass(frozen=True)
class SettingFit:
    """Memory and time of one setting on one GPU type, fitted from its records."""

    setting: dict           # Setting fields without seq_len
    gpu_name: str
    capacity_bytes: int | None
    allocated: Curve
    overhead: Overhead
    time: Curve
    walls: tuple[tuple[int, int], ...]  # (seq_len, batch) at the allocator wall
    records: tuple[dict, ...]
    compute_rate: ComputeRate | None = None  # learnt from other settings; sets the large-batch time slope
    logit_bytes_per_token: float = 0.0  # one fp32 logits tensor per token; 0 with Liger's fused loss

    def setting_at(self, seq_len: int) -> Setting:
        return Setting.from_dict({**self.setting, "seq_len": seq_len})

    @property
    def label(self) -> str:
        """e.g. 'llama-3-8b zero3 full gc s1024,2048 8gpu expandable_segments:True on A100-80GB'."""
        first = self.seq_lens[0]
        lengths = "s" + ",".join(str(s) for s in self.seq_lens)
        parts = [self.setting["model"], self.setting_at(first).label().replace(f"s{first}", lengths),
                 self.setting["alloc_conf"], "on", self.gpu_name]
        return " ".join(p for p in parts if p)

    @property
    def seq_lens(self) -> list[int]:
        return sorted({r["seq_len"] for r in self.records if r["status"] == "ok"})

    def covers(self, seq_len: int) -> bool:
        """A fit from one sequence length says nothing about another; several generalise."""
        return len(self.seq_lens) > 1 or seq_len in self.seq_lens

    def peak_allocated(self, batch: int, seq_len: int) -> Estimate:
        return self.allocated.predict(batch, seq_len)

    def peak_reserved(self, batch: int, seq_len: int) -> Estimate:
        """Allocated plus the allocator's overhead: as measured around this batch or, beyond the measured
        batches, the blocks that the logits or an unseen phase's optimizer step strand, or the measured overhead
        grown with the activations."""
        allocated = self.allocated.predict(batch, seq_len)
        tokens = batch * seq_len
        overhead = self.overhead.at(tokens)
        stranded = grown = Estimate(0.0, 0.0)
        if self.overhead.points and tokens > self.overhead.points[-1][0]:
            logits = tokens * self.logit_bytes_per_token
            stranded = Estimate(self.stranded_logit_share * logits, LOGIT_BLOCKS_HIGHEST * logits)
            grown = Estimate(self.overhead.grown(allocated.mean), self.overhead.grown(allocated.upper))
        return Estimate(mean=allocated.mean + max(overhead.mean, stranded.mean, grown.mean,
                                                  self.overhead.unseen_phase(allocated.mean)),
                        upper=allocated.upper + max(overhead.upper, stranded.upper, grown.upper,
                                                    self.overhead.unseen_phase(allocated.upper)))

    @property
    def stranded_logit_share(self) -> float:
        """Overhead per logits byte at the largest measured batch (capped by the bound's share)."""
        if not self.overhead.points:
            return 0.0
        tokens, gap = self.overhead.points[-1]
        logits = tokens * self.logit_bytes_per_token
        return min(gap / logits, LOGIT_BLOCKS_HIGHEST) if logits else 0.0

    def seconds_per_step(self, batch: int, seq_len: int) -> Estimate:
        """The time curve's estimate; beyond the calibrated tokens per step, the bound is at least the largest
        timed step's seconds per token: a step's time per token only falls as its fixed costs spread. A ladder
        whose small batches are launch-bound shows too shallow a slope (Phi-3-mini LoRA + Liger, 1, 2, 4: its
        batch 16 ran 12% over the line, and 6% over the curve's own bound)."""
        estimate = self.time.predict(batch, seq_len)
        if self._top_timed_step is None or batch * seq_len <= self._top_timed_step[0]:
            return estimate
        tokens, seconds = self._top_timed_step
        return replace(estimate, upper=max(estimate.upper, seconds * batch * seq_len / tokens))

    @cached_property
    def _top_timed_step(self) -> tuple[int, float] | None:
        """(tokens, seconds) of the timed step with the most tokens; found once, since a plan asks for hundreds
        of step times."""
        timed = [r for r in self.records if r["status"] == "ok" and r.get("seconds_per_step")]
        if not timed:
            return None
        top = max(timed, key=lambda r: r["micro_batch"] * r["seq_len"])
        return top["micro_batch"] * top["seq_len"], float(top["seconds_per_step"])

    def calibrated_batches(self, seq_len: int) -> list[int]:
        return sorted({r["micro_batch"] for r in self.records if r["status"] == "ok" and r["seq_len"] == seq_len})

    def largest_ok_batch(self, seq_len: int) -> int | None:
        return max(self.calibrated_batches(seq_len), default=None)

    def smallest_oom_batch(self, seq_len: int) -> int | None:
        """Smallest batch known to run out of memory at this length (an OOM at a shorter length counts too)."""
        return min((r["micro_batch"] for r in self.records
                    if r["status"] == "oom" and r["seq_len"] <= seq_len), default=None)

    def wall_batches(self, seq_len: int) -> list[int]:
        return [batch for seq, batch in self.walls if seq == seq_len]

    def observed_limit(self, seq_len: int) -> int | None:
        """Smallest batch seen at the wall or OOM at this or a shorter length: no safe batch reaches it."""
        limits = [batch for seq, batch in self.walls if seq <= seq_len]
        oom = self.smallest_oom_batch(seq_len)
        return min(limits + ([oom] if oom else []), default=None)

    def measured_healthy(self, seq_len: int) -> tuple[tuple[int, float], ...]:
        """(batch, measured peak reserved bytes) of the batches that ran ok at this length, clear of the
        wall and below the observed limit: evidence that outranks the fit's bound (models/safe_batch.py)."""
        limit = self.observed_limit(seq_len)
        walls = set(self.wall_batches(seq_len))
        return tuple(sorted((r["micro_batch"], float(r.get("peak_reserved_bytes") or r.get("peak_allocated_bytes") or math.inf))
                            for r in self.records
                            if r["status"] == "ok" and r["seq_len"] == seq_len and r["micro_batch"] not in walls
                            and (limit is None or r["micro_batch"] < limit)))

    @property
    def n_points(self) -> int:
        return self.allocated.n_points

    @property
    def r2(self) -> dict[str, float | None]:
        return {"memory": self.allocated.r2, "time": self.time.r2}

    def to_json(self) -> dict:
        return {"setting": self.setting, "gpu_name": self.gpu_name, "capacity_bytes": self.capacity_bytes,
                "peak_allocated": self.allocated.to_json(), "reserved_overhead": self.overhead.to_json(),
                "seconds_per_step": self.time.to_json(), "walls": [list(w) for w in self.walls],
                "compute_rate": self.compute_rate.to_json() if self.compute_rate else None,
                "logit_bytes_per_token": self.logit_bytes_per_token, "records": list(self.records)}

    @classmethod
    def from_json(cls, data: dict) -> SettingFit:
        return cls(setting=data["setting"], gpu_name=data["gpu_name"], capacity_bytes=data["capacity_bytes"],
                   allocated=Curve.from_json(data["peak_allocated"]),
                   overhead=Overhead.from_json(data["reserved_overhead"]),
                   time=Curve.from_json(data["seconds_per_step"]),
                   walls=tuple((int(s), int(b)) for s, b in data["walls"]), records=tuple(data["records"]),
                   compute_rate=ComputeRate.from_json(data["compute_rate"]),
                   logit_bytes_per_token=float(data["logit_bytes_per_token"]))


def setting_without_seq_len(data: dict) -> dict:
    """The setting fields of a record or Setting dict, less seq_len: what one fit generalises across."""
    setting = Setting.from_dict(data).to_dict()
    del setting["seq_len"]
    return setting


def same_run_key(setting: dict) -> str:
    """A setting's fields with the model replaced by its architecture's shape (the name when unknown)."""
    try:
        model = repr(cached_architecture(setting["model"]).shape)
    except FtplanError:
        model = setting["model"]
    return json.dumps({**setting, "model": model}, sort_keys=True)


def group_key(record: dict) -> tuple[str, str]:
    """(setting without seq_len, its architecture by shape; GPU) as a hashable key: what one fit covers."""
    return same_run_key(setting_without_seq_len(record)), str(record.get("gpu_name"))


def fit_setting(records: list[dict], compute_rate: ComputeRate | None = None) -> SettingFit:
    """Fit one group's ok/oom records; FtplanError when fewer than two healthy batch sizes exist.

    With a compute rate (learnt from other settings), step time also follows the physical per-sample
    cost beyond the calibrated batches, which launch-bound small batches cannot show.
    """
    records = [r for r in records if r["status"] in ("ok", "oom")]
    first = records[0]
    label = f"{first['model']} {Setting.from_dict(first).label()} on {first.get('gpu_name')}"  # settings span models
    healthy, walls = healthy_points(records)
    if len({(r["seq_len"], r["micro_batch"]) for r in healthy}) < 2:
        raise FtplanError(f"{label}: fewer than two healthy batch sizes measured, nothing to fit")
    allocated, step_blocks = with_activation_phase(
        fit_convex_curve(*_columns(healthy, "peak_allocated_bytes"), ALLOCATED_FLOOR), healthy, first)
    on_activation_line = not allocated.bound_lines and step_blocks == 0.0
    overhead = replace(Overhead.fit(healthy), step_blocks=step_blocks,
                       measured_top=max(float(r["peak_allocated_bytes"]) for r in healthy),
                       growth=overhead_growth(healthy) if on_activation_line else 0.0)
    timed = [r for r in healthy if r.get("seconds_per_step")]
    if len({r["micro_batch"] for r in timed}) < 2:
        raise FtplanError(f"{label}: fewer than two timed batch sizes measured, nothing to fit")
    time = fit_convex_curve(*_columns(timed, "seconds_per_step"), TIME_FLOOR)
    slopes = _compute_slopes(time, first, compute_rate) if compute_rate else None
    if slopes:
        time = with_line_below_points(time, slopes, *_columns(timed, "seconds_per_step"))
    elif time_falls_with_batch(timed):
        warnings.warn(f"{label}: step time fell as the batch grew ({time_ladder(timed)}), so the measurements are "
                      "noise-bound (a busy host?); beyond them time grows at the best measured seconds per sample",
                      NoisyLadderWarning, stacklevel=2)
        time = with_line_below_points(time, _per_sample_floor(time, timed), *_columns(timed, "seconds_per_step"))
    capacity = max((r.get("gpu_memory_total_bytes") or 0 for r in records), default=0) or None
    return SettingFit(setting=setting_without_seq_len(first), gpu_name=str(first.get("gpu_name")), capacity_bytes=capacity,
                      allocated=allocated, overhead=overhead, time=time, walls=walls,
                      records=tuple(records), compute_rate=compute_rate if slopes else None,
                      logit_bytes_per_token=_logit_bytes_per_token(first))


def overhead_growth(healthy: list[dict]) -> float:
    """Reserved-but-free bytes gained per allocated byte from the smallest to the largest measured batch."""
    measured = sorted((r for r in healthy if r.get("peak_reserved_bytes")),
                      key=lambda r: (r["micro_batch"] * r["seq_len"], r["micro_batch"]))
    if len(measured) < 2:
        return 0.0
    first, last = measured[0], measured[-1]
    allocated = float(last["peak_allocated_bytes"] - first["peak_allocated_bytes"])
    gained = float((last["peak_reserved_bytes"] - last["peak_allocated_bytes"])
                   - (first["peak_reserved_bytes"] - first["peak_allocated_bytes"]))
    return max(0.0, gained / allocated) if allocated > 0 else 0.0


def with_activation_phase(curve: Curve, healthy: list[dict], record: dict) -> tuple[Curve, float]:
    """The curve with the activation phase the architecture implies, where its points cannot show it, and
    the optimizer step's height above that phase's intercept (0 when the points show the phase).

    Peak memory is the largest of the phase peaks. When every calibrated batch sits in the optimizer
    step's phase (full fine-tuning with checkpointing and Liger: flat from batch 1 to 4), the fitted
    slope is about 0 and says nothing of the activations that dominate from batch ~16. Then the mean
    follows the prior's activation phase, moved by the prior's miss at the smallest measured batch (the
    prior knows where the phases cross; the points fix its level), and the bound follows the prior's
    per-sample bytes at their highest measured ratio. Both stay at or below the points: the activation
    phase cannot lie above what was measured. When no point lies on the activation line, the step's height
    above it is returned for the reserved memory (Overhead.step_blocks).
    """
    known = known_terms(record)
    if known is None:
        return curve, 0.0
    arch, setting = known
    seq_ref = curve.seq_ref or record["seq_len"]
    per_token = memory_terms(arch, setting).per_sample / setting.seq_len
    slopes = (per_token * seq_ref,) if curve.seq_ref is None else (per_token * seq_ref, 0.0)
    if top_slope(curve) >= ACTIVATION_SLOPE_LOW * slopes[0]:
        return curve, 0.0
    columns = _columns(healthy, "peak_allocated_bytes")
    smallest = min(healthy, key=lambda r: (r["micro_batch"] * r["seq_len"], r["micro_batch"]))
    terms = memory_terms(arch, setting.with_(seq_len=smallest["seq_len"]))
    miss = float(smallest["peak_allocated_bytes"]) - terms.peak(smallest["micro_batch"])
    prior_intercept = terms.backward_start_static + miss
    touching = line_below_points(curve, slopes, *columns)
    curve = with_line(curve, Line(min(prior_intercept, touching.intercept), touching.slopes), *columns)
    steepest = line_below_points(curve, tuple(ACTIVATION_SLOPE_HIGH * s for s in slopes), *columns)
    # no point on the activation line: every one sat in the step's phase, whose height the cache keeps
    step_blocks = max(0.0, max(columns[2]) - prior_intercept) if prior_intercept < touching.intercept else 0.0
    return replace(curve, bound_lines=(steepest,)), step_blocks


def known_terms(record: dict) -> tuple[Architecture, Setting] | None:
    """The record's architecture and setting; None for an architecture not known here (its terms drop out)."""
    try:
        return cached_architecture(record["model"]), Setting.from_dict(record)
    except FtplanError:
        return None


def _logit_bytes_per_token(record: dict) -> float:
    """Bytes of one fp32 logits tensor per token; 0 for an unknown architecture (no term)."""
    known = known_terms(record)
    return logit_elements_per_sample(*known) * FP32_BYTES / known[1].seq_len if known else 0.0


class NoisyLadderWarning(Warning):
    """Step times that contradict any real run: kept apart from the warnings about groups too small to fit,
    which planning silences, because a plan resting on them must say so."""


# A launch-bound GPU ladder is flat within a few %; a step this much faster at the largest batch than at the
# smallest is noise, not physics.
NOISY_LADDER_DROP = 0.9


def time_falls_with_batch(timed: list[dict]) -> bool:
    """Whether some length's largest batch ran clearly faster a step than its smallest: no real run does, so the
    ladder is noise (a loaded CPU host ran batch 4 in 3.2 s and batch 1 in 4.2), and its flat fit would price
    a batch of 432 at batch 1's step time."""
    by_length: dict[int, list[dict]] = {}
    for record in timed:
        by_length.setdefault(record["seq_len"], []).append(record)
    ladders = [sorted(group, key=lambda r: r["micro_batch"]) for group in by_length.values() if len(group) > 1]
    return any(ladder[-1]["seconds_per_step"] < NOISY_LADDER_DROP * ladder[0]["seconds_per_step"] for ladder in ladders)


def time_ladder(timed: list[dict]) -> str:
    return ", ".join(f"batch {r['micro_batch']}: {r['seconds_per_step']:.3g} s"
                     for r in sorted(timed, key=lambda r: (r["seq_len"], r["micro_batch"])))


def _per_sample_floor(time: Curve, timed: list[dict]) -> tuple[float, ...]:
    """Slopes of the line through the origin under every point: a sample costs at least the best measured
    seconds per sample (a GPU's per-sample time only falls with the batch, so beyond the ladder this is
    conservative, never free)."""
    batch, seq_len, y = _columns(timed, "seconds_per_step")
    first = time.features(batch, seq_len)[:, 0]
    return (float(np.min(y / first)),) + (0.0,) * (len(time.lines[0].slopes) - 1)


def _compute_slopes(time: Curve, record: dict, rate: ComputeRate) -> tuple[float, ...] | None:
    """The compute rate's seconds per sample as slopes on the time curve's features; None for an
    unknown GPU or architecture. Per-sample cost is a·seq + c·seq² (attention), which is exactly
    the curve's (batch·seq/ref, batch·(seq/ref)²) form when several lengths were calibrated."""
    try:
        arch, gpu = cached_architecture(record["model"]), find_gpu(str(record.get("gpu_name")))
    except FtplanError:
        return None
    setting = Setting.from_dict(record)

    def per_sample(seq: int) -> float:
        return rate.seconds_per_sample(arch, setting.with_(seq_len=seq), gpu)

    if time.seq_ref is None:
        return (per_sample(setting.seq_len),)
    lengths = np.array([time.seq_ref, time.seq_ref // 2], float)
    ratios = lengths / time.seq_ref
    linear, quadratic = np.linalg.solve(np.column_stack([ratios, ratios**2]),
                                        [per_sample(int(s)) for s in lengths])
    return float(linear), float(quadratic)


def compute_rate_for(gpu_name: str, others: list[LadderSlope], masked_attention_cost: float = 0.0) -> ComputeRate | None:
    """The compute rate of other settings' ladders on this GPU type; None without any.

    Other GPUs are left out: MFU moves with the card's balance of compute, bandwidth and launch
    overhead, and the public A100 ladders predicted from RTX 3090 ones were worse than without.
    """
    try:
        gpu = find_gpu(gpu_name)
    except FtplanError:
        return None
    return fit_compute_rate([s for s in others if s.gpu == gpu], masked_attention_cost)


def _columns(records: list[dict], key: str) -> tuple[list[int], list[int], list[float]]:
    return ([r["micro_batch"] for r in records], [r["seq_len"] for r in records], [float(r[key]) for r in records])


def with_gpu_names(records: list[dict]) -> list[dict]:
    """The records, each with its GPU's name. A trial that died of OOM may not have learnt it; it takes the
    name that trials of the same setting on the same machine recorded, so the OOM still bounds their fit
    (and shows on their chart)."""
    names = {(r["setting_key"], r.get("machine_id")): r["gpu_name"] for r in records if r.get("gpu_name")}
    return [record if record.get("gpu_name") else
            {**record, "gpu_name": names.get((record["setting_key"], record.get("machine_id")))}
            for record in records]


def group_records(records: list[dict]) -> list[list[dict]]:
    """ok/oom records grouped by (setting without seq_len, GPU)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in with_gpu_names(records):
        if record["status"] in ("ok", "oom"):
            groups.setdefault(group_key(record), []).append(record)
    return list(groups.values())


def fit_groups(records: list[dict]) -> list[SettingFit]:
    """One fit per (setting without seq_len, GPU), each with the compute rate of all the *other*
    groups' ladders; groups that cannot be fitted are skipped with a warning."""
    groups = group_records(records)
    slopes = [ladder_slopes(group) for group in groups]
    masked_cost = fit_masked_attention_cost(records)
    fits = []
    for index, group in enumerate(groups):
        others = [s for other, found in enumerate(slopes) if other != index for s in found]
        try:
            fits.append(fit_setting(group, compute_rate_for(str(group[0].get("gpu_name")), others, masked_cost)))
        except FtplanError as exc:
            warnings.warn(f"{exc}; skipped", UserWarning, stacklevel=2)
    return fits
