"""The GPU catalog: one definition of every card's memory, throughput and links.

Datasheet figures (data/gpus.csv, with their source) are the defaults; a user's own specs file
overrides or extends them. Time transfers between GPUs by these throughputs; memory does not.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import os
import stat
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from ftplan.core.errors import FtplanError
from ftplan.core.paths import data_dir
from ftplan.core.units import GIB

MAX_SPEC_VALUE = 1e7  # GiB, TFLOP/s or GB/s: ten thousand times today's largest cards; beyond, arithmetic overflows
MIN_SPEC_VALUE = 1e-3  # below, step times overflow to Infinity (1e-300 TFLOP/s ended in an OverflowError)
COLUMNS = ("name", "memory_gib", "bf16_dense_tflops", "memory_bandwidth_gbs")
OPTIONAL_NUMBER_COLUMNS = ("intra_node_gbs", "torch_total_gib")
TEXT_COLUMNS = ("name", "aliases", "interconnect", "source", "torch_total_source", "compute_capability",
                "compute_capability_source")  # a name such as 4090 stays text
MAX_SPECS_BYTES = 16 * 2**20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. intra_node_gbs is the per-direction GPU-to-GPU bandwidth inside a node.

    memory_gib is the datasheet figure; torch_total_gib what PyTorch reports the card can hold
    (`total capacity` in its OOM messages, e.g. 79.14 GiB for an A100 80 GB), which is what a
    batch may fill: budgeting the marketing figure planned batches that ran out of memory.
    """

    name: str
    memory_gib: float
    bf16_dense_tflops: float
    memory_bandwidth_gbs: float
    intra_node_gbs: float | None = None  # None: the interconnect's, from data/networks.csv
    interconnect: str = ""
    source: str = ""
    torch_total_gib: float | None = None
    compute_capability: str = ""  # CUDA's, e.g. "9.0": cards that share it run the same kernels; "" unknown
    aliases: str = ""  # other names it answers to, ';'-separated (3090;rtx3090 for RTX-3090)

    @property
    def alias_names(self) -> list[str]:
        """The other names, normalised, this card's own name left out."""
        return [alias for alias in _aliases(self.aliases) if alias != _normalise(self.name)]

    def runs_the_kernels_of(self, other: GpuSpec) -> bool:
        """Whether this card runs the kernels `other` ran (the same CUDA compute capability), so that a run's
        allocations (SDPA's backend, its workspaces) are the same on both."""
        return bool(self.compute_capability) and self.compute_capability == other.compute_capability

    @property
    def memory_bytes(self) -> int:
        return int((self.torch_total_gib or self.memory_gib) * GIB)


def _aliases(text: str) -> list[str]:
    """The names of a specs row's aliases cell (';'-separated), normalised, each once."""
    return [alias for alias in dict.fromkeys(map(_normalise, text.split(";"))) if alias]


def _normalise(name: str) -> str:
    """Case, separators and the vendor prefix dropped: torch names a card 'NVIDIA H100 80GB HBM3', a user 'h100'."""
    return name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")


CPU = "cpu"  # the device name CPU calibration records carry (ftplan.calibration.measure.gpu_identity)
# A CPU has no datasheet figure ftplan could cite: nominal AVX2 FMA throughput per core and a dual-channel
# memory bus. They only scale the prior's time for settings never calibrated on this CPU; a CPU
# calibration's own times are used as measured.
CPU_TFLOPS_PER_CORE = 0.05
CPU_MEMORY_BANDWIDTH_GBS = 40.0
CPU_LINK_GBS = 10.0  # ranks on one host talk through shared memory (gloo)


