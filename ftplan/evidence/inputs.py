"""The evidence a plan rests on: the calibration records read, the GPU catalog, the memory budget and the links.

Shared so the commands and the Python API state the same defaults and fail on bad input with the same one line.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import CPU, GpuSpec, find_gpu, load_catalog
from ftplan.core.paths import calibrations_dir
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.communication.links import Links, calibrated_links, find_link, links_from_catalog, parse_bandwidth
from ftplan.models.prior import unmodelled
from ftplan.models.safe_batch import MemoryBudget
from ftplan.store.records import RecordWarning, is_rehearsal, printable, read_records

USER_CALIBRATIONS = Path("calibrations")  # where `ftplan calibrate` and the Trainer callback write by default
TRAINER_SOURCE = "trainer_callback"
DEFAULT_INTER_NODE_LINK = "cloud"
FALLBACK_INTRA_NODE_LINK = "pcie4-x16"  # a card whose specs name no known interconnect


@dataclass(frozen=True)
class Input:
    """One calibration file or folder read, with how many trial records it gave and how many of those
    came from real training runs (the Trainer callback) rather than `ftplan calibrate`."""

    path: Path
    records: int
    from_training_runs: int

    def describe(self) -> str:
        return f"{self.path} ({self.records} records)"


@dataclass(frozen=True)
class Evidence:
    """The calibration records a command works from, where they came from, and the GPU catalog."""

    records: list[dict]
    network_records: list[dict]
    inputs: tuple[Input, ...]
    catalog: dict[str, GpuSpec]
    rehearsals: tuple[dict, ...] = ()  # runs of emitted folders: they verify a plan's batch, never enter a fit

    @cached_property
    def predictor(self):
        """The fitted predictor (from the content-keyed cache), with each GPU's catalog links."""
        from ftplan.store.fit_cache import cached_predictor  # imported late: `ftplan gpus` and `--help` fit nothing
        return cached_predictor(self.records, self.catalog)

    @property
    def fits(self):
        return self.predictor.fits

    def predictor_with(self, links: Links | None):
        return self.predictor.with_links(links)

    def describe(self) -> str:
        """Which inputs were read, for the output: a plan must say what it rests on."""
        if not self.inputs:
            return "Calibrations: none found; every number comes from the analytic prior."
        runs = sum(i.from_training_runs for i in self.inputs)
        return (f"Calibrations: {'; '.join(i.describe() for i in self.inputs)}: "
                f"{len(self.records) - runs} from calibration trials (short real fine-tunes by `ftplan calibrate`), "
                f"{runs} from your own training runs (the Trainer callback).")

    def calibrated_settings(self, model: str) -> list[Setting]:
        """Settings of this model with measured trials, on any GPU (the predictor transfers across cards)."""
        return list(dict.fromkeys(Setting.from_dict(r) for r in self.records
                                  if r["model"] == model and r["status"] == "ok"))

    def failed_trials(self, model: str) -> dict[Setting, str]:
        """Settings whose calibration ended in an error (not OOM) and never ran ok: why, in the record's words."""
        ran = set(self.calibrated_settings(model))
        return {Setting.from_dict(r): f"batch {r['micro_batch']}: {r.get('message') or 'error'}"
                for r in self.records
                if r["model"] == model and r["status"] == "error" and Setting.from_dict(r) not in ran}

    @cached_property
    def _cards(self) -> dict[str, GpuSpec | None]:
        cards: dict[str, GpuSpec | None] = {}
        for name in {str(r.get("gpu_name")) for r in self.records}:
            try:
                cards[name] = find_gpu(name, self.catalog)
            except FtplanError:
                cards[name] = None  # a card outside the catalog: its records still inform the prior
        return cards

    def card_of(self, record: dict) -> GpuSpec | None:
        """The catalog card a record was measured on (record names like 'NVIDIA H200' resolve by alias)."""
        return self._cards.get(str(record.get("gpu_name")))

    def measured_capacity(self, gpu: GpuSpec) -> int | None:
        """The card's total memory as the calibration runs on it saw it, which datasheets round. A total above
        the datasheet's figure is no run's (one edited record set every plan's H200 to 1 PiB): skipped, said."""
        totals = []
        for record in (r for r in self.records if self.card_of(r) == gpu and r.get("gpu_memory_total_bytes")):
            if record["gpu_memory_total_bytes"] > gpu.memory_gib * GIB:
                warnings.warn(f"{record.get('_source', 'a record')}: gpu_memory_total_bytes "
                              f"{record['gpu_memory_total_bytes'] / GIB:,.1f} GiB is more than {gpu.name} has "
                              f"({gpu.memory_gib:g}); its capacity is left out", RecordWarning, stacklevel=2)
            else:
                totals.append(record["gpu_memory_total_bytes"])
        return max(totals, default=0) or None

    def budget(self, gpu: GpuSpec, safety_margin: float | None, context_reserve_gib: float) -> MemoryBudget:
        """Capacity from the user's own spec if given, else as measured, else the catalog's."""
        shipped = load_catalog().get(gpu.name) == gpu
        measured = self.measured_capacity(gpu) if shipped else None
        return MemoryBudget(measured or gpu.memory_bytes, safety_margin, int(context_reserve_gib * GIB),
                            "measured by calibration" if measured else "your GPU specs" if not shipped else
                            "this host's RAM" if gpu.name == CPU else "catalog")

    def links(self, gpu: GpuSpec, intra: str | None = None, inter: str | None = None) -> tuple[Links, LinkWords]:
        """The links to price communication with, and a sentence saying where each figure came from.

        In increasing precedence: the catalog (the card's interconnect, a plain cloud network between
        nodes), a measured network calibration, the user's --intra/--inter-node-bandwidth.
        """
        try:
            links, intra_from = links_from_catalog(intra=gpu.interconnect, inter=DEFAULT_INTER_NODE_LINK), \
                f"catalog: {gpu.interconnect.split('(')[0].strip()}"
        except FtplanError:
            links, intra_from = links_from_catalog(intra=FALLBACK_INTRA_NODE_LINK, inter=DEFAULT_INTER_NODE_LINK), \
                f"{gpu.name} names no known interconnect: PCIe 4.0 assumed"
        if gpu.intra_node_gbs and load_catalog().get(gpu.name) != gpu and gpu.intra_node_gbs != links.intra_node_gbs:
            links = replace(links, intra_node_gbs=gpu.intra_node_gbs)
            intra_from = f"intra_node_gbs of {gpu.name} in your GPU specs"  # the user's own row wins
        inter_from = f"catalog: '{DEFAULT_INTER_NODE_LINK}' network"
        measured = calibrated_links(self.network_records, links)
        if measured.intra_node_gbs != links.intra_node_gbs or measured.intra_latency_s != links.intra_latency_s:
            intra_from = "measured by ftplan calibrate-network"
        if measured.inter_node_gbs != links.inter_node_gbs or measured.inter_latency_s != links.inter_latency_s:
            inter_from = "measured by ftplan calibrate-network"
        links = measured
        if intra is not None:
            gbs, latency = _user_link(intra, links.intra_latency_s)
            links, intra_from = replace(links, intra_node_gbs=gbs, intra_latency_s=latency), f"--intra-node-bandwidth {intra}"
        if inter is not None:
            gbs, latency = _user_link(inter, links.inter_latency_s)
            socket = find_link(inter).transport == "socket" if _is_link_name(inter) else links.inter_socket
            links, inter_from = (replace(links, inter_node_gbs=gbs, inter_latency_s=latency, inter_socket=socket),
                                 f"--inter-node-bandwidth {inter}")
        return links, LinkWords(
            f"inside a node {_rate(links.intra_node_gbs)}, {links.intra_latency_s * 1e6:g} µs/hop ({intra_from})",
            f"between nodes {_rate(links.inter_node_gbs)} per node, {links.inter_latency_s * 1e6:g} µs/hop ({inter_from})")


