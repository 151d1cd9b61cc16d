"""`ftplan predict` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("predict")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan predict is not implemented yet")
