"""Seconds per data-parallel step: compute, gradient (and ZeRO-3 parameter) traffic, stragglers.

One step on N = gpus_per_node x nodes ranks (each with the same micro-batch, so the per-step
overheads a single GPU pays, data loading, the optimizer step of an unpartitioned model and the
Python between kernels, stay whole on every rank; they never shrink with more GPUs) costs

    the slowest rank's compute  +  the collectives that do not hide behind backward  +  host transfers.

Collectives follow the cost model of NCCL's own tuner (src/graph/tuning.cc, ncclTopoTuneModel and
ncclTopoGetAlgoTime): time = a base latency + hops x per-hop latency + bytes / bandwidth, where a
flat ring all-reduce takes 2(N-1) hops, 2(nodes-1) of them over the network, and moves
2(N-1)/N x bytes per link, and a tree takes 2((N/nodes - 1) + log2(nodes)) hops and moves 2 x bytes.
NCCL runs whichever is faster for the message size, so small messages at many ranks ride the tree
(latency-bound, logarithmic in the node count) and large ones the ring (bandwidth-bound).

PyTorch DDP all-reduces gradients in buckets (bucket_cap_mb, 25 MB; the first bucket 1 MiB) as
backward produces them, one bucket after another on one communication stream: only what is still
in flight when backward ends is exposed. LoRA's few megabytes of adapter gradients fill one bucket
that is ready only at the very end, so nearly all of their all-reduce is exposed; a full model's
gigabytes fill hundreds of buckets that mostly hide.

Between nodes without RDMA (no InfiniBand, EFA or RoCE) NCCL runs its socket transport: data
bounce through host memory and CPU proxy threads push them into TCP sockets. One GPU per node gets
close to the line rate, but when several GPUs of a node share its NIC the bus bandwidth falls to
about half of it (data/tcp_allreduce.csv: all_reduce_perf runs published in NVIDIA/nccl#209, #398
and #450). socket_sharing_factor() carries that ratio into the ring and tree bandwidth terms.

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

import csv
import difflib
import functools
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ftplan.core.errors import FtplanError
from ftplan.core.paths import data_dir
from ftplan.core.settings import Setting
from ftplan.core.units import GB
from ftplan.models.bytes_per_param import weight_bytes

DEFAULT_BACKWARD_FRACTION = 2 / 3  # backward is about twice the forward's FLOPs
# The fraction of what the bucket schedule can hide behind backward that is hidden. 1 is DDP's own
# schedule (buckets launched as they fill); multi-GPU calibrations measure it (estimate_overlap).
DEFAULT_OVERLAP = 1.0
# torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25), and the first bucket's 1 MiB
# (kDefaultFirstBucketBytes in torch/csrc/distributed/c10d/reducer.hpp; pytorch/pytorch#118421).
DDP_BUCKET_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20
# NCCL's base latency of a collective (tuning.cc baseLat, Ring/Simple, 8.4 us): the launch and
# synchronisation every all-reduce pays once, whatever its size and rank count.
COLLECTIVE_BASE_LATENCY_S = 8.4e-6


@dataclass(frozen=True)
class Links:
    """Bandwidths (GB/s, 1e9 bytes/s, per direction) and per-hop latencies of one cluster.

    inter_node_gbs is what one node can send to the others in total (all its GPUs share it);
    host_gbs is the GPU-host link used by CPU offload. step_time_cv is the spread of one rank's step
    times on this cluster (None: the calibration records' own spread).
    """

    intra_node_gbs: float
    inter_node_gbs: float
    intra_latency_s: float
    inter_latency_s: float
    host_gbs: float
    source: str = "catalog"
    step_time_cv: float | None = None
    inter_socket: bool = False  # the network link runs NCCL's socket transport (TCP, no RDMA)

    def __post_init__(self) -> None:
        for name in ("intra_node_gbs", "inter_node_gbs", "host_gbs"):
            if not getattr(self, name) > 0:
                raise FtplanError(f"link bandwidth {name} must be positive, got {getattr(self, name)}")
        for name in ("intra_latency_s", "inter_latency_s"):
            if not getattr(self, name) >= 0:
                raise FtplanError(f"link latency {name} must be >= 0, got {getattr(self, name)}")
        if self.step_time_cv is not None and not 0 <= self.step_time_cv <= 10:
            raise FtplanError(f"step-time coefficient of variation must lie in [0, 10], got {self.step_time_cv}")


@dataclass(frozen=True)
class NetworkLink:
    """One row of data/networks.csv: a link a user can name instead of measuring."""

    name: str
    bandwidth_gbs: float
    latency_s: float
    description: str
    source: str
    transport: str = "socket"  # nvlink, pcie, rdma or socket (NCCL's TCP transport)


def _shipped_rows(path: Path, what: str) -> list[dict[str, str]]:
    """The rows of a shipped CSV as text (the csv module: pandas would double a plan's start-up)."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
    except (OSError, ValueError, csv.Error) as exc:  # ValueError: bytes that are not UTF-8
        raise FtplanError(f"cannot read {what} {path}: {exc}") from None


def _network_rows() -> list[dict]:
    return _shipped_rows(data_dir() / "networks.csv", "network catalog")


def _link(row: dict) -> NetworkLink:
    return NetworkLink(row["name"], float(row["bandwidth_gbs"]), float(row["latency_us"]) * 1e-6,
                       row["description"], row["source"], row["transport"])


def load_network_catalog() -> dict[str, NetworkLink]:
    return {row["name"]: _link(row) for row in _network_rows()}


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().split("(")[0])


def find_link(name: str) -> NetworkLink:
    """A catalog link by name or alias ('nvlink4', 'NVLink 4', 'PCIe 4.0 x16', 'cloud', 'efa')."""
    rows = _network_rows()
    by_alias = {}
    for row in rows:
        for alias in [row["name"], *str(row["aliases"]).split(";")]:
            by_alias.setdefault(_normalise(alias), row)
    wanted = _normalise(name)
    if wanted in by_alias:
        return _link(by_alias[wanted])
    names = [row["name"] for row in rows]
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names)}"
    raise FtplanError(f"unknown link '{name}'{hint}")


