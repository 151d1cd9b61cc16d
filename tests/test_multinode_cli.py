"""--gpus means GPUs in all in every command, spread over nodes of --gpus-per-node, and every command
prints the layout; plan says its multi-GPU times are unchecked and explains efficiency above 100%."""

from __future__ import annotations

import json
import math

import pytest

from ftplan.cli.main import main

SETTING = ["--model", "llama-3.2-1b", "--seq-len", "1024", "--lora-rank", "16"]


def _run(capsys, *args) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, *args) -> dict:
    code, out, err = _run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("layout, per_node, nodes", [(["--gpus", 16], 8, 2), (["--gpus", 16, "--gpus-per-node", 4], 4, 4),
                                                     (["--gpus", 8, "--nodes", 2], 4, 2), (["--gpus", 9], 3, 3),
                                                     (["--gpus", 4], 4, 1)])
def test_gpus_are_gpus_in_all_in_eta_and_predict(capsys, layout, per_node, nodes):
    eta = _json(capsys, "eta", *SETTING, *layout, "--batch-size", 2, "--dataset-size", 10_000, "--gpu", "H200")
    predicted = _json(capsys, "predict", *SETTING, *layout, "--batch-size", 2, "--gpu", "H200")
    gpus = layout[1]
    for answer in (eta, predicted):
        assert (answer["layout"]["gpus"], answer["layout"]["gpus_per_node"], answer["layout"]["nodes"]) == (gpus, per_node, nodes)
        assert (answer["setting"]["gpus"], answer["setting"]["nodes"]) == (per_node, nodes)
    assert eta["eta"]["steps"] == math.ceil(10_000 / (2 * gpus))
    assert eta["eta"]["seconds_per_step"] == pytest.approx(predicted["seconds_per_step"])


def test_plan_eta_and_predict_price_the_same_16_gpus_alike(capsys):
    plan = _json(capsys, "plan", "--model", "llama-3.2-1b", "--seq-len", 1024, "--lora", "--lora-ranks", 16,
                 "--dataset-size", 10_000, "--gpu", "H200", "--gpus", 16)
    setting = plan["recommendation"]["setting"]
    assert (setting["gpus"], setting["nodes"]) == (8, 2)
    flags = [flag for key, flag in (("liger", "--liger"), ("gradient_checkpointing", "--gradient-checkpointing"),
                                    ("offload_optimizer", "--offload")) if setting[key]]
    zero = ["--zero-stage", setting["zero_stage"]]
    batch = plan["recommendation"]["largest_safe_batch"]
    eta = _json(capsys, "eta", *SETTING, *flags, *zero, "--precision", setting["precision"], "--gpus", 16,
                "--batch-size", batch, "--dataset-size", 10_000, "--gpu", "H200")
    assert eta["eta"]["seconds_per_step"] == pytest.approx(plan["recommendation"]["eta"]["seconds_per_step"])


@pytest.mark.parametrize("layout, words", [(["--gpus", 9, "--nodes", 2], "do not split evenly"),
                                           (["--gpus", 8, "--nodes", 2, "--gpus-per-node", 8], "give one of the two")])
def test_impossible_layouts_are_one_line_errors(capsys, layout, words):
    code, _, err = _run(capsys, "eta", *SETTING, *layout, "--batch-size", 2, "--dataset-size", 100, "--gpu", "H200")
    assert code != 0 and words in err and len(err.strip().splitlines()) == 1


def test_every_command_prints_the_node_layout(capsys):
    _, eta, _ = _run(capsys, "eta", *SETTING, "--gpus", 16, "--batch-size", 2, "--dataset-size", 100, "--gpu", "H200")
    _, predicted, _ = _run(capsys, "predict", *SETTING, "--gpus", 16, "--batch-size", 2, "--gpu", "H200")
    _, plan, _ = _run(capsys, "plan", "--model", "llama-3.2-1b", "--lora", "--lora-ranks", 16, "--dataset-size", 1000,
                      "--gpu", "H200", "--gpus", 16)
    for out in (eta, predicted, plan):
        assert "16 GPUs in all: 2 nodes × 8 GPUs" in " ".join(out.split())


def test_a_larger_step_time_spread_slows_every_step_of_128_ranks(capsys):
    args = ["eta", *SETTING, "--gpus", 128, "--batch-size", 2, "--dataset-size", 10_000, "--gpu", "H200",
            "--inter-node-bandwidth", "ib-ndr"]  # RDMA: compute, not a TCP link shared by 8 GPUs, sets the step
    steady = _json(capsys, *args, "--step-time-cv", 0)["eta"]["seconds_per_step"]
    shared = _json(capsys, *args, "--step-time-cv", 0.2)["eta"]["seconds_per_step"]
    assert shared > steady * 1.15  # the slowest of 128 ranks at cv 0.2: 1.52x the mean compute


def test_plan_says_multi_gpu_times_are_unchecked_and_why_efficiency_exceeds_100_percent(capsys):
    code, out, err = _run(capsys, "plan", "--model", "llama-3-8b", "--gpu", "H200", "--gpus", "1,8", "--full",
                          "--precision", "bf16", "--dataset-size", 20_000)
    assert code == 0, err
    text = " ".join(out.split())
    assert "have not been checked against a multi-GPU measurement of our own" in text
    assert "efficiency 1" in text and "CPU offload is no longer needed at 8 GPUs" in text
    plan = _json(capsys, "plan", "--model", "llama-3-8b", "--gpu", "H200", "--gpus", "1,8", "--full", "--precision",
                 "bf16", "--dataset-size", 20_000)
    full = {row["gpus"]: row for row in plan["scaling"]["tables"]["full"]}
    assert full[8]["efficiency"] > 1 and "offload" in full[8]["above_ideal"]
    assert full[1]["above_ideal"] == ""


@pytest.mark.parametrize("command", [["plan", "--model", "llama-3.2-1b", "--dataset-size", 10000],
                                     ["eta", *SETTING, "--batch-size", 2, "--dataset-size", 10000],
                                     ["predict", *SETTING, "--batch-size", 2]])
def test_the_links_of_one_node_leave_the_network_between_nodes_out(capsys, command):
    """An 8-GPU plan on one node described the 'cloud' link between nodes it never uses."""
    for gpus, between in ((8, False), (16, True)):
        code, out, err = _run(capsys, *command, "--gpu", "H200", "--gpus", gpus)
        said = " ".join(out.split())
        assert code == 0 and "Links: inside a node" in said and ("between nodes" in said) == between, err