def host_memory_bytes() -> int | None:
    """Physical memory of this machine (os.sysconf, else psutil), None when neither can tell."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


def host_cpu_spec() -> GpuSpec | None:
    """This machine's CPU as a device the planner understands: its memory is the host's RAM, the memory
    `ftplan calibrate --device cpu` measures against (peak resident set)."""
    total = host_memory_bytes()
    if not total:
        return None
    return GpuSpec(name=CPU, memory_gib=total / GIB, bf16_dense_tflops=CPU_TFLOPS_PER_CORE * (os.cpu_count() or 1),
                   memory_bandwidth_gbs=CPU_MEMORY_BANDWIDTH_GBS, intra_node_gbs=CPU_LINK_GBS, interconnect="",
                   source=f"this host: RAM from the OS; {CPU_TFLOPS_PER_CORE * 1000:g} GFLOP/s per core and "
                          f"{CPU_MEMORY_BANDWIDTH_GBS:g} GB/s are nominal (calibrate with --device cpu)")


def load_catalog(extra_specs: Path | None = None) -> dict[str, GpuSpec]:
    """GPU specs by canonical name, and this host's CPU as 'cpu'; rows of extra_specs (same CSV columns)
    replace or add cards."""
    tables = [_read_specs(data_dir() / "gpus.csv")]
    if extra_specs is not None:
        tables.append(_with_torch_capacity(_read_specs(Path(extra_specs)), tables[0], Path(extra_specs)))
    catalog: dict[str, GpuSpec] = {}
    for rows in tables:
        for row in rows:
            spec = GpuSpec(**{k: row[k] for k in GpuSpec.__dataclass_fields__ if row.get(k) is not None})
            # a user's 'h200' row replaces the shipped H200 (names are matched in any case), not hides beside it;
            # without aliases of its own it keeps the names the shipped row answered to
            for name in [n for n in catalog if _normalise(n) == _normalise(spec.name)]:
                shipped = catalog.pop(name)
                spec = replace(spec, aliases=spec.aliases or shipped.aliases)
            catalog[spec.name] = spec
    cpu = host_cpu_spec()
    if cpu is not None and not any(_normalise(name) == CPU for name in catalog):  # a user's own 'CPU' row wins
        catalog[CPU] = cpu
    _refuse_aliases_naming_cards(catalog, extra_specs)
    return catalog


def _with_torch_capacity(rows: list[dict], shipped: list[dict], path: Path) -> list[dict]:
    """A user's rows, each with the memory PyTorch can fill. Datasheets round up and ECC takes its share (the
    catalog's cards give PyTorch 91.6-99.1% of their datasheet figure), so a row without torch_total_gib gets
    the least share any catalog card gives, and a warning saying how to measure it."""
    ratio, least = min((row["torch_total_gib"] / row["memory_gib"], row["name"]) for row in shipped
                       if row.get("torch_total_gib"))
    for row in rows:
        if row.get("torch_total_gib") is None and _normalise(row["name"]) != CPU:  # a CPU's memory is the host's RAM
            row["torch_total_gib"] = row["memory_gib"] * ratio
            warnings.warn(f"GPU specs {path}: {row['name']} has no torch_total_gib, so the memory PyTorch can fill "
                          f"is taken as {row['torch_total_gib']:.2f} GiB, {ratio:.1%} of its memory_gib "
                          f"{row['memory_gib']:g} (the least of any catalog card, {least}); put "
                          "torch.cuda.mem_get_info()[1] / 2**30 of the card there", UserWarning, stacklevel=3)
    return rows


def _refuse_aliases_naming_cards(catalog: dict[str, GpuSpec], extra_specs: Path | None) -> None:
    """An alias that is another card's name would be shadowed by that card without a word (a user's
    'h100' alias for their own row planned for the shipped H100): which card was meant is a guess."""
    names = {_normalise(name): name for name in catalog}
    for spec in catalog.values():
        clash = next((names[a] for a in spec.alias_names if a in names), None)
        if clash is not None:
            where = f"GPU specs {extra_specs}" if extra_specs is not None else "the GPU catalog"
            raise FtplanError(f"{where}: {spec.name}'s alias '{clash}' is the name of another card; "
                              "drop it or rename that card's row")


def _read_specs(path: Path) -> list[dict]:
    """The rows of a specs file, numbers parsed and checked (an empty optional one is None). The csv module,
    not pandas: the catalog is on every plan's path, and importing pandas took longer than the plan."""
    header, rows = _csv_table(path)
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise FtplanError(f"GPU specs {path} lack column(s) {', '.join(missing)}")
    if any(not row["name"].strip() for row in rows):
        raise FtplanError(f"GPU specs {path}: every row needs a name")
    names = [_normalise(row["name"].strip()) for row in rows]
    repeated = next((row["name"] for row, name in zip(rows, names) if names.count(name) > 1), None)
    if repeated is not None:  # which of two rows of one card counts would be a guess
        raise FtplanError(f"GPU specs {path}: {repeated} has more than one row")
    owners: dict[str, str] = {}
    for row in rows:  # likewise which of two rows an alias they share means
        for alias in _aliases(row.get("aliases") or ""):
            if owners.setdefault(alias, row["name"]) != row["name"]:
                raise FtplanError(f"GPU specs {path}: alias '{alias}' names both {owners[alias]} and {row['name']}")
    for column in (*COLUMNS[1:], *(c for c in OPTIONAL_NUMBER_COLUMNS if c in header)):
        for row in rows:
            row[column] = _spec_number(path, column, row[column])
    for row in rows:  # PyTorch sees at most the card's memory: a larger figure would budget memory that is not there
        if (row.get("torch_total_gib") or 0) > row["memory_gib"]:
            raise FtplanError(f"GPU specs {path}: {row['name']}'s torch_total_gib {row['torch_total_gib']:g} is above "
                              f"its memory_gib {row['memory_gib']:g}")
    return rows


