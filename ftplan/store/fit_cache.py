"""A JSON cache of the fitted predictor's parts, so repeated `ftplan plan` calls skip refitting.

Fitting a hundred records takes several hundred small regressions (seconds); reading their JSON back
takes milliseconds. The key is a digest of the content of everything a fit depends on (the records,
the architecture configs they name, the GPU catalog, the fitting code and the numeric libraries), so edited
records, other specs or a changed rule refit. The file carries an HMAC of its own payload under this user's
secret key (a file only they can read): a torn cache, or one edited with its digest recomputed, is refitted,
never trusted, and so is a cache file someone else owns or could write. JSON only (never pickle): a cache
file is data.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import json
import os
import secrets
import stat
import tempfile
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

FORMAT = "ftplan-fit-cache-3"
MAX_CACHE_BYTES = 64 * 2**20  # the fits of the shipped calibrations take about 1 MB
KEY_FILE = "key"
KEY_BYTES = 32
FITTING_LIBRARIES = ("numpy", "scipy", "scikit-learn")  # the regressions run on them


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
    secret = _secret(path.parent)
    stored = _load(path, secret) if secret is not None else None
    if stored is not None:
        fits, constants = stored
        return Predictor(records, fits, constants, catalog)
    predictor = Predictor.fit(records, catalog)
    payload = {"fits": predictor.fits.to_json(),
               "constants": {model: asdict(c) for model, c in predictor.constants.items()}}
    if secret is not None:
        _store(path, {"payload": payload, "digest": _digest(payload, secret)})
    return predictor


def _digest(payload: dict, secret: bytes) -> str:
    return hmac.new(secret, json.dumps(payload, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def _secret(folder: Path) -> bytes | None:
    """This user's cache key, made on first use; None (no cache) when it cannot be made or is not private.

    A plain digest of the payload anyone can recompute after editing it; an HMAC under a key only this user
    can read, no one else can forge. The key is written whole, then linked into place, so a concurrent
    first run never reads half of one.
    """
    path = folder / KEY_FILE
    try:
        if not os.path.lexists(path):
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as handle:  # mode 0600
                handle.write(secrets.token_bytes(KEY_BYTES))
            try:
                os.link(handle.name, path)
            except FileExistsError:  # another run made it first: theirs is used
                pass
            finally:
                os.unlink(handle.name)
        secret = _read_private(path, KEY_BYTES, shared_bits=0o077)
    except OSError:
        return None
    return secret if len(secret) == KEY_BYTES else None


def _load(path: Path, secret: bytes) -> tuple[FitSet, dict[str, PriorConstants]] | None:
    try:
        data = json.loads(_read_private(path, MAX_CACHE_BYTES, shared_bits=0o022))
        payload = data["payload"]
        if not hmac.compare_digest(str(data["digest"]), _digest(payload, secret)):
            return None
        fits = FitSet(fits=tuple(SettingFit.from_json(f) for f in payload["fits"]["fits"]),
                      provenance=payload["fits"]["provenance"])
        return fits, {model: PriorConstants(**values) for model, values in payload["constants"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _read_private(path: Path, limit: int, shared_bits: int) -> bytes:
    """A cache file's bytes; OSError for a FIFO or device (a read would hang or never end), a symlink, a file
    larger than limit (a 2 GB cache took 4.3 GB of memory to parse), or one another user owns or whose mode
    has any of shared_bits (others could write it, or for the key, read it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        status = os.fstat(fd)
        if (not stat.S_ISREG(status.st_mode) or status.st_size > limit or status.st_uid != os.geteuid()
                or status.st_mode & shared_bits):
            raise OSError(f"{path} is not a cache file")
        return handle.read(limit + 1)


def _store(path: Path, data: dict) -> None:
    """Write atomically; a read-only or full disk only costs the next run a refit."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            json.dump(data, handle)
        os.replace(handle.name, path)
    except OSError:
        pass
