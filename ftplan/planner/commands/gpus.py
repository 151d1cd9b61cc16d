"""`ftplan gpus`: the GPU catalog the planner reads, with the user's own specs merged in."""

from pathlib import Path

import click
from rich.console import Console

from ftplan.core.hardware import load_catalog
from ftplan.planner.render import gpu_table


@click.command("gpus")
@click.option("--gpu-specs", type=click.Path(path_type=Path), default=None,
              help="CSV with the catalog's columns (name, memory_gib, bf16_dense_tflops, memory_bandwidth_gbs, ...); "
                   "its rows replace or add cards.")
def command(gpu_specs: Path | None) -> None:
    """List known GPUs: memory, bf16 throughput, memory bandwidth, interconnect and where each figure comes from."""
    Console(width=200).print(gpu_table(load_catalog(gpu_specs)))
