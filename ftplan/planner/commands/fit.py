"""`ftplan fit`: calibration records in, fits.json out, and a table of how well each setting fits."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ftplan.core.errors import FtplanError
from ftplan.core.paths import calibrations_dir
from ftplan.core.records import read_records
from ftplan.core.units import GIB
from ftplan.models.fitset import FitSet, fit_records


@click.command("fit")
@click.argument("records", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=Path("fits.json"), show_default=True,
              help="Where to write the fits (JSON, with the records they came from).")
def command(records: tuple[Path, ...], out: Path) -> None:
    """Fit memory and time against batch size from calibration RECORDS (JSONL files or folders;
    default: the calibrations shipped in data/)."""
    fits = fit_records(read_records(records or [calibrations_dir()]))
    if not fits.fits:
        raise FtplanError("no setting has two or more healthy batch sizes to fit")
    try:
        fits.save(out)
    except OSError as exc:
        raise FtplanError(f"cannot write fits file {out}: {exc.strerror}") from None
    Console().print(fit_table(fits))
    click.echo(f"wrote {len(fits.fits)} fit(s) to {out}")


def fit_table(fits: FitSet) -> Table:
    """One row per (setting, GPU, sequence length)."""
    table = Table(title="Fits: peak allocated memory and seconds per step against micro-batch")
    for column in ("setting", "GPU", "seq", "n", "batches", "R² mem", "R² time", "GiB/sample",
                   "s/step per sample", "wall", "largest ok", "first OOM"):
        table.add_column(column, justify="left" if column in ("setting", "GPU") else "right")
    for fit in fits.fits:
        for seq in fit.seq_lens:
            batches = fit.calibrated_batches(seq)
            table.add_row(
                fit.label.rsplit(" on ", 1)[0], fit.gpu_name, str(seq), str(len(batches)),
                f"{batches[0]}-{batches[-1]}", _number(fit.r2["memory"], ".4f"), _number(fit.r2["time"], ".4f"),
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
