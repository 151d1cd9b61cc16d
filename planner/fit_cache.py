"""A JSON cache of the fits of the calibration files, so repeated `ftplan plan` calls skip refitting.

Fitting a few dozen records takes over a hundred small scikit-learn regressions (about half a second);
reading their JSON back takes milliseconds. The key is every input file's path, size and mtime plus
the size and mtime of the fitting code in models/, so new records or a changed fitting rule refit.
JSON only (never pickle): a cache file is data, and a corrupt or foreign one is simply refitted.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import models
from models.fit import SettingFit
from models.fitset import FitSet, fit_records
from models.prior import PriorConstants

FORMAT = "ftplan-fit-cache-1"


def cache_dir() -> Path:
    """$FTPLAN_CACHE_DIR, else $XDG_CACHE_HOME/ftplan, else ~/.cache/ftplan."""
    if os.environ.get("FTPLAN_CACHE_DIR"):
        return Path(os.environ["FTPLAN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ftplan"


def _stamp(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def cache_key(inputs: Sequence[Path]) -> str:
    """Digest of the calibration files (folders: their *.jsonl) and of the code that fits them."""
    files = []
    for path in map(Path, inputs):
        files += sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    code = sorted(Path(models.__file__).parent.glob("*.py"))
    text = json.dumps([FORMAT, [_stamp(p) for p in files], [_stamp(p) for p in code]])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_prior_constants(records: list[dict], inputs: Sequence[Path], fits: FitSet,
                           catalog: dict) -> dict[str, PriorConstants]:
    """The prior's learned constants per calibrated model, cached like the fits (they refit ladders too)."""
    from models.predictor import Predictor

    try:
        path = cache_dir() / f"prior-{cache_key(inputs)}.json"
    except OSError:
        return Predictor(records, fits, catalog).all_constants()
    try:
        return {model: PriorConstants(**values) for model, values in json.loads(path.read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    constants = Predictor(records, fits, catalog).all_constants()
    _store(path, {model: asdict(c) for model, c in constants.items()})
    return constants


def cached_fits(records: list[dict], inputs: Sequence[Path]) -> FitSet:
    """The FitSet of these records (read from `inputs`): from the cache when its key matches, else fitted and stored."""
    try:
        path = cache_dir() / f"fits-{cache_key(inputs)}.json"
    except OSError:  # an input vanished since it was read: fit what was read
        return _fit(records)
    try:
        data = json.loads(path.read_text())
        return FitSet(fits=tuple(SettingFit.from_json(f) for f in data["fits"]), provenance=data["provenance"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    fits = _fit(records)
    _store(path, fits.to_json())
    return fits


def _fit(records: list[dict]) -> FitSet:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # groups too small to fit still inform the prior
        return fit_records(records)


def _store(path: Path, data: dict) -> None:
    """Write atomically; a read-only or full disk only costs the next run a refit."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            json.dump(data, handle)
        os.replace(handle.name, path)
    except OSError:
        pass
