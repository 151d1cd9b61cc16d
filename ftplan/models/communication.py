"""Seconds per data-parallel step: compute, gradient (and ZeRO-3 parameter) traffic, stragglers.

Collectives follow the alpha-beta model NCCL's own tuner uses (src/graph/tuning.cc): a ring
all-reduce over N ranks costs 2(N-1)/N * bytes/beta + 2(N-1) * alpha, a pipelined tree
2 * bytes/beta + 2 * log2(N) * alpha, and NCCL runs whichever is faster, so the model takes the
minimum. Across nodes the collective is hierarchical: a ring inside each node over the fast link,
then one over the nodes whose bandwidth is the node's network (all its GPUs share it). At 128 ranks
the latency term, not bandwidth, decides the cost of small LoRA gradients; the tree is what saves it.
"""

from __future__ import annotations

import difflib
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace

import pandas as pd

from ftplan.core.errors import FtplanError
from ftplan.core.paths import data_dir
from ftplan.core.settings import Setting
from ftplan.core.units import GB
from ftplan.models.bytes_per_param import weight_bytes

DEFAULT_BACKWARD_FRACTION = 2 / 3  # backward is about twice the forward's FLOPs
# Without multi-GPU calibrations nothing says how much traffic hides behind backward: assume none,
# which can only overestimate the step time.
DEFAULT_OVERLAP = 0.0


@dataclass(frozen=True)
class Links:
    """Bandwidths (GB/s, 1e9 bytes/s, per direction) and per-hop latencies of one cluster.

    inter_node_gbs is what one node can send to the others in total (all its GPUs share it);
    host_gbs is the GPU-host link used by CPU offload.
    """

    intra_node_gbs: float
    inter_node_gbs: float
    intra_latency_s: float
    inter_latency_s: float
    host_gbs: float
    source: str = "catalog"

    def __post_init__(self) -> None:
        for name in ("intra_node_gbs", "inter_node_gbs", "host_gbs"):
            if not getattr(self, name) > 0:
                raise FtplanError(f"link bandwidth {name} must be positive, got {getattr(self, name)}")
        for name in ("intra_latency_s", "inter_latency_s"):
            if not getattr(self, name) >= 0:
                raise FtplanError(f"link latency {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class NetworkLink:
    """One row of data/networks.csv: a nominal link a user can name instead of measuring."""

    name: str
    bandwidth_gbs: float
    latency_s: float
    description: str
    source: str


def _network_rows() -> list[dict]:
    path = data_dir() / "networks.csv"
    try:
        return pd.read_csv(path).to_dict("records")
    except (OSError, pd.errors.ParserError) as exc:
        raise FtplanError(f"cannot read network catalog {path}: {exc}") from None


def _link(row: dict) -> NetworkLink:
    return NetworkLink(row["name"], float(row["bandwidth_gbs"]), float(row["latency_us"]) * 1e-6,
                       row["description"], row["source"])


def load_network_catalog() -> dict[str, NetworkLink]:
    return {row["name"]: _link(row) for row in _network_rows()}


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().split("(")[0])


def find_link(name: str) -> NetworkLink:
    """A catalog link by name or alias ('nvlink4', 'NVLink 4', 'PCIe 4.0 x16', 'cloud')."""
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
                 inter_link.latency_s, host_link.bandwidth_gbs, source="catalog")


_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*([kmgt]?)(b|bit|byte)?(?:/s|ps)?\s*$", re.I)
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
    if value <= 0:
        raise FtplanError(f"bandwidth must be positive, got '{text}'")
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


