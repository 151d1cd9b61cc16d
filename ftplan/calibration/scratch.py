"""Temporary trial folders that a killed calibration cannot leak.

kill -9 runs no cleanup, so every `ftplan-trial-*` folder of a killed trial stayed in the temporary
folder. Each folder is named after the host and process that made it, and making one removes those of
this host whose process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ftplan.core.paths import file_name_part

PREFIX = "ftplan-trial-"
_OWNED = re.compile(rf"^{PREFIX}(\d+)-(.+)-[^-]+$")  # pid, host, tempfile's random part (which has no '-')


@contextlib.contextmanager
def trial_folder() -> Iterator[Path]:
    """A fresh temporary folder for one trial (or rank), removed when the block ends, or by a later trial
    when this process is killed first."""
    remove_stale_folders(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-{_host()}-") as folder:
        yield Path(folder)


def remove_stale_folders(root: Path) -> None:
    """Remove this user's trial folders in root made on this host by a process that no longer runs.

    The host is in the name because a process id means nothing in another container sharing the folder;
    a folder of another user, a symlink or a folder without an owner in its name is never touched.
    """
    for path in root.glob(f"{PREFIX}*"):
        owner = _OWNED.match(path.name)
        if owner is None or owner[2] != _host() or _running(int(owner[1])):
            continue
        with contextlib.suppress(OSError):
            status = path.lstat()
            if stat.S_ISDIR(status.st_mode) and status.st_uid == os.geteuid():
                shutil.rmtree(path, ignore_errors=True)


def _host() -> str:
    return file_name_part(socket.gethostname())


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or a number no process can have
        return False
    except PermissionError:  # another user's
        return True
    return True
