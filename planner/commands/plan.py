"""`ftplan plan` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("plan")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan plan is not implemented yet")