def links_from_catalog(intra: str = "nvlink4", inter: str = "cloud", host: str = "pcie4-x16") -> Links:
    """Nominal links by catalog name; the GPU catalog's interconnect text is a valid intra name."""
    intra_link, inter_link, host_link = find_link(intra), find_link(inter), find_link(host)
    return Links(intra_link.bandwidth_gbs, inter_link.bandwidth_gbs, intra_link.latency_s,
                 inter_link.latency_s, host_link.bandwidth_gbs, source="catalog",
                 inter_socket=inter_link.transport == "socket")


MAX_BANDWIDTH_GBS = 1e7  # as for the GPU catalog: ten thousand times today's fastest links
MIN_BANDWIDTH_GBS = 1e-6  # 1 kB/s: below it transfer times overflow to infinity (1e-320 ended plan in a traceback)
_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*([kmgt]?)(b|bit|byte)?(?:/s|ps)?\s*$", re.IGNORECASE)
_SCALE = {"": 1e9, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str) -> float:
    """GB/s from '600MB/s', '25Gbit/s', '0.6' (GB/s) or a catalog name ('cloud', '100gbe')."""
    match = _BANDWIDTH.match(text)
    if not match:
        try:
            return find_link(text).bandwidth_gbs
        except FtplanError:
            raise FtplanError(f"cannot read bandwidth '{text}': give e.g. 600MB/s, 25Gbit/s, 0.6 (GB/s) "
                              f"or a link name ({', '.join(load_network_catalog())})") from None
    number, prefix, unit = float(match[1]), match[2].lower(), match[3] or ""
    bits = unit.lower() == "bit" or unit == "b"  # Gb/s, Gbit/s are bits; GB/s, GByte/s bytes
    value = number * _SCALE[prefix] / (8 if bits else 1) / GB
    if not MIN_BANDWIDTH_GBS <= value <= MAX_BANDWIDTH_GBS:  # 1e309 reads as infinity: a link that prices nothing
        raise FtplanError(f"bandwidth must be between {MIN_BANDWIDTH_GBS:g} and {MAX_BANDWIDTH_GBS:g} GB/s, got '{text}'")
    return value


def calibrated_links(network_records: Iterable[dict], base: Links) -> Links:
    """base with measured figures in place of nominal ones: the latest NCCL record of several GPUs
    on one node gives the intra-node link, the latest record of one rank per node over several
    nodes the inter-node link (loopback gloo runs measure neither and are ignored)."""
    latest = sorted(network_records, key=lambda r: r.get("timestamp", ""))
    intra = [r for r in latest if r.get("nodes", 1) == 1 and r["backend"] == "nccl" and r["ranks"] > 1]
    inter = [r for r in latest if r.get("nodes", 1) > 1 and r.get("ranks_per_node") == 1]
    if not intra and not inter:
        return base
    links = base
    if intra:
        links = replace(links, intra_node_gbs=intra[-1]["bandwidth_gbs"], intra_latency_s=intra[-1]["latency_s"])
    if inter:
        links = replace(links, inter_node_gbs=inter[-1]["bandwidth_gbs"], inter_latency_s=inter[-1]["latency_s"])
    return replace(links, source="calibrated")


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


