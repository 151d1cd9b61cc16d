"""Bad input to plan, eta, report and gpus: one `error:` line on stderr, a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "llama-3-8b", "--dataset-size", 1000, "--gpu", "H200"]
ETA = ["eta", "--model", "llama-3-8b", "--batch-size", 1, "--dataset-size", 1000, "--gpu", "H200"]


def _replace(args: list, option: str, value) -> list:
    args = list(args)
    args[args.index(option) + 1] = value
    return args


def _assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code != 0
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("args, fragments", [
    (_replace(PLAN, "--model", "llama-3-8"), ("unknown model 'llama-3-8'", "did you mean llama-3-8b")),
    (_replace(PLAN, "--gpu", "H201"), ("unknown GPU 'H201'", "did you mean H200")),
    (_replace(PLAN, "--dataset-size", 0), ("dataset size must be positive",)),
    ([*PLAN, "--epochs", -1], ("epochs must be positive",)),
    ([*ETA, "--epochs", "1e305"], ("more than 1e+12 optimizer steps",)),
    ([*PLAN, "--seq-len", 0], ("sequence length must be positive",)),
    ([*PLAN, "--gpus", 0], ("cannot read GPU count '0'",)),
    ([*PLAN, "--gpus", "1..64", "--inter-node-bandwidth", "fast"], ("cannot read bandwidth 'fast'",)),
    ([*PLAN, "--price-per-hour", -2], ("price per hour must be positive",)),
    ([*PLAN, "--calibrations", "/nonexistent/h200.jsonl"], ("/nonexistent/h200.jsonl does not exist",)),
    (_replace(ETA, "--batch-size", 0), ("0 is not in the range x>=1",)),
    (_replace(ETA, "--dataset-size", -5), ("dataset size must be positive",)),
    ([*ETA, "--epochs", 0], ("epochs must be positive",)),
    (_replace(ETA, "--gpu", "A100-90GB"), ("unknown GPU", "A100-80GB")),
    # NaN passed click's ranges (every comparison with it is false): a calibration's watchdog that never fired
    (["calibrate", "--model", "tiny-llama", "--device", "cpu", "--timeout", "nan"], ("'nan' is not a finite number",)),
    (["calibrate", "--model", "tiny-llama", "--device", "cpu", "--timeout", "inf"], ("'inf' is not a finite number",)),
    ([*PLAN, "--step-time-cv", "nan"], ("'nan' is not a finite number",)),
    (["report", "--epochs", "nan"], ("'nan' is not a finite number",)),
])
def test_bad_values_fail_with_one_line(args, fragments, capsys, monkeypatch):
    _assert_one_line_error(*run_ftplan(args, capsys, monkeypatch)[::2], *fragments)


def test_corrupt_calibration_file_is_refused(tmp_path, capsys, monkeypatch):
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"schema_version": 1, "model": "llama-3-8b", "micro_b\nnot json at all\n')
    code, _, err = run_ftplan([*PLAN, "--calibrations", corrupt], capsys, monkeypatch)
    _assert_one_line_error(code, err, "no valid calibration records")
    assert "corrupt.jsonl:1" in err and "corrupt.jsonl:2" in err  # each skipped line named as a warning


def test_a_gpu_too_small_for_any_setup_is_one_clear_error(tmp_path, capsys, monkeypatch):
    specs = tmp_path / "gpus.csv"
    specs.write_text("name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs\nTINY-1G,1,10,100\n")
    code, _, err = run_ftplan([*_replace(PLAN, "--gpu", "TINY-1G"), "--gpu-specs", specs], capsys, monkeypatch)
    _assert_one_line_error(code, err, "no setup of llama-3-8b", "fits on TINY-1G even at batch 1")


@pytest.mark.parametrize("csv, fragment", [
    ("name,memory_gib\nX,10\n", "lack column(s) bf16_dense_tflops, memory_bandwidth_gbs"),
    ("name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs\nX,lots,10,100\n", "memory_gib must hold positive numbers"),
    ("name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs\nX,-4,10,100\n", "memory_gib must hold positive numbers"),
])
def test_bad_gpu_specs_csv_is_refused(tmp_path, csv, fragment, capsys, monkeypatch):
    specs = tmp_path / "gpus.csv"
    specs.write_text(csv)
    for command in (["gpus"], PLAN):
        _assert_one_line_error(*run_ftplan([*command, "--gpu-specs", specs], capsys, monkeypatch)[::2], fragment)


def test_missing_gpu_specs_file_is_refused(capsys, monkeypatch):
    _assert_one_line_error(*run_ftplan(["gpus", "--gpu-specs", "/nonexistent.csv"], capsys, monkeypatch)[::2],
                           "cannot read GPU specs /nonexistent.csv")


def test_report_without_records_to_plot_is_refused(tmp_path, capsys, monkeypatch):
    from tests.helpers import write_external_jsonl
    external = write_external_jsonl(tmp_path / "external.jsonl")
    code, _, err = run_ftplan(["report", "--model", "llama-2-7b", "--calibrations", external, "--out", tmp_path],
                              capsys, monkeypatch)
    _assert_one_line_error(code, err, "no calibration records of llama-2-7b")
    code, _, err = run_ftplan(["report", "--model", "llama-3.2-1", "--out", tmp_path / "r"], capsys, monkeypatch)
    _assert_one_line_error(code, err, "unknown model 'llama-3.2-1'; did you mean llama-3.2-1b")  # not 'no records'


def test_the_installed_console_script_prints_one_line_too():
    """The script beside the running interpreter (its venv's bin/), found whether or not the venv is activated."""
    script = Path(sys.executable).parent / "ftplan"
    if not script.exists():
        pytest.skip("ftplan is not installed in this interpreter's environment (run from a source checkout)")
    result = subprocess.run([str(script), "plan", "--model", "lama-3-8b", "--dataset-size", "10", "--gpu", "H200"],
                            capture_output=True, text=True)
    _assert_one_line_error(result.returncode, result.stderr, "did you mean llama-3-8b")


@pytest.mark.parametrize("args, fragments", [
    (["report", "--dataset-size", 0], ("'--dataset-size': 0 is not in the range x>=1", "see ftplan report --help")),
    (["plan", "--model", "llama-3-8b", "--gpu", "H200"], ("Missing option '--dataset-size'", "see ftplan plan --help")),
    ([*PLAN, "--by", "speed"], ("'--by': 'speed' is not one of 'time', 'cost'",)),
    ([*PLAN, "--bogus"], ("No such option '--bogus'",)),
    (["predict", "--model", "llama-3-8b", "--batch-size", 1, "--zero-stage", 7], ("'--zero-stage': '7'",)),
    (["nosuch"], ("No such command 'nosuch'", "see ftplan --help")),
])
def test_click_usage_errors_are_one_line_without_the_usage_block(args, fragments, capsys, monkeypatch):
    code, _, err = run_ftplan(args, capsys, monkeypatch)
    _assert_one_line_error(code, err, *fragments)
    assert "Usage:" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args, fragment", [
    (_replace(ETA, "--dataset-size", "9" * 400), "more than 1e+12 samples"),
    (_replace(PLAN, "--dataset-size", "9" * 400), "more than 1e+12 samples"),
    ([*_replace(PLAN, "--dataset-size", 1000), "--gpus", "1..100000"], "use --gpus up to 1,000"),
])
def test_numbers_nobody_can_mean_are_refused_with_the_limit(args, fragment, capsys, monkeypatch):
    _assert_one_line_error(*run_ftplan(args, capsys, monkeypatch)[::2], fragment)


