"""`ftplan gpus` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("gpus")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan gpus is not implemented yet")
