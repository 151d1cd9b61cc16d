"""`ftplan gpus`: the GPU catalog the planner reads, with the user's own specs merged in."""

from pathlib import Path

import click

from ftplan.cli.commands.input_options import GPU_SPECS_HELP
from ftplan.cli.render import gpu_sources, gpu_table, make_console, print_table
from ftplan.core.hardware import load_catalog


@click.command("gpus")
@click.option("--gpu-specs", type=click.Path(path_type=Path), default=None,
              help=GPU_SPECS_HELP)
def command(gpu_specs: Path | None) -> None:
    """List known GPUs, the names they answer to, memory, bf16 throughput, memory bandwidth, interconnect and where
    each figure comes from; `cpu` is this machine's CPU, for plans from a CPU calibration."""
    catalog, console = load_catalog(gpu_specs), make_console()
    print_table(console, gpu_table(catalog))
    console.print("Sources:", highlight=False)
    for line in gpu_sources(catalog):
        console.print(f"  {line}", highlight=False)
