"""The `ftplan` command: a thin click layer over library functions.

Every user-facing failure is an FtplanError, printed as one line with a non-zero exit; warnings
(skipped records, extrapolation) are printed as one line each on stderr.
"""

from __future__ import annotations

import sys
import warnings

import click

from models.errors import FtplanError
from planner.commands import (
    calibrate,
    calibrate_network,
    eta,
    fit,
    gpus,
    models,
    plan,
    predict,
    report,
)

EXIT_USER_ERROR = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ftplan")
def cli() -> None:
    """Plan LLM fine-tuning: will it fit, which setup is fastest, how long will it take."""


for module in (models, calibrate, calibrate_network, fit, predict, plan, eta, report, gpus):
    cli.add_command(module.command)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"warning: {message}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning expected failures into one-line errors."""
    warnings.showwarning = _one_line_warning
    try:
        cli.main(args=argv, prog_name="ftplan", standalone_mode=False)
    except FtplanError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USER_ERROR)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
