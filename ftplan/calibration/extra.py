"""Whether the calibrate extra is installed, asked before any trial starts.

Without torch every trial failed in its child process, each failure was appended as an error record,
calibrate exited 0, and later plans quoted 'prior: trial failed'. find_spec finds a package without
importing it, so the planner process stays free of torch.
"""

from __future__ import annotations

import importlib.util

INSTALL_EXTRA = 'pip install "ftplan[calibrate]"'
TRIAL_MODULES = ("torch", "transformers", "accelerate")  # what every trial imports (Trainer needs accelerate)


def missing(*modules: str) -> list[str]:
    """The modules among these that are not installed."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def extra_problem(command: str, modules: tuple[str, ...] = TRIAL_MODULES) -> str | None:
    """Why `command` cannot run here, naming the extra to install, or None."""
    absent = missing(*modules)
    if not absent:
        return None
    return (f"{command} needs {', '.join(absent)}, not installed here: {INSTALL_EXTRA} "
            "(install torch for your platform first; see the README)")
