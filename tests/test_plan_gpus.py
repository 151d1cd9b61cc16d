"""`ftplan plan` over GPU counts on the shipped H200 calibrations: scaling, the chosen count, links, inputs."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "llama-3-8b", "--dataset-size", 19692, "--gpu", "H200"]
UNMASKED = ["--padding", "none"]  # the recipe of the 8B offload trials: rows of exactly seq_len


def _json(args, capsys, monkeypatch) -> dict:
    code, out, err = run_ftplan([*PLAN, *args, "--json"], capsys, monkeypatch)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def range_plan():
    import contextlib
    import io

    from ftplan.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        main([*map(str, PLAN), "--gpus", "1,8,16", "--inter-node-bandwidth", "600MB/s", "--price-per-hour", "3",
              "--max-hours", "0.5", "--json"])
    return json.loads(out.getvalue())


def test_scaling_table_has_full_and_lora_per_gpu_count_with_one_gpu_as_baseline(range_plan):
    tables = range_plan["scaling"]["tables"]
    assert set(tables) == {"full", "lora"}
    lora = {row["gpus"]: row for row in tables["lora"]}
    assert set(lora) == {1, 8, 16} and lora[1]["speedup"] == pytest.approx(1.0)
    for row in lora.values():
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["gpus"])
        assert row["samples_per_second"] == pytest.approx(row["micro_batch"] * row["gpus"] / row["seconds_per_step"])
    assert lora[16]["setting"]["nodes"] == 2 and lora[16]["setting"]["gpus"] == 8


def test_chosen_count_meets_max_hours_at_least_cost(range_plan):
    scaling = range_plan["scaling"]
    rows = [row for table in scaling["tables"].values() for row in table]
    in_time = [row for row in rows if row["hours"] <= 0.5]
    chosen = scaling["chosen"]
    picked = next(r for r in scaling["tables"][chosen["training"]] if r["gpus"] == chosen["gpus"])
    assert picked["hours"] <= 0.5 and picked["cost"] == pytest.approx(min(r["cost"] for r in in_time))
    assert range_plan["recommendation"]["setting"]["gpus"] * range_plan["recommendation"]["setting"]["nodes"] == chosen["gpus"]


def test_lora_traffic_keeps_scaling_across_a_slow_network_where_full_fine_tuning_stalls(range_plan):
    lora = {row["gpus"]: row for row in range_plan["scaling"]["tables"]["lora"]}
    full = {row["gpus"]: row for row in range_plan["scaling"]["tables"]["full"]}
    # 16 GPUs span two nodes over 600 MB/s: full fine-tuning sends every gradient across it, LoRA its adapters
    assert lora[16]["samples_per_second"] / lora[8]["samples_per_second"] > 1.5
    assert full[16]["samples_per_second"] / full[8]["samples_per_second"] < lora[16]["samples_per_second"] / lora[8]["samples_per_second"]


def test_more_bandwidth_between_nodes_is_never_slower():
    from ftplan.core.hardware import find_gpu
    from ftplan.core.paths import calibrations_dir
    from ftplan.store.records import read_records
    from ftplan.core.settings import Setting
    from ftplan.models.communication.links import links_from_catalog
    from ftplan.models.predictor import Predictor
    from ftplan.models.safe_batch import MemoryBudget
    from ftplan.planner.gpu_counts import plan_at
    from ftplan.planner.search import PlanRequest

    records, gpu = read_records([calibrations_dir()]), find_gpu("H200")
    request = PlanRequest(base=Setting("llama-3-8b"), dataset_size=19692, epochs=1, gpu=gpu,
                          budget=MemoryBudget(gpu.memory_bytes))
    hours = []
    fitted = Predictor.fit(records)  # the fit does not depend on the links; with_links prices them
    for inter in ("cloud", "100gbe", "ib-ndr"):
        predictor = fitted.with_links(links_from_catalog(intra="nvlink4", inter=inter))
        plan = plan_at(predictor, request, 32, 8).plan
        hours.append({s.setting: s.eta.hours for s in plan.ranked})
    for slow, fast in zip(hours, hours[1:]):
        assert all(fast[s] <= slow[s] * (1 + 1e-9) for s in slow)


@pytest.mark.parametrize("value, gbs, latency_us", [("25Gbit/s", 3.125, 40), ("cloud", 0.625, 40),
                                                    ("100gbe", 12.5, 9.6), ("2", 2.0, 40)])
def test_inter_node_bandwidth_accepts_rates_and_link_names(value, gbs, latency_us, capsys, monkeypatch):
    plan = _json(["--gpus", 16, "--inter-node-bandwidth", value, "--lora-ranks", 16], capsys, monkeypatch)
    assert plan["links"]["inter_node_gbs"] == pytest.approx(gbs)
    assert plan["links"]["inter_latency_s"] * 1e6 == pytest.approx(latency_us)
    assert plan["recommendation"]["setting"]["nodes"] == 2


def test_user_calibrations_folder_is_read_by_default_and_training_runs_are_counted(tmp_path, capsys, monkeypatch):
    from ftplan.core.paths import calibrations_dir

    shipped = (calibrations_dir() / "h200.jsonl").read_text().splitlines()
    ours = json.loads(shipped[16])  # an ok llama-3-8b LoRA trial
    ours["source"] = "trainer_callback"
    (tmp_path / "calibrations").mkdir()
    (tmp_path / "calibrations" / "mine.jsonl").write_text(json.dumps(ours) + "\n")
    monkeypatch.chdir(tmp_path)
    plan = _json([], capsys, monkeypatch)
    assert [(i["path"], i["records"], i["from_training_runs"]) for i in plan["inputs"]] == [
        (str(calibrations_dir()), len(shipped), 0), ("calibrations", 1, 1)]
    code, out, _ = run_ftplan(PLAN, capsys, monkeypatch)
    said = " ".join(out.split())
    assert code == 0 and f"{len(shipped)} from calibration trials" in said and "1 from your own training runs" in said


def test_offload_rows_of_the_8b_model_say_its_offload_trial_failed_and_the_host_ram_it_needs(capsys, monkeypatch):
    plan = _json(UNMASKED, capsys, monkeypatch)
    setups = {s["label"]: s for s in plan["ranked"] + plan["cannot_fit"]}
    assert "host out of memory" in setups["zero2+offload full gc s2048"]["calibration_failed"]
    assert setups["zero2+offload full s2048"]["calibration_failed"] is None  # only the trial that ran failed
    assert setups["zero2+offload full s2048"]["host_gib_per_node"] > 125
    assert setups["ddp lora16 s2048"]["host_gib_per_node"] == 0
    assert any("125 GiB" in note and "OOM killer" in note for note in plan["unmeasured"])
    code, out, _ = run_ftplan([*PLAN, *UNMASKED], capsys, monkeypatch)
    assert "prior: trial failed" in out and "prior, unmeasured" in out and "host GiB" in out


def test_host_memory_gib_leaves_out_8b_full_offload_with_the_reason(capsys, monkeypatch):
    plan = _json(["--host-memory-gib", 125, *UNMASKED], capsys, monkeypatch)
    short = {s["label"] for s in plan["cannot_fit"] if s["host_memory_short"]}
    assert short == {"zero2+offload full s2048", "zero2+offload full gc s2048", "zero2+offload liger full s2048",
                     "zero2+offload liger full gc s2048"}
    assert not any(s["setting"]["offload_optimizer"] and s["training"] == "full" for s in plan["ranked"])
    assert any(s["setting"]["offload_optimizer"] for s in plan["ranked"])  # LoRA offload needs little host RAM
    # in bf16 mixed precision (fp32 master weights) only offload would fit 8B full fine-tuning
    code, out, _ = run_ftplan([*PLAN, *UNMASKED, "--host-memory-gib", 125, "--full", "--precision", "bf16"], capsys,
                              monkeypatch)
    assert code == 3  # nothing fits: the "does not fit" exit status
    assert "zero2+offload full s2048 (needs 135.6 GiB of host RAM per node for offloaded optimizer states)" in out
    assert "you have 125 GiB per node" in out and "Recommendation:" not in out
    # pure bf16 (8 bytes a parameter) fits on the card itself: what users who load the model in bf16 run
    plan = _json(["--host-memory-gib", 125, "--full"], capsys, monkeypatch)
    assert plan["recommendation"]["setting"]["precision"] == "bf16-pure"
    assert not plan["recommendation"]["setting"]["offload_optimizer"]


def test_full_recommendation_relying_on_offload_warns_about_host_ram_when_it_is_unknown(capsys, monkeypatch):
    plan = _json(["--full", "--precision", "bf16"], capsys, monkeypatch)
    assert plan["recommendation"]["setting"]["offload_optimizer"]
    assert any("135.6 GiB of host RAM" in w and "--host-memory-gib" in w for w in plan["warnings"])


@pytest.mark.parametrize("value", ["0", "-8", "nan"])
def test_bad_host_memory_is_one_line_error(value, capsys, monkeypatch):
    for command in (PLAN, ["eta", "--model", "qwen2.5-0.5b", "--zero-stage", 2, "--offload", "--batch-size", 4,
                           "--dataset-size", 1000, "--gpu", "H200"]):
        code, out, err = run_ftplan([*command, "--host-memory-gib", value], capsys, monkeypatch)
        assert code == 2 and out == ""
        assert err.strip().splitlines() == [f"error: host memory must be a positive number of GiB, got {value.lstrip('+')}"]


def test_eta_says_whether_the_offload_fits_in_host_ram(capsys, monkeypatch):
    eta = ["eta", "--model", "llama-3-8b", "--zero-stage", 2, "--offload", "--gradient-checkpointing",
           "--batch-size", 1, "--dataset-size", 1000, "--gpu", "H200"]
    code, out, _ = run_ftplan([*eta, "--host-memory-gib", 125], capsys, monkeypatch)
    assert code == 3 and "host memory: NOT enough: needs 135.6 GiB" in out and "you have 125" in out
    code, out, _ = run_ftplan([*eta, "--host-memory-gib", 256, "--json"], capsys, monkeypatch)
    result = json.loads(out)
    assert result["host_memory_enough"] and result["fits"] and result["host_gib_per_node"] > 125
    code, out, _ = run_ftplan([*eta, "--host-memory-gib", 125, "--json"], capsys, monkeypatch)
    assert not json.loads(out)["fits"]
    code, out, _ = run_ftplan(eta, capsys, monkeypatch)
    assert "needs 135.6 GiB of host RAM per node" in out and "--host-memory-gib checks it" in out


def test_fit_cache_returns_the_same_predictor_refits_on_any_change_and_never_trusts_an_edited_file(tmp_path, monkeypatch):
    from ftplan.core.hardware import load_catalog
    from ftplan.core.paths import calibrations_dir
    from ftplan.store.records import read_records
    from ftplan.store.fit_cache import cache_key, cached_predictor

    monkeypatch.setenv("FTPLAN_CACHE_DIR", str(tmp_path / "cache"))
    records, catalog = read_records([calibrations_dir()]), load_catalog()
    fitted = cached_predictor(records, catalog)
    (stored,) = (tmp_path / "cache").glob("predictor-*.json")
    again = cached_predictor(records, catalog)
    assert [f.to_json() for f in again.fits.fits] == [f.to_json() for f in fitted.fits.fits]
    assert again.constants == fitted.constants
    edited = [dict(r) for r in records]
    edited[0]["peak_allocated_bytes"] += 1  # same size and mtime on disk would still differ in content
    assert cache_key(edited, catalog) != cache_key(records, catalog)
    other = {**catalog, "X": catalog["H200"]}
    assert cache_key(records, other) != cache_key(records, catalog)  # another GPU catalog refits the prior
    # a hand-edited cache (constants changed, digest not) is refitted, not trusted
    data = json.loads(stored.read_text())
    data["payload"]["constants"][""]["memory_margin"] = 0.0
    stored.write_text(json.dumps(data))
    assert cached_predictor(records, catalog).constants == fitted.constants


def test_nothing_fitting_at_any_gpu_count_exits_3_as_one_count_does(capsys, monkeypatch):
    """The scaling search turned the 'does not fit' of each count into a plain error: exit 2, a bad request."""
    base = ["plan", "--model", "llama-3-8b", "--dataset-size", 1000, "--gpu", "RTX-3090", "--full", "--seq-len", 8192]
    for gpus in ("1", "1,2"):
        code, _, err = run_ftplan([*base, "--gpus", gpus], capsys, monkeypatch)
        assert code == 3 and "fits" in err, (gpus, err)


def test_the_padded_row_of_a_setup_whose_unpadded_trial_failed_says_so(capsys, monkeypatch):
    """The 8B offload trial was killed for host RAM, unpadded; the plan (padded by default) said 'rows marked
    trial failed' over rows none of which was marked. A kill does not depend on the padding."""
    setups = {s["label"]: s for s in _json([], capsys, monkeypatch)["ranked"]}
    assert "host out of memory" in setups["zero2+offload full gc s2048 padded"]["calibration_failed"]
    assert setups["zero2+offload full s2048 padded"]["calibration_failed"] is None
    code, out, _ = run_ftplan(["plan", "--model", "llama-3-8b", "--gpu", "RTX-3090", "--dataset-size", 1000,
                               "--allow", "qlora"], capsys, monkeypatch)
    said = " ".join(out.split())
    assert code == 0 and "its trial failed" in said and "rows marked" not in said  # no such row on this card
