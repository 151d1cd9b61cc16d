"""The activation count against what autograd saves (benchmarks/saved_tensors.py): shrunk models of seven
families (dense, MoE, q/k norms, Gemma's norms), full fine-tuning with fp32 and bf16 weights and LoRA, and eager
attention's scores (Gemma 2's softcapped ones too), on the CPU."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("peft")

from benchmarks.saved_tensors import rows  # noqa: E402


def test_the_count_is_what_autograd_saves_per_layer_and_token():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = rows()
    assert len({arch for arch, *_ in table}) >= 8 and len(table) >= 25
    assert sum("eager" in mode for _, mode, *_ in table) >= 4
    for arch, mode, measured, counted in table:
        assert counted == pytest.approx(measured, rel=0.02), (arch, mode)
