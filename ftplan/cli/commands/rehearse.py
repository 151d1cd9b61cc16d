"""`ftplan rehearse DIR`: run the folder `plan --emit` wrote on this machine's GPU, lower its batch until safe and
raise it while a safe run leaves room."""

from __future__ import annotations

from pathlib import Path

import click

from ftplan.cli.commands.input_options import FiniteFloat
from ftplan.core.errors import EXIT_DOES_NOT_FIT
from ftplan.core.units import GIB
from ftplan.evidence.inputs import USER_CALIBRATIONS
from ftplan.planner.emit import TRAINING_ARGS_PY
from ftplan.planner.rehearse import (
    DEFAULT_STEPS,
    can_grow,
    read_plan,
    refuse_a_cpu_plan,
    rehearsal_seconds,
    rehearse_folder,
)
from ftplan.store.records import append_record

REHEARSALS_FILE = "rehearsals.jsonl"


@click.command("rehearse")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--steps", type=click.IntRange(min=3, max=1000), default=DEFAULT_STEPS, show_default=True,
              help="Optimizer steps per run: the dataset's heaviest batches first, then a random mix.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Where the rehearsal records go.  [default: ./calibrations/{REHEARSALS_FILE}]")
@click.option("--lower/--no-lower", default=True, show_default=True,
              help="When a run runs out of memory or reserves more than the plan's budget, lower the micro-batch "
                   "(raising gradient accumulation to keep the global batch), rewrite the folder and run again.")
@click.option("--grow/--no-grow", default=True, show_default=True,
              help="When a run is safe with room to spare, rehearse a larger micro-batch (up to the budget, the "
                   "memory grown in proportion) and keep the largest that runs safely. Only for plans that chose "
                   "the global batch themselves (no --global-batch) and accumulate nothing.")
@click.option("--timeout", type=FiniteFloat(min=0, min_open=True), default=900.0, show_default=True,
              help="Seconds one run may take before it is ended.")
@click.option("--dry-run", is_flag=True, help="Print what would run and its GPU time; run nothing.")
def command(directory: Path, steps: int, out: Path | None, lower: bool, grow: bool, timeout: float,
            dry_run: bool) -> None:
    """Run what `ftplan plan --emit DIRECTORY` wrote, unchanged, for a few steps on the dataset's heaviest
    batches; a batch that ran inside the plan's budget is verified (and a larger one tried while there is room),
    one that did not is lowered. The folder ends at the largest batch that ran safely."""
    numbers = read_plan(directory)
    refuse_a_cpu_plan(directory, numbers)
    estimate = rehearsal_seconds(numbers, steps)
    click.echo(f"{numbers['headline']}: micro-batch {numbers['micro_batch']} x accumulation "
               f"{numbers['accumulation']}, predicted {numbers['predicted']['peak_reserved_bytes'] / GIB:.2f} GiB "
               f"reserved ({numbers['predicted']['evidence']}), about {estimate / 60:.1f} GPU-minutes a run")
    out = out or USER_CALIBRATIONS / REHEARSALS_FILE
    if dry_run:
        then = [*(["a larger micro-batch while a run leaves room"] if grow and can_grow(numbers) else []),
                *(["a smaller one if it does not fit"] if lower else [])]
        click.echo(f"would train with {directory / TRAINING_ARGS_PY} unchanged on the {numbers.get('gpu', 'GPU')}: {steps} "
                   "steps, the dataset's heaviest batches first, then a random mix"
                   + (f"; then {' or '.join(then)}" if then else "")
                   + f"; records to {out}, logs in {out.parent / 'logs'}")
        return
    search = rehearse_folder(directory, steps, timeout, lower, out.parent / "logs",
                             on_record=lambda record: append_record(out, record), progress=click.echo, grow=grow)
    final, runs = search.answer, len(search.runs)
    click.echo(f"{'verified' if final.safe else 'NOT verified'}: micro-batch {final.micro_batch} x accumulation "
               f"{final.accumulation} ({runs} run{'s' if runs > 1 else ''}; records in {out}; "
               f"{directory} {'rewritten' if runs > 1 else 'notes the result'})")
    if not final.safe:
        raise click.exceptions.Exit(EXIT_DOES_NOT_FIT)
