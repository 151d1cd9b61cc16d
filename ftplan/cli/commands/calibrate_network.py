"""`ftplan calibrate-network`: measure all-reduce latency and bandwidth here, record it like a trial.

A thin layer over ftplan.calibration.network; torch is imported only there, never here.
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ftplan.calibration.extra import extra_problem
from ftplan.calibration.network import (
    DEFAULT_SIZES,
    NetworkSpec,
    calibrate_network,
    parse_sizes,
    resolve_backend,
)
from ftplan.cli.commands.input_options import FiniteFloat
from ftplan.core.errors import FtplanError


def _sizes(_ctx, _param, value: str | None) -> tuple[int, ...]:
    return DEFAULT_SIZES if value is None else parse_sizes(value)


@click.command("calibrate-network")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True,
              help="NCCL between GPUs, gloo between CPU processes; auto picks NCCL when GPUs are present.")
@click.option("--ranks", type=click.IntRange(min=0), default=0,
              help="Processes on this host; use 1 per host to measure the network between hosts.  "
                   "[default: every GPU with NCCL, else 2]")
@click.option("--sizes", callback=_sizes, default=None,
              help="Comma-separated message sizes, e.g. 8,4K,1M,64M; small ones time latency, large ones bandwidth.  "
                   "[default: 8, 64, 512 bytes, then 4K to 256M in x4 steps]")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True, help="Timed all-reduces per size.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSONL file to append the record to.  [default: calibrations/<machine>.jsonl]")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Hosts taking part; run the same command on each with its --node-rank.")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True, help="This host's index (0 writes the record).")
@click.option("--master-addr", default="127.0.0.1", show_default=True, help="Address of node 0, reachable from every host.")
@click.option("--master-port", type=click.IntRange(0, 65535), default=0,
              help="Port on node 0.  [default: a free port on one host, 29500 across hosts]")
@click.option("--timeout", type=FiniteFloat(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds before every rank is ended.")
def command(backend: str, ranks: int, sizes: tuple[int, ...], repeats: int, warmup: int, out: Path | None,
            nodes: int, node_rank: int, master_addr: str, master_port: int, timeout: float) -> None:
    """Time all-reduces of growing messages and fit per-hop latency and bus bandwidth to them.

    The record (kind "network") feeds the planner's communication model in place of catalog links.
    """
    if problem := extra_problem("ftplan calibrate-network", ("torch",)):
        raise FtplanError(problem)
    backend, ranks = resolve_backend(backend, ranks)
    spec = NetworkSpec(backend=backend, ranks_per_node=ranks, nodes=nodes, node_rank=node_rank,
                       master_addr=master_addr, master_port=master_port, sizes=sizes, warmup=warmup, repeats=repeats)
    out = out or Path("calibrations") / f"{socket.gethostname()}.jsonl"
    console = Console(soft_wrap=True)
    console.print(f"timing {backend} all-reduce over {spec.world_size} ranks ({ranks} per node x {nodes} node(s))")
    record = calibrate_network(spec, out, timeout, command=_command_line(click.get_current_context().params))
    if record is None:
        console.print(f"node {node_rank} done; node 0 writes the record")
        return
    console.print(network_table(record))
    console.print(f"small messages: {record['small_message_s'] * 1e6:.1f} us an all-reduce, {record['latency_s'] * 1e6:.1f} us "
                  f"per hop; large messages: bus bandwidth {record['bandwidth_gbs']:.3g} GB/s (fit R^2 {record['fit_r2']:.3f}); "
                  f"appended to {out}")


def _command_line(params: dict) -> str:
    """The command as it could be typed again (kept in the record)."""
    words = ["ftplan", "calibrate-network"]
    for name, value in params.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        words.append(f"--{name.replace('_', '-')}={text}")
    return shlex.join(words)


def network_table(record: dict) -> Table:
    table = Table("message", "median time", "bus bandwidth")
    for size, seconds, bus in zip(record["sizes_bytes"], record["seconds"], record["bus_gbs"]):
        table.add_row(_bytes(size), f"{seconds * 1e3:.3f} ms", f"{bus:.3g} GB/s")
    return table


def _bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"
