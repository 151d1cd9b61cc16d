"""A JSON cache of a dataset's token lengths, so planning the same data again skips reading and tokenizing it.

Tokenizing 100,000 rows takes seconds; reading their lengths back, milliseconds. The key is the caller's
digest of the content of everything the lengths depend on (the data's bytes, the tokenizer's, the fields,
the counting code), never names or file stamps. The file carries a digest of its own payload: a hand-edited
or torn one is counted again, never trusted. JSON only (never pickle): a cache file is data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ftplan.store.fit_cache import _digest, _read_bounded, _store, cache_dir

FORMAT = "ftplan-lengths-cache-1"
READ_CHUNK = 2**20


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks (a dataset may be a GiB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def load(key: str) -> dict | None:
    """The payload stored under key, or None when there is none or it does not match its digest."""
    try:
        data = json.loads(_read_bounded(_path(key)))
        return data["payload"] if data["digest"] == _digest(data["payload"]) else None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def store(key: str, payload: dict) -> None:
    """Write atomically; a read-only or full disk only costs the next plan a recount."""
    _store(_path(key), {"payload": payload, "digest": _digest(payload)})


def _path(key: str) -> Path:
    return cache_dir() / f"lengths-{hashlib.sha256((FORMAT + key).encode()).hexdigest()[:32]}.json"
