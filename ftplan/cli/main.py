"""The `ftplan` command: a thin click layer over library functions.

Every user-facing failure is an FtplanError or a click usage error, printed as one line with a
non-zero exit; warnings (skipped records, extrapolation) are printed as one line each on stderr.
Subcommands are imported only when run, so `ftplan gpus` or `--help` never pays for scikit-learn,
pandas or the network calibration.
"""

from __future__ import annotations

import codecs
import importlib
import sys
import warnings
from dataclasses import dataclass

import click

from ftplan.core.errors import EXIT_DOES_NOT_FIT, DoesNotFit, FtplanError, Terminated
from ftplan.store.records import printable

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED, EXIT_TERMINATED = 128 + 2, 128 + 15  # as a shell reports SIGINT and SIGTERM
# One plain character for each non-ASCII one the tables and messages use (one for one, so rich's
# column widths still hold); anything else becomes "?".
ASCII_FALLBACKS = str.maketrans("\u2026\u00d7\u00b2\u2264\u2265\u2014\u2013\u2212\u00b5\u2192\u00b1\u00b7", ".x2<>---u>~.")

# name -> "module:attribute", in the order `ftplan --help` lists them
SUBCOMMANDS = {
    "models": "ftplan.cli.commands.models:command",
    "calibrate": "ftplan.cli.commands.calibrate:command",
    "calibrate-network": "ftplan.cli.commands.calibrate_network:command",
    "fit": "ftplan.cli.commands.fit:command",
    "predict": "ftplan.cli.commands.predict:command",
    "plan": "ftplan.cli.commands.plan:command",
    "eta": "ftplan.cli.commands.eta:command",
    "rehearse": "ftplan.cli.commands.rehearse:command",
    "report": "ftplan.cli.commands.report:command",
    "gpus": "ftplan.cli.commands.gpus:command",
}


@dataclass(frozen=True)
class Dependencies:
    """What a caller of the CLI may replace, handed to the commands as click's context object:
    the trial command (None: the real one; tests pass stand-ins that need no GPU)."""

    trial_command: tuple[str, ...] | None = None


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args, lazy: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self._lazy, *sorted(set(super().list_commands(ctx)) - set(self._lazy))]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self._lazy:
            return super().get_command(ctx, name)
        module, attribute = self._lazy[name].split(":")
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup, lazy=SUBCOMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ftplan")
def cli() -> None:
    """Plan LLM fine-tuning: will it fit, which setup is fastest, how long will it take."""


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings quote records and configs (GPU names, paths): never let their control characters reach the terminal."""
    click.echo(f"warning: {printable(str(message))}", err=True)


def _usage_line(exc: click.UsageError) -> str:
    """click's message on one line, pointing at the subcommand's help instead of printing the usage block."""
    message = " ".join(exc.format_message().split())
    command = exc.ctx.command_path if exc.ctx is not None else "ftplan"
    return f"error: {message} (see {command} --help)"


def _in_ascii(error: UnicodeEncodeError) -> tuple[str, int]:
    plain = error.object[error.start:error.end].translate(ASCII_FALLBACKS)
    return "".join(ch if ch.isascii() else "?" for ch in plain), error.end


codecs.register_error("ftplan-ascii", _in_ascii)


def _degrade_output_encoding() -> None:
    """Under LC_ALL=C or PYTHONIOENCODING=latin-1 a table's "…" was a UnicodeEncodeError traceback:
    write what the terminal's encoding cannot hold as plain characters instead."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="ftplan-ascii")


def main(argv: list[str] | None = None, trial_command: tuple[str, ...] | None = None) -> None:
    """Entry point: run the CLI, turning expected failures into one-line errors."""
    _degrade_output_encoding()
    with warnings.catch_warnings():  # one line per warning while the command runs; the caller's hook after
        warnings.showwarning = _one_line_warning
        _run(argv, trial_command)


def _run(argv: list[str] | None, trial_command: tuple[str, ...] | None) -> None:
    """Run the CLI, turning expected failures into one-line errors and exit codes."""
    try:
        code = cli.main(args=argv, prog_name="ftplan", standalone_mode=False,  # a ctx.exit(N) comes back as N
                        obj=Dependencies(trial_command))
        if isinstance(code, int) and code:
            sys.exit(code)
    except FtplanError as exc:
        click.echo(f"error: {printable(' '.join(str(exc).split()))}", err=True)  # one line even when it quotes a newline
        sys.exit(EXIT_DOES_NOT_FIT if isinstance(exc, DoesNotFit) else EXIT_USER_ERROR)
    except click.UsageError as exc:
        click.echo(_usage_line(exc), err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        click.echo("aborted", err=True)
        sys.exit(EXIT_TERMINATED if isinstance(exc.__cause__, Terminated) else EXIT_INTERRUPTED)
    except click.ClickException as exc:
        click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
