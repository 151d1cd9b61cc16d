"""All fits of a set of calibration records, and their JSON file (fits.json).

The file carries the records each fit came from and how it was made (including the compute rate
learnt from the other settings), so it can be audited and checked: loading refits every group from
its own records and that rate, and refuses a file whose numbers no longer match them (edited by
hand, or written by a different fitting rule).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from datetime import datetime, timezone
from pathlib import Path

from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting
from ftplan.models.fit import (
    SettingFit,
    fit_groups,
    fit_setting,
    same_run_key,
    setting_without_seq_len,
)

FORMAT = "ftplan-fits"
FORMAT_VERSION = 3  # 2: fits carry the compute rate their step-time slope came from; 3: and their logits bytes
REFIT_TOLERANCE = 1e-6  # relative: refits differ only by floating-point noise across library versions


@dataclass(frozen=True)
class FitSet:
    fits: tuple[SettingFit, ...]
    provenance: dict = field(default_factory=dict)

    def lookup(self, setting: Setting, gpu_name: str) -> SettingFit | None:
        """The fit for this setting on this GPU, if one exists and covers its sequence length; the
        model matches by architecture shape (`Architecture.shape`), not by how its name was typed."""
        for fit in self._by_run_key.get((gpu_name, _run_key(setting)), ()):
            if fit.covers(setting.seq_len):
                return fit
        return None

    @cached_property
    def _by_run_key(self) -> dict[tuple[str, str], list[SettingFit]]:
        """The fits by (GPU name, run key), in file order: one plan looks up hundreds of settings, and keying
        every fit for each lookup was most of its time."""
        index: dict[tuple[str, str], list[SettingFit]] = {}
        for fit in self.fits:
            index.setdefault((fit.gpu_name, same_run_key(fit.setting)), []).append(fit)
        return index

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": FORMAT_VERSION, "provenance": self.provenance,
                "fits": [fit.to_json() for fit in self.fits]}

    @classmethod
    def from_json(cls, data: dict) -> FitSet:
        """Rebuild a FitSet, checking every fit against a refit of its own records."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise FtplanError("not an ftplan fits file")
        if data.get("version") != FORMAT_VERSION:
            raise FtplanError(f"fits format version {data.get('version')} is not {FORMAT_VERSION}; re-run ftplan fit")
        try:
            fits = tuple(SettingFit.from_json(item) for item in data["fits"])
        except (KeyError, TypeError, ValueError) as exc:
            raise FtplanError(f"fits file is incomplete or malformed ({exc!r})") from None
        for fit in fits:
            _check_matches_records(fit)
        return cls(fits=fits, provenance=data.get("provenance", {}))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> FitSet:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise FtplanError(f"cannot read fits file {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise FtplanError(f"fits file {path} is corrupt or truncated ({exc.msg} at line {exc.lineno})") from None
        except UnicodeDecodeError:
            raise FtplanError(f"fits file {path} is not text (a JSON file written by ftplan fit)") from None
        try:
            return cls.from_json(data)
        except FtplanError as exc:
            raise FtplanError(f"fits file {path}: {exc}") from None


@lru_cache(maxsize=4096)
def _run_key(setting: Setting) -> str:
    """same_run_key of a setting less its seq_len, kept: the search asks for the same settings again and again."""
    return same_run_key(setting_without_seq_len(setting.to_dict()))


def fit_records(records: list[dict]) -> FitSet:
    """Fit every (setting without seq_len, GPU) group found among the ok/oom records."""
    sources = sorted({str(r["_source"]).rsplit(":", 1)[0] for r in records if r.get("_source")})
    provenance = {"created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "ftplan_version": _version("ftplan"), "scikit_learn_version": _version("scikit-learn"),
                  "inputs": sources}
    return FitSet(fits=tuple(fit_groups(records)), provenance=provenance)


def _check_matches_records(fit: SettingFit) -> None:
    try:
        refit = fit_setting(list(fit.records), fit.compute_rate).to_json()
    except (FtplanError, KeyError, TypeError, ValueError) as exc:
        raise FtplanError(f"records of the fit for {fit.gpu_name} cannot be refitted ({exc})") from None
    if not _close(refit, fit.to_json()):
        raise FtplanError(f"fit for {fit.label} does not match its records; re-run ftplan fit")


def _close(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(
            a, b, rel_tol=REFIT_TOLERANCE, abs_tol=REFIT_TOLERANCE)
    return a == b


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # here: only a new fit records it, and it loads email

    try:
        return version(package)
    except PackageNotFoundError:
        return None