@dataclass(frozen=True)
class LinkWords:
    """Where each link's figures came from, in words; a run on one node has no link between nodes to speak of."""

    inside: str
    between: str

    def sentence(self, nodes: int | None = None) -> str:
        """'Links: inside a node ...; between nodes ...', the second left out for exactly one node."""
        return f"Links: {self.inside}." if nodes == 1 else f"Links: {self.inside}; {self.between}."


def _user_link(text: str, default_latency_s: float) -> tuple[float, float]:
    """(GB/s, latency): a catalog link name brings its own latency; a bare figure keeps the default's."""
    try:
        link = find_link(text)
        return link.bandwidth_gbs, link.latency_s
    except FtplanError:
        return parse_bandwidth(text), default_latency_s


def _is_link_name(text: str) -> bool:
    try:
        find_link(text)
        return True
    except FtplanError:
        return False


def _rate(gbs: float) -> str:
    return f"{gbs:g} GB/s" if gbs >= 1 else f"{gbs * 1000:g} MB/s"


def _read_input(path: Path) -> tuple[list[dict], list[dict]]:
    """Trial and network records of one input; a bad line of either kind is named once, with its file and line."""
    return [r for r in read_records([path]) if _modelled(r)], read_records([path], kind="network")


def _modelled(record: dict) -> bool:
    """False, with a warning naming the file and line, for a record whose setting ftplan has no model of, or
    whose step accumulated several micro-batches (its time is theirs, not one micro-batch's)."""
    accumulated = record.get("gradient_accumulation_steps")
    problem = unmodelled(record) or (
        f"a step of {accumulated} accumulated micro-batches, not one micro-batch's" if isinstance(accumulated, int)
        and not isinstance(accumulated, bool) and accumulated > 1 else None)
    if problem:
        warnings.warn(f"{record['_source']}: {printable(problem)}; record skipped", RecordWarning, stacklevel=2)
    return problem is None


def default_calibrations() -> list[Path]:
    """The shipped calibrations, plus the user's own in ./calibrations/ when that folder exists."""
    return [folder for folder in (calibrations_dir(), USER_CALIBRATIONS) if folder.is_dir()]


def load_evidence(calibrations: Sequence[Path], catalog: dict[str, GpuSpec]) -> Evidence:
    """Trial and network records from the given files (default: default_calibrations()), per input."""
    explicit = bool(calibrations)
    records, network, inputs, rehearsals = [], [], [], []
    for path in (calibrations if explicit else default_calibrations()):
        read, links = _read_input(Path(path))
        trials = [r for r in read if not is_rehearsal(r)]
        rehearsals += [r for r in read if is_rehearsal(r)]
        records += trials
        network += links
        inputs.append(Input(Path(path), len(trials), sum(r.get("source") == TRAINER_SOURCE for r in trials)))
    if explicit and not records and not rehearsals:
        raise FtplanError(f"no valid calibration records in {', '.join(map(str, calibrations))}")
    return Evidence(records, network, tuple(inputs), catalog, tuple(rehearsals))


def load_predictor(calibrations: Sequence[Path] = (), catalog: dict[str, GpuSpec] | None = None):
    """The predictor alone, for commands that need no records."""
    return load_evidence(calibrations, catalog if catalog is not None else load_catalog()).predictor