def test_a_gpu_spec_too_large_to_be_a_card_is_refused(tmp_path, capsys, monkeypatch):
    specs = tmp_path / "gpus.csv"
    specs.write_text("name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs\nHUGE,1e308,100,1000\n")
    code, _out, err = run_ftplan([*_replace(PLAN, "--gpu", "HUGE"), "--gpu-specs", specs], capsys, monkeypatch)
    _assert_one_line_error(code, err, "above 1e+07")


def test_dataset_batching_options_without_a_dataset_are_refused_not_ignored(capsys, monkeypatch):
    code, _, err = run_ftplan(["plan", "--model", "llama-3-8b", "--gpu", "H200", "--dataset-size", "100",
                               "--global-batch", "64"], capsys, monkeypatch)
    _assert_one_line_error(code, err, "--global-batch needs --dataset")


@pytest.mark.parametrize("args, message", [
    (["eta", "--model", "llama-3.2-1b", "--gpu", "X1", "--gpu-specs", "SPECS", "--batch-size", 1, "--dataset-size", 1000],
     "bf16_dense_tflops must hold positive numbers, at least 0.001"),
    (["plan", "--model", "llama-3.2-1b", "--gpu", "H100", "--dataset-size", 1000, "--price-per-hour", "1e308", "--json"],
     "price per hour 1e+308 is above 1e+06 a GPU-hour"),
])
def test_numbers_that_overflow_to_infinity_are_refused(tmp_path, capsys, monkeypatch, args, message):
    """1e-300 TFLOP/s ended in an OverflowError traceback; a price of 1e308 printed costs of Infinity (invalid JSON)."""
    specs = tmp_path / "specs.csv"
    specs.write_text("name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs\nX1,80,1e-300,3350\n")
    code, out, err = run_ftplan([str(specs) if a == "SPECS" else a for a in args], capsys, monkeypatch)
    assert code == 2 and message in err and "Infinity" not in out, err


