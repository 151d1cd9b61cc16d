"""Measure all-reduce latency and bandwidth between the GPUs (NCCL) or hosts (gloo) ftplan runs on.

The datasheet says what a link could do; what the training will see depends on the topology, the
NICs, the kernel and NCCL's choices. So, like every other input of the time model, the network is
measured: one process per rank times all-reduces of growing messages, from 8 bytes (pure latency)
to 256 MiB (pure bandwidth), with a warm-up, a barrier before each repeat, the slowest rank's time
and the median over repeats. The two regimes are read apart, as the time model uses them:
    beta  = NCCL's "bus bandwidth", the slope of time against 2(N-1)/N x bytes over the large messages;
    alpha = what the small messages cost beyond their bytes, less NCCL's base latency, per hop of
            the all-reduce the model would run there (ring or tree: ftplan.models.communication),
so the model reproduces the measured small-message time exactly and the large-message one closely.

Multi-host: run the same command on every host with --nodes, --node-rank and --master-addr (they
become torch.distributed's MASTER_ADDR/RANK/WORLD_SIZE); node 0 writes the record.
"""

from __future__ import annotations

import json
import math
import platform
import re
import socket
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ftplan.calibration import launcher
from ftplan.core.errors import FtplanError
from ftplan.store.records import SCHEMA_VERSION, append_record
from ftplan.core.units import GB
from ftplan.models.communication.collectives import COLLECTIVE_BASE_LATENCY_S

if TYPE_CHECKING:
    import pandas as pd  # at run time imported where a table is made: importing this module needs no pandas

BACKENDS = ("nccl", "gloo")
DEFAULT_SIZES = (8, 64, 512, *(4096 * 4**i for i in range(9)))  # 8 B (latency) .. 256 MiB (bandwidth)
WORKER_COMMAND = (sys.executable, "-m", "ftplan.calibration.network_rank")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


@dataclass(frozen=True)
class NetworkSpec:
    """One measurement: who takes part and which messages are timed (written to every rank)."""

    backend: str = "nccl"
    ranks_per_node: int = 2
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: a free local port on one node, torch's default 29500 across nodes
    sizes: tuple[int, ...] = DEFAULT_SIZES
    warmup: int = 3
    repeats: int = 10

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise FtplanError(f"backend must be one of {', '.join(BACKENDS)}, got '{self.backend}'")
        if self.ranks_per_node < 1 or self.nodes < 1 or self.ranks_per_node * self.nodes < 2:
            raise FtplanError(f"an all-reduce needs at least 2 ranks, got {self.ranks_per_node} x {self.nodes} nodes")
        if not 0 <= self.node_rank < self.nodes:
            raise FtplanError(f"node rank must lie in 0..{self.nodes - 1}, got {self.node_rank}")
        if len(self.sizes) < 2 or min(self.sizes) < 4:
            raise FtplanError("give at least two message sizes of 4 bytes or more to fit latency and bandwidth")
        if self.warmup < 0 or self.repeats < 1:
            raise FtplanError(f"need warm-up >= 0 and repeats >= 1, got {self.warmup} and {self.repeats}")

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.nodes


@dataclass(frozen=True)
class AlphaBeta:
    """Fitted alpha-beta model: per-hop latency (s), bus bandwidth (GB/s), the fit's R^2 on relative
    errors, and the latency part of the smallest messages' all-reduce (s, NCCL's base latency included)."""

    latency_s: float
    bandwidth_gbs: float
    r2: float
    small_message_s: float = 0.0


