"""ftplan: will this fine-tune fit on my GPUs, which setup finishes first, and how long will it take?

    import ftplan
    result = ftplan.plan(model="llama-3-8b", dataset_size=19692, gpu="H200")
    ftplan.predict("llama-3-8b", 4, "H200", lora_rank=16)   # bad arguments raise ftplan.FtplanError
    ftplan.plan("llama-3.2-1b", gpu="H200", dataset="train.jsonl",
                dataset_options=ftplan.DatasetOptions(strategy="pack", global_batch=64))
    trainer.add_callback(ftplan.FtplanCallback())   # needs the calibrate extra (transformers)

Names load on first use: `import ftplan` pulls in neither pandas nor transformers.
"""

from __future__ import annotations

__all__ = ["DatasetOptions", "FtplanCallback", "FtplanError", "plan", "predict"]


def __getattr__(name: str):
    if name in ("plan", "predict"):
        from ftplan.planner import api

        return getattr(api, name)
    if name == "DatasetOptions":
        from ftplan.planner.dataset_plan import DatasetOptions

        return DatasetOptions
    if name == "FtplanError":  # what every check of the API raises: one message, fit for a notebook
        from ftplan.core.errors import FtplanError

        return FtplanError
    if name == "FtplanCallback":
        from ftplan.calibration.callback import FtplanCallback

        return FtplanCallback
    raise AttributeError(f"module 'ftplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
