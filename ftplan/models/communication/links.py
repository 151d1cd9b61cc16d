"""The links a cluster's collectives cross: their bandwidths and latencies, from the shipped catalog, a user's
figure or a measurement.

Between nodes without RDMA (no InfiniBand, EFA or RoCE) NCCL runs its socket transport: data
bounce through host memory and CPU proxy threads push them into TCP sockets. One GPU per node gets
close to the line rate, but when several GPUs of a node share its NIC the bus bandwidth falls to
about half of it (data/tcp_allreduce.csv: all_reduce_perf runs published in NVIDIA/nccl#209, #398
and #450). socket_sharing_factor() carries that ratio into the ring and tree bandwidth terms.
"""

from __future__ import annotations

import csv
import difflib
import functools
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ftplan.core.errors import FtplanError
from ftplan.core.paths import data_dir
from ftplan.core.units import GB


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
