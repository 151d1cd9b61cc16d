"""`ftplan models`: the architectures ftplan knows, with exact parameter counts."""

import click
from rich.table import Table

from ftplan.cli.render import COMPACT, make_console, print_table
from ftplan.core.architecture import available_architectures, load_architecture


@click.command("models")
def command() -> None:
    """List shipped model architectures (--model also takes a config.json or a local Hugging Face model folder)."""
    table = Table(title="Shipped architectures (--model NAME)", **COMPACT)
    for name in ("model", "type", "layers", "hidden", "vocab", "parameters", "LoRA r=16\n(all linear)"):
        table.add_column(name, no_wrap=True, justify="left" if name in ("model", "type") else "right")
    for name in available_architectures():
        arch = load_architecture(name)
        table.add_row(name, arch.model_type, str(arch.layers), str(arch.hidden), f"{arch.vocab:,}",
                      f"{arch.params_total:,}", f"{arch.lora_params(16):,}")
    print_table(make_console(), table)
