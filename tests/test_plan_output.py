"""What a user sees of `ftplan plan`: a table that fits a 100-column terminal, the best setup of each family with
the recommendation first, every setup with --all, and full fine-tuning and LoRA side by side when neither is asked."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from rich.table import Table

from ftplan.cli.render import print_table
from ftplan.core.settings import Setting
from tests.helpers import run_ftplan

PLAN_8B = ["plan", "--model", "llama-3-8b", "--dataset-size", 19692, "--gpu", "A100-80GB", "--gpus", 8]
RANK_ROW = re.compile(r"^(→?)(\d+)\s")  # a table row starts with its rank, the recommendation's marked →


def _plan(args, capsys, monkeypatch, columns: int | None = 100) -> str:
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run_ftplan(args, capsys, monkeypatch)
    assert code == 0, err
    return out


def _json(args, capsys, monkeypatch) -> dict:
    return json.loads(_plan([*args, "--json"], capsys, monkeypatch, columns=None))


def _ranks(out: str) -> list[tuple[bool, int]]:
    return [(bool(m.group(1)), int(m.group(2))) for line in out.splitlines() if (m := RANK_ROW.match(line))]


def test_plan_fits_a_100_column_terminal(capsys, monkeypatch):
    for extra in ([], ["--full"], ["--lora", "--price-per-hour", 2.5], ["--gpus", "1..16"]):
        out = _plan([*PLAN_8B, *extra], capsys, monkeypatch)
        assert max(len(line) for line in out.splitlines()) <= 100, extra


def test_compact_table_shows_the_best_of_each_family_with_the_recommendation_first(capsys, monkeypatch):
    plan = _json(PLAN_8B, capsys, monkeypatch)
    rows = _ranks(_plan(PLAN_8B, capsys, monkeypatch))
    assert rows[0][0] and not any(marked for marked, _ in rows[1:])  # the recommendation heads the table
    shown = [plan["ranked"][rank - 1] for _, rank in rows]
    families = {(s["training"], s["setting"]["offload_optimizer"], s["setting"]["liger"],
                 s["setting"]["gradient_checkpointing"], s["setting"]["precision"]) for s in plan["ranked"]}
    assert len(rows) == len(families) < len(plan["ranked"])  # one row a family
    for setup in shown:  # each row is its family's best-ranked setup
        family = [s for s in plan["ranked"] if (s["training"], s["setting"]["offload_optimizer"], s["setting"]["liger"],
                  s["setting"]["gradient_checkpointing"], s["setting"]["precision"])
                  == (setup["training"], setup["setting"]["offload_optimizer"], setup["setting"]["liger"],
                      setup["setting"]["gradient_checkpointing"], setup["setting"]["precision"])]
        assert setup == family[0] or setup["label"] == plan["recommendation"]["label"]


def test_all_lists_every_setup_that_fits(capsys, monkeypatch):
    plan = _json(PLAN_8B, capsys, monkeypatch)
    rows = _ranks(_plan([*PLAN_8B, "--all"], capsys, monkeypatch))
    assert sorted(rank for _, rank in rows) == list(range(1, len(plan["ranked"]) + 1))


def test_rows_keep_their_evidence_label(capsys, monkeypatch):
    out = _plan(PLAN_8B, capsys, monkeypatch)
    assert "evidence" in out and re.search(r"extrapolated|interpolated|measured|prior", out)


def test_without_full_or_lora_the_best_of_each_is_shown_side_by_side_with_what_it_trades(capsys, monkeypatch):
    plan = _json(PLAN_8B, capsys, monkeypatch)
    options = {o["training"]: o for o in plan["best_by_training"]}
    assert set(options) == {"full", "lora"}
    assert options["full"]["setup"]["label"] == next(s["label"] for s in plan["ranked"] if s["training"] == "full")
    assert "all 8,030,261,248 parameters learn" in options["full"]["trades"]
    assert "adapter parameters" in options["lora"]["trades"] and "frozen base" in options["lora"]["trades"]
    out = " ".join(_plan(PLAN_8B, capsys, monkeypatch).split())
    assert "Full fine-tuning or LoRA?" in out and "the choice is yours" in out
    assert options["full"]["setup"]["label"] in out and options["lora"]["setup"]["label"] in out


def test_each_side_of_the_side_by_side_is_what_that_kind_alone_recommends(capsys, monkeypatch):
    """The LoRA column once showed the fastest LoRA setup (zero2+offload) while --lora recommended the simplest
    one within the near tie (ddp): the two must be one choice."""
    base = ["plan", "--model", "gemma-3-1b", "--dataset-size", 50000, "--gpu", "A100-80GB"]
    options = {o["training"]: o["setup"]["label"] for o in _json(base, capsys, monkeypatch)["best_by_training"]}
    for kind in ("full", "lora"):
        assert options[kind] == _json([*base, f"--{kind}"], capsys, monkeypatch)["recommendation"]["label"], kind


def test_the_reason_naming_the_best_of_the_other_kind_names_the_side_by_sides_choice(capsys, monkeypatch):
    """'Best LoRA setup: zero2+offload liger lora16' (the fastest) stood beside best_by_training's 'ddp liger
    lora16' (the better-measured near tie) in one --json document."""
    for base in (["plan", "--model", "gemma-3-1b", "--dataset-size", 50000, "--gpu", "A100-80GB"],
                 ["plan", "--model", "llama-3.2-1b", "--dataset-size", 20000, "--gpu", "H200", "--seq-len", 4096]):
        plan = _json(base, capsys, monkeypatch)
        other = next(o for o in plan["best_by_training"] if o["training"] != plan["recommendation"]["training"])
        named = [r for r in plan["reasons"] if " setup: " in r]
        assert named and f" setup: {other['setup']['label']}, batch {other['setup']['largest_safe_batch']}," in named[0]


