"""`ftplan calibrate` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("calibrate")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan calibrate is not implemented yet")
