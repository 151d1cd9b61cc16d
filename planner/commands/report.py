"""`ftplan report` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("report")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan report is not implemented yet")
