"""A JSON cache of the fits of the calibration files, so repeated `ftplan plan` calls skip refitting.

Fitting a few dozen records takes over a hundred small scikit-learn regressions (about half a second);
reading their JSON back takes milliseconds. The key is a digest of the records' content, the GPU catalog
and the fitting code, so new or edited records, other specs or a changed fitting rule refit.
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

from ftplan.models.fit import SettingFit
from ftplan.models.fitset import FitSet, fit_records
from ftplan.models.prior import PriorConstants

FORMAT = "ftplan-fit-cache-1"


def cache_dir() -> Path:
    """$FTPLAN_CACHE_DIR, else $XDG_CACHE_HOME/ftplan, else ~/.cache/ftplan."""
    if os.environ.get("FTPLAN_CACHE_DIR"):
        return Path(os.environ["FTPLAN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ftplan"


def _code_digest() -> str:
    """Digest of the sources that fit and predict: a changed rule must never reuse old fits."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*(root / "core").glob("*.py"), *(root / "models").glob("*.py")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(records: Sequence[dict], catalog: dict | None = None) -> str:
    """Digest of the content of everything a fit depends on: the records, the GPU catalog, the code.

    Content, not file stamps: a file edited in place with the same size and mtime, or a run with
    another --gpu-specs, must refit.
    """
    text = json.dumps([FORMAT, list(records), sorted((k, repr(v)) for k, v in (catalog or {}).items()),
                       _code_digest()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_prior_constants(records: list[dict], fits: FitSet, catalog: dict) -> dict[str, PriorConstants]:
    """The prior's learned constants per calibrated model, cached like the fits (they refit ladders too)."""
    from ftplan.models.predictor import Predictor

    try:
        path = cache_dir() / f"prior-{cache_key(records, catalog)}.json"
    except OSError:
        return Predictor(records, fits, catalog).all_constants()
    try:
        return {model: PriorConstants(**values) for model, values in json.loads(path.read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    constants = Predictor(records, fits, catalog).all_constants()
    _store(path, {model: asdict(c) for model, c in constants.items()})
    return constants


def cached_fits(records: list[dict]) -> FitSet:
    """The FitSet of these records: from the cache when its key matches, else fitted and stored."""
    try:
        path = cache_dir() / f"fits-{cache_key(records)}.json"
    except OSError:  # the code cannot be read back: fit without a cache
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