def test_full_asks_only_about_full_fine_tuning(capsys, monkeypatch):
    out = _plan([*PLAN_8B, "--full"], capsys, monkeypatch)
    plan = _json([*PLAN_8B, "--full"], capsys, monkeypatch)
    full = [s for s in plan["ranked"] if s["training"] == "full"]
    assert plan["recommendation"]["training"] == "full" and _ranks(out)[0] == (True, 1)  # ranked among full setups
    assert "Full fine-tuning or LoRA?" not in out and "Recommendation: " + plan["recommendation"]["label"] in out
    every = _plan([*PLAN_8B, "--full", "--all"], capsys, monkeypatch)
    assert sorted(rank for _, rank in _ranks(every)) == list(range(1, len(full) + 1))
    assert "lora" not in " ".join(line for line in every.splitlines() if RANK_ROW.match(line))


@pytest.mark.parametrize("width", [30, 60])
def test_a_table_too_wide_for_the_screen_is_printed_wider_never_cut(width):
    table = Table("model", "parameters")
    table.add_row("llama-2-7b", "6,738,415,616")
    console = Console(file=io.StringIO(), width=width)
    print_table(console, table)
    assert "6,738,415,616" in console.file.getvalue() and console.width == width


def test_piped_models_show_whole_parameter_counts(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run_ftplan(["models"], capsys, monkeypatch)
    assert code == 0 and "6,738,415,616" in out and "8,030,261,248" in out and "…" not in out


def test_setups_that_differ_only_in_lora_targets_or_layout_read_differently():
    from ftplan.planner.search import SetupPlan

    attention_only = Setting("olmoe-1b-7b", lora_rank=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    assert SetupPlan(attention_only, None).label.endswith("on q+k+v+o")
    assert "on " not in SetupPlan(attention_only.with_(lora_targets=Setting("x").lora_targets), None).label
    assert "2x8gpu" in Setting("llama-3-8b", gpus=8, nodes=2).label()  # nodes × GPUs, as the tables write it


def test_a_length_past_the_models_context_is_warned_about(capsys, monkeypatch):
    code, out, err = run_ftplan(["plan", "--model", "llama-3-8b", "--gpu", "H200", "--dataset-size", "1000",
                                 "--lora", "--seq-len", "16384"], capsys, monkeypatch)
    assert code == 0, err
    assert "past llama-3-8b's context of 8,192" in out + err
    code, out, err = run_ftplan(["plan", "--model", "llama-3-8b", "--gpu", "H200", "--dataset-size", "1000",
                                 "--lora"], capsys, monkeypatch)
    assert "context of" not in out + err


def test_ranked_by_cost_the_side_by_side_recommendation_says_cheapest(capsys, monkeypatch):
    out = _plan(["plan", "--model", "llama-3.2-1b", "--dataset-size", 1000, "--gpu", "H200", "--by", "cost",
                 "--price-per-hour", 3], capsys, monkeypatch, columns=300)
    heading = next(line for line in out.splitlines() if line.startswith("Recommendation: "))
    assert heading.endswith("(the cheapest of both kinds)"), heading


def test_a_switch_without_which_nothing_fits_names_the_setup_that_does_not(capsys, monkeypatch):
    """"without that, not even batch 1 fits" read as if nothing fits without offload, beside a table of other
    families that do."""
    plan = _json(["plan", "--model", "llama-3-8b", "--gpu", "H200", "--full", "--precision", "bf16",
                  "--dataset-size", 1000], capsys, monkeypatch)
    reason = next(r for r in plan["reasons"] if r.startswith("optimizer offload on: without that"))
    assert re.search(r"without that, \S+ .*full.* does not fit even at batch 1", reason), reason


def test_piped_reasons_are_one_unwrapped_line_each(capsys, monkeypatch):
    """The README promises piped output unwrapped prose; the reasons' grid wrapped them at 120 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    args = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", 1000, "--full"]
    out = _plan(args, capsys, monkeypatch, columns=None)
    reasons = _json(args, capsys, monkeypatch)["reasons"]
    assert reasons and all(f"  • {reason}" in out.splitlines() for reason in reasons)


def test_the_title_counts_packed_rows_as_rows_and_a_cpus_memory_as_the_hosts(tmp_path, capsys, monkeypatch):
    """A packed plan said '945 samples' of a 2,013-sample dataset, and a CPU plan 'usable per GPU'."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": "word " * (20 + i % 300)}) + "\n" for i in range(400)))
    packed = _plan(["plan", "--model", "qwen2.5-0.5b", "--gpu", "H200", "--dataset", data, "--batching", "pack",
                    "--seq-len", "1024"], capsys, monkeypatch, columns=400)
    packed = " ".join(packed.split())  # the table's title wraps at the table's width
    assert re.search(r"[\d,]+ packed rows × 1 epoch", packed) and "samples × 1 epoch" not in packed
    cpu = _plan(["plan", "--model", "tiny-llama", "--gpu", "cpu", "--seq-len", 256, "--dataset-size", 100,
                 "--precision", "fp32"], capsys, monkeypatch, columns=400)
    cpu = " ".join(cpu.split())
    assert "GiB usable of this host's RAM" in cpu and "usable per GPU" not in cpu


def test_a_near_tie_never_trades_mixed_precision_for_pure_bf16(capsys, monkeypatch):
    """Llama-3-8B full on 8 H200s: ZeRO-2 + Liger was fastest and 'ddp liger full bf16-pure' (no fp32 master
    weights: another training's numerics) was recommended over it as the simpler setup of a near tie."""
    plan = _json(["plan", "--model", "llama-3-8b", "--dataset-size", 19692, "--gpu", "H200", "--gpus", 8, "--full"],
                 capsys, monkeypatch)
    fastest = plan["ranked"][0]["setting"]["precision"]
    assert plan["recommendation"]["setting"]["precision"] == fastest == "bf16"
