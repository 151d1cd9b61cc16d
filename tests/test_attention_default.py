"""Gemma 2 caps its attention scores with tanh, which SDPA cannot compute: transformers 5.2x refuses
attn_implementation="sdpa" for it, so a plan or calibration of it loads eager unless told flash_attention_2,
and an explicit sdpa is one clear error rather than an emitted config that fails at load (or, on older
transformers, trains without the cap)."""

from __future__ import annotations

import pytest

from ftplan.core.architecture import run_attention
from ftplan.core.errors import FtplanError
from ftplan.planner import api
from tests.helpers import run_ftplan


def test_the_default_attention_is_sdpa_except_where_sdpa_cannot_compute_the_model():
    assert run_attention("llama-3-8b", None) == "sdpa"
    assert run_attention("gemma-3-1b", None) == "sdpa"
    assert run_attention("gemma-2-2b", None) == "eager"
    assert run_attention("gemma-2-2b", "flash_attention_2") == "flash_attention_2"


def test_sdpa_for_a_softcapped_model_is_refused_with_the_alternatives():
    with pytest.raises(FtplanError, match="softcapping.*eager or flash_attention_2"):
        run_attention("gemma-2-2b", "sdpa")


def test_a_gemma_2_plan_emits_eager_and_prices_its_scores():
    eager = api.plan("gemma-2-2b", 1000, "H200", training="lora")
    flash = api.plan("gemma-2-2b", 1000, "H200", training="lora", attention="flash_attention_2")
    assert eager.recommendation.best.setting.attention == "eager"
    assert eager.recommendation.best.micro_batch < flash.recommendation.best.micro_batch


def test_the_cli_refuses_sdpa_for_gemma_2_in_one_line(capsys, monkeypatch):
    code, _out, err = run_ftplan(["predict", "--model", "gemma-2-2b", "--attention", "sdpa", "--batch-size", "1"],
                                 capsys, monkeypatch)
    assert code == 2 and "softcapping" in err and len(err.strip().splitlines()) == 1
