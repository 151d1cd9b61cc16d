"""Where ftplan's data lives, so every stage finds the same files.

Shipped data (architectures, GPU and network catalogs, calibrations) is package data, read through
importlib.resources so a plain `pip install .` or a wheel carries it; $FTPLAN_DATA points elsewhere.
"""

import os
import re
from importlib.resources import files
from pathlib import Path


def data_dir() -> Path:
    """The shipped data folder: $FTPLAN_DATA if set, else the package's own `ftplan/data`."""
    override = os.environ.get("FTPLAN_DATA")
    return Path(override) if override else Path(str(files("ftplan").joinpath("data")))


def architectures_dir() -> Path:
    return data_dir() / "architectures"


def calibrations_dir() -> Path:
    return data_dir() / "calibrations"


def file_name_part(name: object, limit: int = 64) -> str:
    """A name read from a user's file or host (a config's model_type, a machine id) made safe as part of a
    file name: anything but letters, digits, '_', '-' and inner dots becomes '_', so '../' or '/' in it can
    never place a file outside its folder."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:limit].lstrip(".") or "_"
