"""Where ftplan's shipped data lives, so every stage finds the same files."""

import os
from pathlib import Path


def data_dir() -> Path:
    """The data/ folder: $FTPLAN_DATA if set, else the one beside the installed sources."""
    override = os.environ.get("FTPLAN_DATA")
    return Path(override) if override else Path(__file__).resolve().parent.parent / "data"


def architectures_dir() -> Path:
    return data_dir() / "architectures"


def calibrations_dir() -> Path:
    return data_dir() / "calibrations"
