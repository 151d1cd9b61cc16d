"""`ftplan fit`: calibration records in, fits.json out, and a table of how well each setting fits."""

from __future__ import annotations

import os
from pathlib import Path

import click
from rich.table import Table

from ftplan.cli.render import COMPACT, make_console, print_table
from ftplan.core.errors import FtplanError
from ftplan.core.units import GIB
from ftplan.models.fitset import FitSet, fit_records
from ftplan.evidence.inputs import default_calibrations
from ftplan.store.records import holds_records, read_records, record_files


@click.command("fit")
@click.argument("records", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=Path("fits.json"), show_default=True,
              help="Where to write the fits (JSON, with the records they came from); an existing file only with "
                   "--force.")
@click.option("--force", is_flag=True, help="Replace an existing --out file (never a records file being read).")
def command(records: tuple[Path, ...], out: Path, force: bool) -> None:
    """Fit memory and time against batch size from calibration RECORDS (JSONL files or folders;
    default: the calibrations shipped in data/ plus ./calibrations/ when it exists, as plan and predict read)."""
    inputs = records or default_calibrations()
    refuse_out(out, inputs, force)
    records_read = read_records(inputs)
    fits = fit_records(records_read)
    if not fits.fits:
        raise FtplanError("no setting has two or more healthy batch sizes to fit")
    try:
        fits.save(out)
    except OSError as exc:
        raise FtplanError(f"cannot write fits file {out}: {exc.strerror}") from None
    print_table(make_console(), fit_table(fits))
    click.echo(f"wrote {len(fits.fits)} fit(s) to {out}")


def refuse_out(out: Path, inputs, force: bool) -> None:
    """Nothing a user wrote is replaced unasked: an existing --out needs --force, a symlink is never written
    through, and no records file is ever the output (`fit cal.jsonl --out cal.jsonl` erased it)."""
    if out.is_symlink():
        raise FtplanError(f"{out} is a symlink; write the fits to a real file")
    if out.exists() and any(file.exists() and os.path.samefile(file, out) for file in record_files(inputs)):
        # by identity: a hard link or a folder's symlink to a records file is that file
        raise FtplanError(f"{out} is a calibration records file this fit reads; choose another --out")
    if holds_records(out):  # --force replaces fits, never measurements (an unread records file was erased)
        raise FtplanError(f"{out} holds calibration records; fits never replace them: choose another --out")
    if out.exists() and not force:
        raise FtplanError(f"{out} exists; pass --force to replace it, or choose another --out")


def fit_table(fits: FitSet) -> Table:
    """One row per (setting, GPU, sequence length)."""
    table = Table(title="Fits: peak allocated memory and seconds per step against micro-batch", **COMPACT)
    for column in ("model", "setting", "GPU", "seq", "batches", "R² mem/\ntime", "GiB/\nsample", "s/\nsample",
                   "wall", "largest\nok", "first\nOOM"):
        wraps = column in ("setting", "GPU")
        table.add_column(column, justify="left" if column in ("model", "setting", "GPU") else "right",
                         no_wrap=not wraps, overflow="fold")
    for fit in fits.fits:
        for seq in fit.seq_lens:
            batches = fit.calibrated_batches(seq)
            setting = " ".join(w for w in fit.setting_at(seq).full_label().split() if w != f"s{seq}")
            table.add_row(
                fit.setting["model"], setting, fit.gpu_name.removeprefix("NVIDIA "), str(seq),
                f"{batches[0]}-{batches[-1]}" if len(batches) > 1 else str(batches[0]),
                f"{_number(fit.r2['memory'], '.3f')}/{_number(fit.r2['time'], '.3f')}",
                _per_sample(fit, seq, lambda b: fit.peak_allocated(b, seq).mean / GIB, ".3f"),
                _per_sample(fit, seq, lambda b: fit.seconds_per_step(b, seq).mean, ".4f"),
                ",".join(map(str, fit.wall_batches(seq))) or "-",
                _number(fit.largest_ok_batch(seq), "d"), _number(fit.smallest_oom_batch(seq), "d"))
    return table


def _per_sample(fit, seq: int, predict, spec: str) -> str:
    """Slope at the top of the calibrated range: the one that decides how far the batch can grow."""
    top = fit.calibrated_batches(seq)[-1]
    return format(predict(top + 1) - predict(top), spec)


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)

