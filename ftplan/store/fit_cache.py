"""A JSON cache of the fitted predictor's parts, so repeated `ftplan plan` calls skip refitting.

Fitting a hundred records takes several hundred small regressions (seconds); reading their JSON back
takes milliseconds. The key is a digest of the content of everything a fit depends on (the records,
the architecture configs they name, the GPU catalog, the fitting code and the numeric libraries), so edited
records, other specs or a changed rule refit. The file is signed for this user (store/signed_files.py): a torn,
edited or foreign cache is refitted, never trusted.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import GpuSpec
from ftplan.models.fit import SettingFit
from ftplan.models.fitset import FitSet
from ftplan.models.predictor import Predictor
from ftplan.models.prior import PriorConstants
from ftplan.store.signed_files import cache_dir, read_signed, write_signed

FORMAT = "ftplan-fit-cache-3"
MAX_CACHE_BYTES = 64 * 2**20  # the fits of the shipped calibrations take about 1 MB
FITTING_LIBRARIES = ("numpy", "scipy", "scikit-learn")  # the regressions run on them


def _code_digest() -> str:
    """Digest of the sources that fit and predict: a changed rule must never reuse old fits."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*(root / "core").glob("*.py"), *(root / "models").rglob("*.py")]):  # models/communication/ too
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _architecture_configs(records: Sequence[dict]) -> list:
    """Each recorded model's config as read now: the prior's terms come from it, and an edited config.json
    once kept a cached plan at batch 374 where a fresh fit said 113."""
    configs = []
    for model in sorted({str(r.get("model")) for r in records}):
        try:
            configs.append([model, load_architecture(model).config])
        except FtplanError:  # not available here: its records fit without the prior's terms
            configs.append([model, None])
    return configs


def _library_versions() -> list:
    """The numeric libraries' versions: another release can fit other numbers from the same records."""
    versions = []
    for name in FITTING_LIBRARIES:
        try:
            versions.append([name, importlib.metadata.version(name)])
        except importlib.metadata.PackageNotFoundError:
            versions.append([name, None])
    return versions


def cache_key(records: Sequence[dict], catalog: dict[str, GpuSpec]) -> str:
    """Digest of every input of the fit by content (not file stamps): the records, the architecture configs
    they name, the catalog, the code and the libraries it runs on."""
    text = json.dumps([FORMAT, list(records), _architecture_configs(records),
                       sorted((name, asdict(spec)) for name, spec in catalog.items()), _code_digest(),
                       _library_versions()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_predictor(records: list[dict], catalog: dict[str, GpuSpec]) -> Predictor:
    """The fitted predictor of these records and catalog: its parts from the cache when the key and the
    payload digest match, else fitted now and stored."""
    try:
        path = cache_dir() / f"predictor-{cache_key(records, catalog)}.json"
    except OSError:  # the code cannot be read back: fit without a cache
        return Predictor.fit(records, catalog)
    stored = _load(path)
    if stored is not None:
        fits, constants = stored
        return Predictor(records, fits, constants, catalog)
    predictor = Predictor.fit(records, catalog)
    payload = {"fits": predictor.fits.to_json(),
               "constants": {model: asdict(c) for model, c in predictor.constants.items()}}
    write_signed(path, payload)
    return predictor


def _load(path: Path) -> tuple[FitSet, dict[str, PriorConstants]] | None:
    payload = read_signed(path, MAX_CACHE_BYTES)
    if payload is None:
        return None
    try:
        fits = FitSet(fits=tuple(SettingFit.from_json(f) for f in payload["fits"]["fits"]),
                      provenance=payload["fits"]["provenance"])
        return fits, {model: PriorConstants(**values) for model, values in payload["constants"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