def _csv_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of a CSV file, blank lines skipped and short rows padded with empty cells."""
    try:
        with _specs_file(path) as handle:
            text = handle.read().decode("utf-8-sig")
        lines = [line for line in csv.reader(io.StringIO(text, newline="")) if line]
    except (OSError, ValueError, csv.Error) as exc:  # ValueError: bytes that are not UTF-8
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc  # not "[Errno 21] ...: 3", a descriptor
        raise FtplanError(f"cannot read GPU specs {path}: {why}") from None
    if not lines:
        raise FtplanError(f"cannot read GPU specs {path}: no header row")
    header = lines[0]
    for number, line in enumerate(lines[1:], 2):
        if len(line) > len(header):
            raise FtplanError(f"cannot read GPU specs {path}: row {number} has {len(line)} fields, its header "
                              f"{len(header)}")
    return header, [dict(zip(header, [*line, *[""] * (len(header) - len(line))])) for line in lines[1:]]


def _spec_number(path: Path, column: str, text: str) -> int | float | None:
    """A positive number of at most MAX_SPEC_VALUE (an int when written as one); None for an empty optional cell."""
    if text.strip() == "" and column in OPTIONAL_NUMBER_COLUMNS:
        return None
    try:
        value = int(text) if text.strip().lstrip("+-").isdigit() else float(text)
    except ValueError:
        value = math.nan
    if not value >= MIN_SPEC_VALUE:
        raise FtplanError(f"GPU specs {path}: column {column} must hold positive numbers, at least {MIN_SPEC_VALUE:g}")
    if value > MAX_SPEC_VALUE:
        raise FtplanError(f"GPU specs {path}: column {column} holds a value above {MAX_SPEC_VALUE:.0e}, "
                          "more than any card has")
    return value


def _specs_file(path: Path):
    """The specs file opened for reading: a FIFO or device would hang the read or never end, so only a
    regular file of catalog size is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    handle = os.fdopen(fd, "rb")
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_SPECS_BYTES:
        handle.close()
        raise OSError(f"not a regular file of at most {MAX_SPECS_BYTES // 2**20} MiB")
    return handle


def find_gpu(name: str, catalog: dict[str, GpuSpec] | None = None) -> GpuSpec:
    """Look a GPU up by name or alias, case-insensitively; suggest close names when unknown."""
    catalog = catalog if catalog is not None else load_catalog()
    wanted = _normalise(name)
    aliases = {_normalise(spec.name): spec for spec in catalog.values()}
    for spec in reversed(catalog.values()):  # a user's rows come last, and their aliases win over shipped ones
        for alias in spec.alias_names:
            aliases.setdefault(alias, spec)
    if wanted in aliases:
        found = aliases[wanted]
        others = sorted({spec.name for alias, spec in aliases.items() if spec != found and alias.startswith(wanted)})
        if others and wanted != _normalise(found.name):  # 'A100' is the 40 GB card, and says nothing about it
            warnings.warn(f"GPU '{name}' is taken as {found.name} ({found.memory_gib:g} GB); "
                          f"name {' or '.join(others)} to plan for {'that card' if len(others) == 1 else 'those'}",
                          UserWarning, stacklevel=2)
        return found
    close = difflib.get_close_matches(wanted, list(aliases), n=3, cutoff=0.5)
    names = dict.fromkeys(aliases[c].name for c in close)
    hint = f"; did you mean {', '.join(names)}?" if names else ""
    raise FtplanError(f"unknown GPU '{name}'{hint} (see `ftplan gpus`, or pass --gpu-specs FILE)")
