"""Locks of PyTorch's extension builds (DeepSpeed's CPU Adam, its shared-memory comm) that a killed trial left.

torch.utils.cpp_extension guards each JIT build with a `lock` file (FileBaton) that the building process deletes
when the build ends. A trial ended mid-build (its --timeout, kill -9 of the calibration) never deletes it, and
every later trial that loads the op waits on it for its whole --timeout, recorded as a bare time-out: paid GPU time,
and never a word about the lock. No torch here: the planner's process clears them before and after trials.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STALE_AFTER_SECONDS = 20 * 60  # no build takes this long: an older lock's builder is gone


def extensions_root() -> Path:
    """Where torch builds extensions: $TORCH_EXTENSIONS_DIR, else the user cache's torch_extensions."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"


def build_locks(root: Path | None = None) -> list[Path]:
    """Every build lock under the root: ROOT/pyXY_cuZ/NAME/lock, or ROOT/NAME/lock where the variable names it."""
    root = extensions_root() if root is None else root
    return [*root.glob("*/lock"), *root.glob("*/*/lock")]


def clear_build_locks(since: float | None = None, root: Path | None = None) -> list[Path]:
    """Remove the locks modified at or after `since` (a trial that was just ended left them), or, without it, those
    older than STALE_AFTER_SECONDS; the removed ones."""
    cleared = []
    for lock in build_locks(root):
        try:
            modified = lock.stat().st_mtime
            if (modified >= since) if since is not None else (time.time() - modified > STALE_AFTER_SECONDS):
                lock.unlink()
                cleared.append(lock)
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return cleared
