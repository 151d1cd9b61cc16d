"""`ftplan predict`: the JSON contract other tools script against, and one-line errors."""

from __future__ import annotations

import json
import re

import pytest

from ftplan.cli.main import main
from tests.helpers import run_ftplan

CONTRACT_KEYS = {"peak_allocated_gib", "peak_reserved_gib", "seconds_per_step"}


def _run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def test_json_holds_the_contract_keys_with_positive_numbers(capsys):
    code, out, _ = _run(capsys, "predict", "--model", "qwen2.5-0.5b", "--batch-size", "2", "--zero-stage", "2",
                        "--gpus", "2", "--json")
    data = json.loads(out)
    assert code == 0
    assert CONTRACT_KEYS <= data.keys()
    assert all(data[key] > 0 for key in CONTRACT_KEYS)
    assert data["peak_reserved_upper_gib"] >= data["peak_reserved_gib"] >= data["peak_allocated_gib"]
    assert data["setting"]["zero_stage"] == 2 and data["setting"]["gpus"] == 2


def test_table_output_names_memory_time_and_source(capsys):
    code, out, _ = _run(capsys, "predict", "--model", "llama-3.2-1b", "--batch-size", "4", "--liger",
                        "--lora-rank", "16", "--gradient-checkpointing", "--gpu", "A100-80GB")
    assert code == 0
    for text in ("peak allocated", "peak reserved", "seconds / step", "evidence:"):
        assert text in out


@pytest.mark.parametrize("args, message", [
    (("--model", "llama-3-9b", "--batch-size", "1"), "unknown model"),
    (("--model", "llama-3-8b", "--batch-size", "1", "--offload"), "offload needs DeepSpeed"),
    (("--model", "llama-3-8b", "--batch-size", "1", "--gpu", "Z80"), "unknown GPU"),
    (("--model", "llama-3-8b", "--batch-size", "1", "--lora-targets", "q_proj,nonsense"), "choose comma-separated"),
])
def test_bad_input_is_one_line_and_a_non_zero_exit(capsys, args, message):
    code, out, err = _run(capsys, "predict", *args)
    assert code != 0
    assert message in err
    assert "Traceback" not in err


def test_piped_predict_prose_is_not_wrapped_at_80_columns(capsys, monkeypatch):
    """The README promises piped output unwrapped prose; predict's memory line broke at 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run_ftplan(["predict", "--model", "llama-3-8b", "--lora-rank", 16, "--batch-size", 4, "--gpu",
                               "H200"], capsys, monkeypatch)
    assert code == 0 and re.search(r"^memory: .*peak reserved [\d.]+ GiB \(upper [\d.]+\) vs usable", out, re.M), out
