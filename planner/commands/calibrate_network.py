"""`ftplan calibrate-network` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("calibrate-network")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan calibrate-network is not implemented yet")
