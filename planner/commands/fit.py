"""`ftplan fit` (placeholder until its issue lands)."""

import click

from models.errors import FtplanError


@click.command("fit")
def command() -> None:
    """Not implemented yet."""
    raise FtplanError("ftplan fit is not implemented yet")