def resolve_backend(backend: str, ranks: int) -> tuple[str, int]:
    """Resolve 'auto' and ranks=0: NCCL over every local GPU when there are GPUs, else gloo over 2 CPU ranks."""
    if backend == "gloo" or (backend == "nccl" and ranks):
        return backend, ranks or 2
    import torch  # only to count GPUs; the ranks import it anyway

    gpus = torch.cuda.device_count()
    backend = backend if backend != "auto" else ("nccl" if gpus else "gloo")
    return backend, ranks or (gpus if backend == "nccl" and gpus >= 2 else 2)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Message sizes in bytes from '4K,1M,64M' (binary units; B, KiB and KB all accepted)."""
    sizes = []
    for part in text.split(","):
        match = _SIZE.match(part)
        if not match:
            raise FtplanError(f"cannot read message size '{part.strip()}': give e.g. 4K,1M,64M")
        sizes.append(int(float(match[1]) * _UNIT[match[2].lower()]))
    return tuple(sorted(set(sizes)))


def fit_alpha_beta(table: pd.DataFrame, ranks: int, nodes: int = 1) -> AlphaBeta:
    """Bandwidth from the large, bandwidth-bound messages (times at least 4x the smallest), latency
    from the small, latency-bound ones (within 2x of the smallest), per hop of the all-reduce
    ftplan's model runs on `ranks` spread over `nodes` (ring, or NCCL's tree across nodes when it
    takes fewer hops)."""
    moved = table["bytes"].to_numpy(float) * 2 * (ranks - 1) / ranks
    seconds = table["seconds"].to_numpy(float)
    from sklearn.linear_model import LinearRegression  # lazy: keeps `ftplan` start-up fast

    large = seconds >= 4 * seconds.min()
    if large.sum() < 2:
        large = moved >= sorted(moved)[-2]
    slope = float(LinearRegression().fit(moved[large].reshape(-1, 1), seconds[large]).coef_[0])
    if not slope > 0:
        raise FtplanError(f"all-reduce times do not grow with message size (slope {slope:.3g} s/B); "
                          "measure a wider range of --sizes")
    small = seconds <= 2 * seconds.min()
    import pandas as pd

    alpha = float(pd.Series(seconds[small] - moved[small] * slope).median())
    if not alpha > 0:
        raise FtplanError(f"small all-reduces cost no more than their bytes (latency {alpha:.3g} s); "
                          "measure a wider range of --sizes")
    per_node = max(1, ranks // nodes)
    hops = 2 * (ranks - 1) if nodes == 1 else min(2 * (ranks - 1), 2 * (per_node - 1) + 2 * math.ceil(math.log2(nodes)))
    predicted = alpha + moved * slope
    relative = (predicted - seconds) / seconds
    spread = (seconds - seconds.mean()) / seconds
    r2 = 1 - float((relative**2).sum() / max((spread**2).sum(), 1e-30))
    return AlphaBeta(latency_s=max(0.0, alpha - COLLECTIVE_BASE_LATENCY_S) / hops, bandwidth_gbs=1 / slope / GB,
                     r2=r2, small_message_s=alpha)


def measure_allreduce(spec: NetworkSpec, timeout: float, log_dir: Path | None = None) -> pd.DataFrame | None:
    """Run this node's ranks; the table (bytes, seconds, bus_gbs) on node 0, None on the others."""
    with tempfile.TemporaryDirectory(prefix="ftplan-network-") as tmp:
        workdir = Path(tmp)
        spec_path, result_path = workdir / "spec.json", workdir / "result.json"
        spec_path.write_text(json.dumps(asdict(spec)))
        logs = [Path(log_dir or workdir) / f"network-rank{spec.node_rank * spec.ranks_per_node + r}.log"
                for r in range(spec.ranks_per_node)]
        commands = [[*WORKER_COMMAND, "--spec", str(spec_path), "--result", str(result_path), "--local-rank", str(r)]
                    for r in range(spec.ranks_per_node)]
        failure = _run_local_ranks(commands, logs, timeout)
        if failure:
            raise FtplanError(f"network calibration failed: {failure}")
        if spec.node_rank != 0:
            return None
        result = json.loads(result_path.read_text())
    import pandas as pd

    table = pd.DataFrame({"bytes": result["sizes"], "seconds": result["seconds"]})
    table["bus_gbs"] = table["bytes"] * 2 * (spec.world_size - 1) / spec.world_size / table["seconds"] / GB
    table.attrs["device"] = result["device"]
    return table


def _run_local_ranks(commands: list[list[str]], logs: list[Path], timeout: float) -> str:
    """Run the ranks under the launcher's watchdog (every rank ends when one dies or time runs out);
    return why they failed, or '' when all succeeded."""
    ended = launcher.run_ranks([launcher.RankLaunch(command, log) for command, log in zip(commands, logs)], timeout)
    failed = [rank for rank, code in enumerate(ended.returncodes) if code != launcher.EXIT_OK]
    if not failed:
        return ""
    culprit = next((rank for rank in failed if rank not in ended.stopped), None)
    if culprit is None:  # none failed on its own: the deadline ended them
        return f"{ended.reason}: {launcher.last_line(logs[failed[0]])}"
    return f"local rank {culprit} exited with code {ended.returncodes[culprit]}: {launcher.last_line(logs[culprit])}"


def build_network_record(spec: NetworkSpec, table: pd.DataFrame, fit: AlphaBeta, command: str) -> dict:
    """A network record: same file and conventions as trial records, told apart by kind='network'."""
    device = table.attrs.get("device", {})
    return {
        "schema_version": SCHEMA_VERSION, "kind": "network", "source": "calibrate-network",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine_id": socket.gethostname(), "backend": spec.backend,
        "ranks": spec.world_size, "ranks_per_node": spec.ranks_per_node, "nodes": spec.nodes,
        "device": device.get("device"), "gpu_name": device.get("gpu_name"),
        "versions": {"torch": device.get("torch"), "cuda": device.get("cuda"), "python": platform.python_version()},
        "sizes_bytes": [int(b) for b in table["bytes"]], "seconds": [float(s) for s in table["seconds"]],
        "bus_gbs": [float(b) for b in table["bus_gbs"]],
        "latency_s": fit.latency_s, "bandwidth_gbs": fit.bandwidth_gbs, "fit_r2": fit.r2,
        "small_message_s": fit.small_message_s,
        "warmup": spec.warmup, "repeats": spec.repeats, "command": command,
    }


def calibrate_network(spec: NetworkSpec, out: Path, timeout: float = 600.0, command: str = "") -> dict | None:
    """Measure, fit and (on node 0) append the record to out; return it, or None on other nodes."""
    if spec.master_port == 0:
        spec = replace(spec, master_port=launcher._free_port() if spec.nodes == 1 else 29500)
    table = measure_allreduce(spec, timeout)
    if table is None:
        return None
    record = build_network_record(spec, table, fit_alpha_beta(table, spec.world_size, spec.nodes), command)
    append_record(out, record)
    return record
