"""A JSON cache of a dataset's token lengths, so planning the same data again skips reading and tokenizing it.

Tokenizing 100,000 rows takes seconds; reading their lengths back, milliseconds. The key is the caller's
digest of the content of everything the lengths depend on (the data's bytes, the tokenizer's, the fields,
the counting code), never names or file stamps. The file is signed for this user (store/signed_files.py): a
torn, edited or foreign one is counted again, never trusted.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ftplan.store.signed_files import cache_dir, read_signed, write_signed

FORMAT = "ftplan-lengths-cache-1"
READ_CHUNK = 2**20
MAX_CACHE_BYTES = 32 * 2**20  # the dataset reader holds at most 2,000,000 rows: their lengths as JSON take ~14 MB


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks (a dataset may be a GiB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def load(key: str) -> dict | None:
    """The payload stored under key, or None when there is none or it does not match its digest."""
    payload = read_signed(_path(key), MAX_CACHE_BYTES)
    return payload if isinstance(payload, dict) else None


def store(key: str, payload: dict) -> None:
    """Write atomically; a read-only or full disk only costs the next plan a recount."""
    write_signed(_path(key), payload)


def _path(key: str) -> Path:
    return cache_dir() / f"lengths-{hashlib.sha256((FORMAT + key).encode()).hexdigest()[:32]}.json"
