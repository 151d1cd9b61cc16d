"""JSON cache files signed for one user: what both caches (fits, token lengths) read back only when it is theirs.

A plain digest of a payload anyone can recompute after editing it; an HMAC under a key only this user can
read, no one else can forge. A torn file, an edited one, one another user owns or others could write, a
FIFO, a device, a symlink or an oversized file reads as absent: the caller recomputes, never trusts it.
JSON only (never pickle): a cache file is data.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path

KEY_FILE = "key"
KEY_BYTES = 32


def cache_dir() -> Path:
    """$FTPLAN_CACHE_DIR, else $XDG_CACHE_HOME/ftplan, else ~/.cache/ftplan."""
    if os.environ.get("FTPLAN_CACHE_DIR"):
        return Path(os.environ["FTPLAN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ftplan"


def read_signed(path: Path, limit: int) -> dict | None:
    """The payload stored at path when its signature is this user's, else None."""
    secret = _secret(path.parent)
    if secret is None:
        return None
    try:
        data = json.loads(_read_private(path, limit, shared_bits=0o022))
        payload = data["payload"]
        return payload if hmac.compare_digest(str(data["digest"]), _digest(payload, secret)) else None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def write_signed(path: Path, payload: dict) -> None:
    """Write atomically, signed; a read-only or full disk only costs the next run a recomputation."""
    secret = _secret(path.parent)
    if secret is None:
        return
    handle = None
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            json.dump({"payload": payload, "digest": _digest(payload, secret)}, handle)
        os.replace(handle.name, path)
    except OSError:  # a full disk: the torn temporary file must not stay and keep it full
        if handle is not None:
            with contextlib.suppress(OSError):
                os.unlink(handle.name)


def _digest(payload: dict, secret: bytes) -> str:
    return hmac.new(secret, json.dumps(payload, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def _secret(folder: Path) -> bytes | None:
    """This user's cache key, made on first use; None (no cache) when it cannot be made or is not private.
    The key is written whole, then linked into place, so a concurrent first run never reads half of one."""
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
