"""The options that read a dataset's token lengths, shared by `plan` and `calibrate` so both read a file alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from ftplan.cli.commands.input_options import FiniteFloat
from ftplan.models.batching import TOO_LONG
from ftplan.planner.dataset import CHARS_PER_TOKEN, CHARS_PER_TOKEN_RANGE

DATASET_OPTIONS = (
    click.option("--dataset", type=click.Path(path_type=Path), default=None,
                 help="A dataset (JSONL, JSON, CSV, Parquet or a save_to_disk folder) whose token lengths `plan` plans "
                      "with and whose longest sample `calibrate` runs at; --seq-len, if given, is the longest a "
                      "sample may be."),
    click.option("--text-field", default=None, help="With --dataset: the text field.  [default: text, else prompt + completion, else messages]"),
    click.option("--ids-field", default=None, help="With --dataset: a field of token ids, counted as they are."),
    click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
                 help="With --dataset: a local tokenizer folder or tokenizer.json; without it, tokens are estimated "
                      "from characters."),
    click.option("--chars-per-token", type=FiniteFloat(*CHARS_PER_TOKEN_RANGE), default=None,
                 help=f"With --dataset and no --tokenizer: characters per token of the estimate.  "
                      f"[default: {CHARS_PER_TOKEN:g}, English prose]"),
    click.option("--too-long", type=click.Choice(TOO_LONG), default="truncate", show_default=True,
                 help="With --dataset: what to do with samples longer than --seq-len (or --pack-length)."),
)
DATASET_ONLY = ("text_field", "ids_field", "tokenizer", "chars_per_token")


def dataset_options(command: Callable) -> Callable:
    """Add the dataset options to a click command; `check_dataset_options` refuses them without --dataset."""
    for option in reversed(DATASET_OPTIONS):
        command = option(command)
    return command


def check_dataset_options(options: dict) -> None:
    """A tokenizer or field name without a dataset would be silently ignored: refuse it instead."""
    given = [f"--{name.replace('_', '-')}" for name in DATASET_ONLY if options.get(name) is not None]
    if given and options.get("dataset") is None:
        raise click.UsageError(f"{', '.join(given)} needs --dataset")
    if options.get("tokenizer") is not None and options.get("chars_per_token") is not None:
        raise click.UsageError("--chars-per-token is the estimate without a tokenizer; give one of the two")
