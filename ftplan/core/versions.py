"""The library versions a measurement depends on, read from package metadata (no import of the libraries)."""

from __future__ import annotations

import importlib.metadata

# Every package whose version changes a fine-tune's memory or speed; records carry them (calibration/measure.py).
TRACKED_PACKAGES = ("torch", "transformers", "deepspeed", "liger_kernel", "peft", "accelerate", "bitsandbytes",
                    "trl")  # trl: packing runs through its SFTTrainer, whose fused LM head sets the loss memory


def installed_versions() -> dict[str, str | None]:
    """The tracked packages installed here, None for those that are not."""
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions
