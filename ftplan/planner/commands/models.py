"""`ftplan models`: the architectures ftplan knows, with exact parameter counts."""

import click
from rich.console import Console
from rich.table import Table

from ftplan.core.architecture import available_architectures, load_architecture


@click.command("models")
def command() -> None:
    """List shipped model architectures (pass --model a/config.json to use any other)."""
    table = Table("model", "type", "layers", "hidden", "vocab", "parameters", "LoRA r=16 (all linear)")
    for name in available_architectures():
        arch = load_architecture(name)
        table.add_row(name, arch.model_type, str(arch.layers), str(arch.hidden), str(arch.vocab),
                      f"{arch.params_total:,}", f"{arch.lora_params(16):,}")
    Console().print(table)
