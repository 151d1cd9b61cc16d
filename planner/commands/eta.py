"""`ftplan eta` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("eta")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan eta is not implemented yet")