@pytest.mark.parametrize("flag, value", [("--batch-sizes", "1,99999999999999999999"), ("--max-batch", "99999999999"),
                                         ("--seq-len", "9" * 20), ("--steps", "9" * 20), ("--warmup-steps", "9" * 20),
                                         ("--gpus", "9" * 20)])
def test_calibrate_refuses_a_batch_no_card_holds_before_any_trial(capsys, monkeypatch, flag, value):
    """10^20 started a trial that built its row list for the whole --timeout (RSS growing by the GB); as steps or
    GPUs it hung, as a length it wrote an error record of torch's overflow."""
    code, _, err = run_ftplan(["calibrate", "--device", "cpu", "--model", "tiny-llama", flag, value], capsys, monkeypatch)
    assert code == 2 and ("at most" in err or "range" in err) and err.count("\n") == 1, err


@pytest.mark.parametrize("extra, message", [
    (["--dataset-size", 1000], "--dataset-size is the sample count without --dataset"),
    (["--pack-length", 128], "--pack-length sets packed rows: it needs --batching pack"),
])
def test_plan_refuses_a_dataset_flag_it_would_ignore(tmp_path, capsys, monkeypatch, extra, message):
    """Both were dropped without a word: the file's rows were planned, and the dynamic padding unpacked."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    code, _, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H100", "--dataset", data, *extra],
                              capsys, monkeypatch)
    assert code == 2 and message in err, err


def test_calibrate_refuses_a_batch_list_beside_the_full_ladder(capsys, monkeypatch):
    """--max-batch 4 --batch-sizes 1,2 ran the list and dropped the ladder's cap without a word."""
    code, _, err = run_ftplan(["calibrate", "--device", "cpu", "--model", "tiny-llama", "--max-batch", 4,
                               "--batch-sizes", "1,2"], capsys, monkeypatch)
    assert code == 2 and "--batch-sizes runs the batches listed, --max-batch the full ladder: give one" in err, err


@pytest.mark.parametrize("flags, words", [
    (["--full", "--lora-ranks", "8"], "full fine-tuning alone leaves them out: give one (--full or --lora-ranks)"),
    (["--full", "--lora-ranks", "16,64"], "full fine-tuning alone leaves them out"),  # the default's ranks, given
    (["--full", "--allow", "qlora"], "full fine-tuning alone leaves it out: give one (--full or --allow qlora)"),
    (["--lora", "--allow", "qlora", "--precision", "fp32"], "precision fp32 leaves it out"),
])
def test_plan_refuses_options_it_would_drop(capsys, monkeypatch, flags, words):
    """Each was planned without the option and without a word: full fine-tuning and no ranks or QLoRA rows,
    or LoRA without QLoRA."""
    code, _, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H100", "--dataset-size", 1000, *flags],
                              capsys, monkeypatch)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_long_tail_that_fits_nowhere_is_said_with_its_lengths_and_the_limit_that_would_fit(tmp_path, capsys,
                                                                                               monkeypatch):
    """Planned at its longest sample (188,763 tokens) a new user's first `plan --dataset` exited 3 with one line
    that said nothing of the dataset; the distribution and a --seq-len to try are the way on."""
    data = tmp_path / "d.jsonl"
    rows = ["word " * 300] * 99 + ["word " * 400_000]
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in rows))
    code, _, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H100", "--dataset", data], capsys,
                              monkeypatch)
    assert code == 3 and len(err.strip().splitlines()) == 1, err
    assert re.search(r"the dataset's samples: p50 [\d,]+, .*max [\d,]+ tokens; --seq-len \d+ \(its p99\)", err), err


@pytest.mark.parametrize("args", [["calibrate", "--device", "cpu", "--model", "tiny-llama"],
                                  ["plan", "--model", "tiny-llama", "--gpu", "cpu", "--dataset-size", 100]])
def test_a_cuda_allocator_setting_on_the_cpu_is_refused(capsys, monkeypatch, args):
    """It was recorded (and planned, and suggested for calibration) as a setting that changed nothing."""
    code, _, err = run_ftplan([*args, "--alloc-conf", "expandable_segments:True"], capsys, monkeypatch)
    assert code == 2 and "sets PyTorch's CUDA allocator; a CPU run has none" in err, err