def _one_level_seconds(nbytes: float, ranks: int, gbs: float, latency_s: float, passes: int) -> float:
    """Ring (or, for an all-reduce, tree if faster) over ranks; passes: 2 all-reduce, 1 gather/scatter."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    ring = passes * ((ranks - 1) / ranks * nbytes / (gbs * GB) + (ranks - 1) * latency_s)
    if passes != 2:
        return ring
    tree = 2 * nbytes / (gbs * GB) + 2 * math.ceil(math.log2(ranks)) * latency_s
    return min(ring, tree)


def collective_seconds(nbytes: float, passes: int, gpus_per_node: int, nodes: int, links: Links) -> float:
    """An all-reduce (passes=2) or all-gather/reduce-scatter (passes=1): inside nodes, then across them."""
    inside = _one_level_seconds(nbytes, gpus_per_node, links.intra_node_gbs, links.intra_latency_s, passes)
    across_gbs = min(links.inter_node_gbs, links.intra_node_gbs)  # bounded by the slowest link on the path
    across = _one_level_seconds(nbytes, nodes, across_gbs, links.inter_latency_s, passes)
    return inside + across


def allreduce_seconds(nbytes: float, gpus_per_node: int, nodes: int, links: Links) -> float:
    return collective_seconds(nbytes, 2, gpus_per_node, nodes, links)


def communication_seconds(traffic: StepTraffic, gpus_per_node: int, nodes: int, links: Links) -> float:
    """Collective time of one step between the GPUs (host transfers excluded)."""
    if traffic.gathered_parameter_bytes:
        return (collective_seconds(traffic.gradient_bytes, 1, gpus_per_node, nodes, links)
                + 2 * collective_seconds(traffic.gathered_parameter_bytes, 1, gpus_per_node, nodes, links))
    return allreduce_seconds(traffic.gradient_bytes, gpus_per_node, nodes, links)


def host_transfer_seconds(offloaded_bytes: int, ranks: int, links: Links) -> float:
    """Offload traffic of one rank: its partition of gradients and parameters over the host link.

    A single-GPU calibration with offload already contains host_transfer_seconds(bytes, 1, links).
    """
    return offloaded_bytes / ranks / (links.host_gbs * GB)


def straggler_factor(step_time_cv: float, ranks: int) -> float:
    """Expected max of `ranks` step times over their mean: 1 + cv * sqrt(2 ln N) (Gaussian tail)."""
    return 1.0 + step_time_cv * math.sqrt(2 * math.log(ranks)) if ranks > 1 else 1.0


def data_parallel_step_seconds(compute_seconds: float, gradient_bytes: int, gpus_per_node: int, nodes: int,
                               links: Links, overlap: float, step_time_cv: float = 0.0,
                               backward_fraction: float = DEFAULT_BACKWARD_FRACTION, *,
                               gathered_parameter_bytes: int = 0, offloaded_bytes: int = 0) -> float:
    """Seconds per optimizer step on gpus_per_node x nodes GPUs.

    compute_seconds is one GPU's step without any communication. A fraction `overlap` of the
    collective time hides behind backward (never more than backward lasts); host transfers of CPU
    offload are not hidden. Every step waits for the slowest rank (straggler_factor).
    """
    if compute_seconds < 0 or gradient_bytes < 0:
        raise FtplanError("compute seconds and gradient bytes must be >= 0")
    if gpus_per_node < 1 or nodes < 1:
        raise FtplanError(f"GPU and node counts must be positive, got {gpus_per_node} x {nodes}")
    if not 0 <= overlap <= 1 or not 0 <= backward_fraction <= 1:
        raise FtplanError(f"overlap and backward fraction must lie in [0, 1], got {overlap} and {backward_fraction}")
    if step_time_cv < 0:
        raise FtplanError(f"step-time coefficient of variation must be >= 0, got {step_time_cv}")
    ranks = gpus_per_node * nodes
    traffic = StepTraffic(gradient_bytes, gathered_parameter_bytes, offloaded_bytes)
    collectives = communication_seconds(traffic, gpus_per_node, nodes, links)
    hidden = overlap * min(collectives, backward_fraction * compute_seconds)
    return (compute_seconds * straggler_factor(step_time_cv, ranks) + collectives - hidden
            + host_transfer_seconds(offloaded_bytes, ranks, links))


def step_time_cv(records: Iterable[dict]) -> float:
    """Median coefficient of variation of step times over ok records with at least 3 timed steps."""
    cvs = [statistics.stdev(r["step_seconds"]) / statistics.fmean(r["step_seconds"])
           for r in records
           if r.get("status") == "ok" and len(r.get("step_seconds") or []) >= 3 and statistics.fmean(r["step_seconds"]) > 0]
    return statistics.median(cvs) if cvs else 0.0


@dataclass(frozen=True)
class OverlapEstimate:
    overlap: float
    pairs: int
    source: str


def estimate_overlap(records: Iterable[dict], links: Links,
                     backward_fraction: float = DEFAULT_BACKWARD_FRACTION) -> OverlapEstimate:
    """Overlap implied by multi-GPU records against single-GPU records of the same setting and batch.

    For each pair the measured extra time is the exposed communication; the hidden part over the
    hideable part (collectives capped by backward) is that pair's overlap. The median over pairs
    is returned; with no pairs, DEFAULT_OVERLAP (none).
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
        collectives = communication_seconds(traffic, setting.gpus, setting.nodes, links)
        hideable = min(collectives, backward_fraction * base["seconds_per_step"])
        if hideable <= 0:
            continue
        exposed = record["seconds_per_step"] - base["seconds_per_step"]
        overlaps.append(min(1.0, max(0.0, (collectives - exposed) / hideable)))
    if not overlaps:
        return OverlapEstimate(DEFAULT_OVERLAP, 0, "default: no overlap assumed (no multi-GPU records paired with single-GPU ones)")
    return OverlapEstimate(statistics.median(overlaps), len(overlaps),
                           f"calibrated: median of {len(overlaps)} multi-GPU vs single-GPU record pairs")
