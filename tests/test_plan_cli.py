"""`ftplan plan` end to end, on the public measurements fitted by the real Predictor."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import planned_batch_fits, run_ftplan, write_external_jsonl

QWEN_ON_3090 = ["plan", "--model", "qwen1.5-0.5b", "--dataset-size", 19692, "--gpu", "RTX-3090"]


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    return write_external_jsonl(tmp_path_factory.mktemp("calibrations") / "external.jsonl")


def _plan_json(args, external, capsys, monkeypatch) -> dict:
    code, out, err = run_ftplan([*args, "--calibrations", external, "--json"], capsys, monkeypatch)
    assert code == 0, err
    return json.loads(out)


def test_plan_table_ranks_setups_and_explains_the_recommendation(external, capsys, monkeypatch):
    code, out, err = run_ftplan([*QWEN_ON_3090, "--calibrations", external, "--price-per-hour", 0.3],
                                capsys, monkeypatch)
    assert code == 0, err
    assert "Recommendation:" in out and "optimizer offload" in out and "Liger" in out
    assert "23.1 GiB = 23.6 GiB (measured by calibration) × (1 − 2% safety margin)" in out  # PyTorch's 23.56 GiB
    assert re.search(r"ETA \d+:\d\d", out)


def test_calibrated_settings_appear_with_their_measured_largest_safe_batch(external, capsys, monkeypatch):
    plan = _plan_json([*QWEN_ON_3090, "--padding", "none"], external, capsys, monkeypatch)  # their recipe
    calibrated = [s for s in plan["ranked"] if s["prediction"]["source"] in ("measured", "interpolated")]
    assert calibrated, "the public measurements' own settings must be planned from their fits"
    # zero3 without checkpointing ran batch 2 and ran out of memory at 3 (public measurements)
    zero3 = next(s for s in calibrated if s["label"] == "zero3 full s2048 fp16")
    assert zero3["largest_safe_batch"] <= 2


def test_json_ranking_is_by_time_and_batches_fit_the_budget(external, capsys, monkeypatch):
    plan = _plan_json(QWEN_ON_3090, external, capsys, monkeypatch)
    hours = [s["eta"]["hours"] for s in plan["ranked"]]
    assert hours == sorted(hours)
    assert all(planned_batch_fits(s["prediction"], plan) for s in plan["ranked"])
    # the fastest, or a near tie of it with fewer moving parts (no DeepSpeed or CPU offload)
    rec = next(s for s in plan["ranked"] if s["label"] == plan["recommendation"]["label"])
    assert rec["eta"]["hours"] <= hours[0] * 1.05 and plan["reasons"]
    assert rec is plan["ranked"][0] or "zero" not in rec["label"]


def test_full_flag_recommends_full_fine_tuning_and_says_what_lora_would_trade(external, capsys, monkeypatch):
    plan = _plan_json([*QWEN_ON_3090, "--full"], external, capsys, monkeypatch)
    assert plan["recommendation"]["training"] == "full"
    assert any("LoRA" in reason for reason in plan["reasons"])


def test_max_hours_filters(external, capsys, monkeypatch):
    plan = _plan_json([*QWEN_ON_3090, "--max-hours", 1.0], external, capsys, monkeypatch)
    assert plan["ranked"] and plan["over_max_hours"]
    assert all(s["eta"]["hours"] <= 1.0 for s in plan["ranked"])
    assert all(s["eta"]["hours"] > 1.0 for s in plan["over_max_hours"])


def test_a_recommendation_from_the_prior_alone_is_warned(external, capsys, monkeypatch):
    plan = _plan_json([*QWEN_ON_3090, "--lora"], external, capsys, monkeypatch)  # no LoRA was measured
    assert plan["recommendation"]["prediction"]["source"] == "prior"
    assert any("analytic prior alone" in w for w in plan["warnings"])


def test_plan_module_import_does_not_import_torch():
    probe = "import sys, ftplan.cli.main, ftplan.planner.search, ftplan.cli.plots, ftplan.planner.emit; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_full_and_lora_together_are_refused_and_each_alone_sets_what_is_recommended(capsys, monkeypatch):
    base = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", "1000"]
    code, _, err = run_ftplan([*base, "--full", "--lora"], capsys, monkeypatch)
    assert code == 2 and "--full and --lora contradict each other" in err  # the last one once won silently
    for flag, full in (("--full", True), ("--lora", False)):
        code, out, _ = run_ftplan([*base, flag, "--json"], capsys, monkeypatch)
        assert code == 0
        assert (json.loads(out)["recommendation"]["setting"]["lora_rank"] == 0) == full


def test_a_dataset_of_short_rows_is_planned_at_its_lengths_even_where_the_cap_would_not_fit(tmp_path, capsys,
                                                                                             monkeypatch):
    """Llama-3-8B LoRA on a 24 GB card fits no 2,048-token sample; the plan first planned at that cap and refused
    a dataset whose longest row is 50 tokens."""
    import json

    from tests.helpers import run_ftplan

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in [20] * 40 + [50]))
    base = ["plan", "--model", "llama-3-8b", "--gpu", "RTX-3090", "--lora", "--json", "--seq-len", 2048]
    code, _, err = run_ftplan([*base, "--dataset-size", 41], capsys, monkeypatch)
    assert code == 3, err  # at the cap nothing fits: the premise
    code, stdout, err = run_ftplan([*base, "--dataset", data, "--ids-field", "input_ids"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(stdout)["dataset"]["recommended"]["memory_length"] == 50


def test_with_a_dataset_seq_len_cuts_only_when_given_and_the_api_agrees(tmp_path, capsys, monkeypatch):
    """--seq-len not given: memory is planned at the dataset's longest sample; given: samples are cut at it. The
    API takes seq_len=None for the first (it once cut every dataset at its 2,048 default)."""
    import json

    import ftplan
    from tests.helpers import run_ftplan

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in [10] * 40 + [3000]))
    base = ["plan", "--model", "qwen2.5-0.5b", "--gpu", "H200", "--dataset", data, "--ids-field", "input_ids"]
    code, stdout, _ = run_ftplan(base, capsys, monkeypatch)
    assert code == 0 and "× 3,000 tokens" in stdout
    code, stdout, _ = run_ftplan([*base, "--seq-len", "2048"], capsys, monkeypatch)
    assert code == 0 and "1 samples are longer than 2,048 tokens" in stdout
    whole = ftplan.plan(model="qwen2.5-0.5b", dataset=data, ids_field="input_ids").to_dict()["dataset"]
    cut = ftplan.plan(model="qwen2.5-0.5b", dataset=data, ids_field="input_ids", seq_len=2048).to_dict()["dataset"]
    assert (whole["recommended"]["memory_length"], cut["recommended"]["memory_length"]) == (3000, 2048)


def test_json_where_nothing_fits_in_memory_prints_a_document_and_exits_3(capsys, monkeypatch):
    """It printed nothing on stdout: a script reading --json got an empty document."""
    code, out, err = run_ftplan(["plan", "--model", "llama-3-8b", "--gpu", "3090", "--full", "--dataset-size", 1000,
                                 "--json"], capsys, monkeypatch)
    document = json.loads(out)
    assert code == 3 and document["recommendation"] is None and document["fits"] is False
    assert "even at batch 1" in document["error"] and err.startswith("error: ")


def test_with_a_long_tail_json_says_the_batch_a_row_runs_and_the_largest_that_fits(tmp_path, capsys, monkeypatch):
    """largest_safe_batch held the fastest safe batch of a dynamic-padding plan (9), where 38 fits and the text
    said so: now micro_batch is the batch run, largest_safe_batch the largest that fits."""
    import json
    import random

    from tests.helpers import run_ftplan

    rng = random.Random(0)
    lengths = [min(2048, int(rng.lognormvariate(5.5, 1.0))) + 1 for _ in range(3000)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in lengths))
    code, out, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset", data,
                                 "--ids-field", "input_ids", "--seq-len", 2048, "--json"], capsys, monkeypatch)
    assert code == 0, err
    plan = json.loads(out)
    rec, batching = plan["recommendation"], plan["dataset"]["recommended"]
    assert rec["micro_batch"] == batching["micro_batch"] < rec["largest_safe_batch"] == \
        batching["largest_fitting_micro_batch"]
    assert all(row["micro_batch"] <= row["largest_safe_batch"] for row in plan["ranked"])


def test_few_steps_at_the_users_own_global_batch_are_said_without_advice_to_change_it(tmp_path, capsys, monkeypatch):
    """--global-batch 64 on 320 rows makes 5 steps: the warning told the user the batch was the plan's choice and a
    smaller --global-batch would make more, of a batch they had chosen."""
    import json

    from tests.helpers import run_ftplan

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1] * (50 + i % 200)}) + "\n" for i in range(320)))
    base = ["plan", "--model", "qwen2.5-0.5b", "--gpu", "H200", "--dataset", data, "--ids-field", "input_ids"]
    code, out, err = run_ftplan([*base, "--global-batch", 64], capsys, monkeypatch)
    said = " ".join((out + err).split())
    assert code == 0 and "makes 5 optimizer steps at your --global-batch 64" in said
    assert "a smaller --global-batch N makes more steps" not in said
    code, out, err = run_ftplan(base, capsys, monkeypatch)
    assert code == 0 and "a smaller --global-batch N makes more steps" in " ".join((out + err).split())