def describe_layout(gpus_per_node: int, nodes: int) -> str:
    """'16 GPUs in all: 2 nodes × 8 GPUs', the words every command prints for a layout."""
    gpus = gpus_per_node * nodes
    if nodes == 1:
        return f"{gpus} GPU{'s' if gpus > 1 else ''} in all: one node"
    return f"{gpus} GPUs in all: {nodes} nodes × {gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''}"


@functools.cache
def _socket_fractions() -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(GPUs per node, median fraction of line rate) of the published socket-transport runs, one
    entry per GPUs-per-node count, each as a fraction of the one-GPU-per-node median."""
    fractions: dict[int, list[float]] = {}
    for row in _shipped_rows(data_dir() / "tcp_allreduce.csv", "socket-transport measurements"):
        fractions.setdefault(int(row["gpus_per_node"]), []).append(
            (float(row["bus_gbit_s_low"]) + float(row["bus_gbit_s_high"])) / 2 / float(row["line_gbit_s"]))
    medians = {count: statistics.median(values) for count, values in sorted(fractions.items())}
    return tuple(medians), tuple(min(1.0, m / medians[1]) for m in medians.values())


def socket_sharing_factor(gpus_per_node: int) -> float:
    """Bus bandwidth of NCCL's socket transport when gpus_per_node GPUs share a node's NIC, over
    what one GPU per node gets (data/tcp_allreduce.csv: the median of the published runs at each
    count, a range quoted by its source counted as its middle).

    The runs hold 1 or 8 GPUs per node (0.49 at 8); counts in between are interpolated linearly
    and counts above the largest take its figure: no published run checks 2 to 4 GPUs per node.
    """
    counts, fractions = _socket_fractions()
    return float(np.interp(gpus_per_node, counts, fractions))


def _network_bandwidth(gpus_per_node: int, nodes: int, links: Links) -> float:
    """Bytes/s of the slowest link a multi-rank ring or tree crosses: the node's network link,
    shared by its GPUs (socket_sharing_factor over TCP), or the link inside the node."""
    if nodes == 1:
        return links.intra_node_gbs * GB
    inter = links.inter_node_gbs * (socket_sharing_factor(gpus_per_node) if links.inter_socket else 1.0)
    return min(inter, links.intra_node_gbs) * GB


def ring_seconds(nbytes: float, passes: int, gpus_per_node: int, nodes: int, links: Links) -> float:
    """A flat ring over every rank: passes=2 all-reduce, 1 all-gather or reduce-scatter.

    passes x (N-1) hops, passes x (nodes-1) of them over the network (tuning.cc nsteps, nInterSteps);
    each link carries passes x (N-1)/N x bytes, so the node's network link, shared by its GPUs, carries
    no more than one GPU's share.
    """
    ranks = gpus_per_node * nodes
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    hops, network_hops = passes * (ranks - 1), passes * (nodes - 1)
    latency = (COLLECTIVE_BASE_LATENCY_S + (hops - network_hops) * links.intra_latency_s
               + network_hops * links.inter_latency_s)
    return latency + passes * (ranks - 1) / ranks * nbytes / _network_bandwidth(gpus_per_node, nodes, links)


def tree_seconds(nbytes: float, gpus_per_node: int, nodes: int, links: Links) -> float:
    """NCCL's tree all-reduce: a chain inside each node, a binary tree across nodes, reduce then
    broadcast; 2 x ((GPUs per node - 1) + ceil(log2 nodes)) hops, 2 x bytes over the slowest link."""
    if gpus_per_node * nodes <= 1 or nbytes <= 0:
        return 0.0
    latency = (COLLECTIVE_BASE_LATENCY_S + 2 * (gpus_per_node - 1) * links.intra_latency_s
               + 2 * math.ceil(math.log2(nodes)) * links.inter_latency_s)
    return latency + 2 * nbytes / _network_bandwidth(gpus_per_node, nodes, links)


def collective_seconds(nbytes: float, passes: int, gpus_per_node: int, nodes: int, links: Links) -> float:
    """An all-reduce (passes=2: ring or tree, whichever is faster, as NCCL's tuner picks) or an
    all-gather / reduce-scatter (passes=1: ring)."""
    ring = ring_seconds(nbytes, passes, gpus_per_node, nodes, links)
    return min(ring, tree_seconds(nbytes, gpus_per_node, nodes, links)) if passes == 2 else ring


def allreduce_seconds(nbytes: float, gpus_per_node: int, nodes: int, links: Links) -> float:
    return collective_seconds(nbytes, 2, gpus_per_node, nodes, links)


def gradient_buckets(nbytes: int, bucket_bytes: int = DDP_BUCKET_BYTES,
                     first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES) -> list[int]:
    """Bucket sizes in the order backward fills them: DDP's small first bucket, then full ones, the
    remainder last (the gradients of the first layers, ready when backward ends)."""
    if nbytes <= 0:
        return []
    sizes = [min(nbytes, first_bucket_bytes)]
    left = nbytes - sizes[0]
    while left > 0:
        sizes.append(min(left, bucket_bytes))
        left -= sizes[-1]
    return sizes


def exposed_bucket_seconds(nbytes: int, backward_seconds: float, passes: int, gpus_per_node: int, nodes: int,
                           links: Links, bucket_bytes: int = DDP_BUCKET_BYTES) -> float:
    """Seconds of gradient collectives still running when backward ends.

    Gradients appear uniformly over backward; each bucket is launched when it is full and the
    previous one is done (one communication stream), and costs its own latency and bandwidth terms.
    """
    stream_free, produced = 0.0, 0
    for size in gradient_buckets(nbytes, bucket_bytes):
        produced += size
        ready = backward_seconds * produced / nbytes
        stream_free = max(stream_free, ready) + collective_seconds(size, passes, gpus_per_node, nodes, links)
    return max(0.0, stream_free - backward_seconds)


def communication_seconds(traffic: StepTraffic, gpus_per_node: int, nodes: int, links: Links,
                          bucket_bytes: int = DDP_BUCKET_BYTES) -> float:
    """Collective time of one step if nothing overlapped (host transfers excluded), bucket by bucket."""
    if traffic.gathered_parameter_bytes:
        gathers = 2 * sum(collective_seconds(b, 1, gpus_per_node, nodes, links)
                          for b in gradient_buckets(traffic.gathered_parameter_bytes, bucket_bytes))
        return gathers + sum(collective_seconds(b, 1, gpus_per_node, nodes, links)
                             for b in gradient_buckets(traffic.gradient_bytes, bucket_bytes))
    return sum(allreduce_seconds(b, gpus_per_node, nodes, links) for b in gradient_buckets(traffic.gradient_bytes, bucket_bytes))


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


def host_transfer_seconds(offloaded_bytes: int, ranks: int, links: Links) -> float:
    """Offload traffic of one rank: its partition of gradients and parameters over the host link.

    A single-GPU calibration with offload already contains host_transfer_seconds(bytes, 1, links).
    """
    return offloaded_bytes / ranks / (links.host_gbs * GB)


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
    if compute_seconds < 0 or gradient_bytes < 0 or gathered_parameter_bytes < 0:
        raise FtplanError("compute seconds and traffic bytes must be >= 0")
    if gpus_per_node < 1 or nodes < 1:
        raise FtplanError(f"GPU and node counts must be positive, got {gpus_per_node} x {nodes}")
    if not 0 <= overlap <= 1 or not 0 <= backward_fraction <= 1:
        raise FtplanError(f"overlap and backward fraction must lie in [0, 1], got {overlap} and {backward_fraction}")
    if step_time_cv < 0:
        raise FtplanError(f"step-time coefficient of variation must be >= 0, got {step_time_cv}")
    if bucket_bytes < 1:
        raise FtplanError(f"gradient bucket size must be positive, got {bucket_bytes}")
    if micro_steps < 1 or zero_stage not in (0, 1, 2, 3):
        raise FtplanError(f"micro-steps must be positive and the ZeRO stage 0-3, got {micro_steps} and {zero_stage}")
    ranks = gpus_per_node * nodes
    if ranks == 1:
        return micro_steps * compute_seconds  # a one-GPU step already holds its own host transfers
    backward = backward_fraction * compute_seconds
    host = host_transfer_seconds(offloaded_bytes, ranks, links)
    if gathered_parameter_bytes or zero_stage == 3:
        traffic = StepTraffic(gradient_bytes, gathered_parameter_bytes, offloaded_bytes)
        exposed = exposed_communication_seconds(traffic, compute_seconds, backward, gpus_per_node, nodes, links,
                                                overlap, bucket_bytes)
        return micro_steps * (compute_seconds * straggler_factor(step_time_cv, ranks) + exposed) + host
    if zero_stage == 2 and micro_steps > 1:
        one_pass = sum(collective_seconds(b, 1, gpus_per_node, nodes, links)
                       for b in gradient_buckets(gradient_bytes, bucket_bytes))  # a reduce-scatter or all-gather
        scheduled = exposed_bucket_seconds(gradient_bytes, backward, 1, gpus_per_node, nodes, links, bucket_bytes)
        scatter = one_pass - overlap * (one_pass - scheduled)
        gather = one_pass
        return micro_steps * (compute_seconds * straggler_factor(step_time_cv, ranks) + scatter) + gather + host
    exposed = exposed_communication_seconds(StepTraffic(gradient_bytes), compute_seconds, backward, gpus_per_node,
                                            nodes, links, overlap, bucket_bytes)
    spread = step_time_cv / math.sqrt(micro_steps)
    return micro_steps * compute_seconds * straggler_factor(spread, ranks) + exposed + host


def step_time_cv(records: Iterable[dict]) -> float:
    """Pooled coefficient of variation of step times: each ok record's timed steps (3 or more) as
    deviations from that record's own mean, pooled over records (one degree of freedom per record).

    Pooled rather than a median of per-record spreads: the slowest rank is a tail statistic, and the
    records whose steps vary most are the ones a median would drop. On the shipped H200 records the
    pooled figure (0.033) is over four times the median (0.007), and even it, through a normal tail,
    understates the resampled slowest of 128 steps (about 1.12 x the mean against 1.09:
    tests/test_multinode_model.py).
    """
    squares, degrees = 0.0, 0
    for record in records:
        steps = record.get("step_seconds") or []
        if record.get("status") != "ok" or len(steps) < 3:
            continue
        mean = statistics.fmean(steps)
        if mean <= 0:
            continue
        squares += sum((t / mean - 1) ** 2 for t in steps)
        degrees += len(steps) - 1
    return math.sqrt(squares / degrees) if degrees else 0.0


@dataclass(frozen=True)
class OverlapEstimate:
    overlap: float
    pairs: int
    source: str


def estimate_overlap(records: Iterable[dict], links: Links,
                     backward_fraction: float = DEFAULT_BACKWARD_FRACTION) -> OverlapEstimate:
    """How much of the bucket schedule's overlap multi-GPU records show, against single-GPU records
    of the same setting and batch.

    For each pair the measured extra time is the exposed communication; (all collectives - measured
    exposure) / (all collectives - the schedule's exposure) is that pair's overlap. The median over
    pairs is returned; with no pairs, DEFAULT_OVERLAP (the schedule as DDP runs it).
    """
    ok = [r for r in records if r.get("status") == "ok" and r.get("seconds_per_step")]
    single = {(r["setting_key"], r["micro_batch"]): r for r in ok if r.get("gpus", 1) * r.get("nodes", 1) == 1}
    overlaps = []
    for record in ok:
        setting = Setting.from_dict(record)
        if setting.world_size == 1:
            continue
        base = single.get((setting.with_(gpus=1, nodes=1).key(), record["micro_batch"]))
        if base is None:
            continue
        traffic = step_traffic(setting, record["params_total"], record["params_trainable"])
        compute = base["seconds_per_step"]
        total = communication_seconds(traffic, setting.gpus, setting.nodes, links)
        scheduled = exposed_communication_seconds(traffic, compute, backward_fraction * compute, setting.gpus,
                                                  setting.nodes, links, overlap=1.0)
        if total - scheduled <= 0:
            continue
        exposed = record["seconds_per_step"] - compute
        overlaps.append(min(1.0, max(0.0, (total - exposed) / (total - scheduled))))
    if not overlaps:
        return OverlapEstimate(DEFAULT_OVERLAP, 0, "default: DDP's bucket schedule (no multi-GPU records paired "
                                                   "with single-GPU ones)")
    return OverlapEstimate(statistics.median(overlaps), len(overlaps),
                           f"calibrated: median of {len(overlaps)} multi-GPU vs single-GPU record pairs")
