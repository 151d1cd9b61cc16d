"""Bytes that torch's ops read and write, counted through its dispatcher: the check on the prior's traffic counts
(tests/test_eager_traffic.py, tests/test_lora_traffic.py). Imported only where torch is installed."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class Traffic(TorchDispatchMode):
    """Sums each op's input and output bytes (tensors of at least `min_numel` elements); a view or in-place alias
    (an output sharing an input's storage) moves nothing and is skipped."""

    def __init__(self, min_numel: int = 0):
        super().__init__()
        self.min_numel = min_numel
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr() for t in inputs}
        if not any(t.untyped_storage().data_ptr() in storages for t in outputs):
            self.bytes += sum(t.numel() * t.element_size() for t in inputs + outputs if t.numel() >= self.min_numel)
        return out
