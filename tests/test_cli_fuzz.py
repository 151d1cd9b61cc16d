"""Fuzzed command lines (hypothesis): any value for any option of plan, predict, eta, fit, models and
gpus ends in output or in one `error:` / usage line with a non-zero exit, never a traceback.

test_bad_input.py pins the wording for chosen bad values; this throws random text, negative, huge,
non-finite and empty values at every option to find the ones nobody chose.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftplan.core.errors import EXIT_DOES_NOT_FIT
from ftplan.core.paths import calibrations_dir
from ftplan.cli.main import main
from tests.helpers import within

# Three shipped records of one setting (batches 1, 2, 4) are evidence enough for every command's whole path, and fast.
FEW_RECORDS = (calibrations_dir() / "h200.jsonl").read_text().splitlines()[:3]
MODEL = "qwen2.5-0.5b"

BASE = {
    "plan": ["plan", "--model", MODEL, "--dataset-size", "1000", "--gpu", "H200", "--calibrations", "few.jsonl"],
    "predict": ["predict", "--model", MODEL, "--batch-size", "2", "--calibrations", "few.jsonl"],
    "eta": ["eta", "--model", MODEL, "--batch-size", "2", "--dataset-size", "1000", "--gpu", "H200",
            "--calibrations", "few.jsonl"],
    "fit": ["fit", "few.jsonl", "--out", "fits.json"],
    "models": ["models"],
    "gpus": ["gpus"],
}
OPTIONS = {
    "plan": ["--model", "--dataset-size", "--epochs", "--seq-len", "--gpu", "--gpus", "--nodes", "--price-per-hour",
             "--max-hours", "--by", "--lora-ranks", "--safety-margin", "--context-reserve-gib", "--calibrations",
             "--gpu-specs", "--intra-node-bandwidth", "--inter-node-bandwidth", "--host-memory-gib"],
    "predict": ["--model", "--batch-size", "--seq-len", "--precision", "--zero-stage", "--lora-rank", "--lora-targets",
                "--gpus", "--nodes", "--gpu", "--alloc-conf", "--calibrations", "--gpu-specs"],
    "eta": ["--model", "--batch-size", "--dataset-size", "--epochs", "--seq-len", "--price-per-hour", "--gpu", "--gpus",
            "--safety-margin", "--context-reserve-gib", "--lora-rank", "--zero-stage", "--calibrations",
            "--intra-node-bandwidth", "--inter-node-bandwidth"],
    "fit": ["--out", None],  # None: the positional RECORDS argument
    "models": [None],
    "gpus": ["--gpu-specs", None],
}
SPECIAL = ["nan", "-nan", "inf", "-inf", "1e309", "-1e309", "0", "-0", "-1", "", " ", "0x10", "1e3", "1,2", ",", "..",
           "1..", "9" * 40, "-" + "9" * 40, "H200", "llama-3-8b", "/", ".", "/dev/null", "é", "\udcff", "--help"]
# argv holds no NUL, and no surrogate but the \\udc80-\\udcff that stand for undecodable bytes (in SPECIAL).
VALUES = st.one_of(st.sampled_from(SPECIAL), st.integers(-10**30, 10**30).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(str),
                   st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12))


def run_cli(args: list[str]) -> tuple[int, str]:
    """main() in-process, as a shell would see it: (exit code, stderr); any other exception propagates."""
    err, showwarning = io.StringIO(), warnings.showwarning
    try:  # a hang is a failure naming its command line, not a CI run that never ends (a prime --gpus once was)
        with within(120), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                warnings.catch_warnings():
            main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        warnings.showwarning = showwarning  # main() installs its one-line printer
    assert "still running after" not in err.getvalue(), f"hung: {args}"  # main() words a TimeoutError too
    return code, err.getvalue()


@pytest.fixture(scope="module")
def workdir():
    """A folder holding a few good records, where fuzzed --out and --calibrations paths land."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "few.jsonl").write_text("\n".join(FEW_RECORDS) + "\n")
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(previous)


@pytest.mark.parametrize("command", BASE)
def test_the_unfuzzed_command_lines_succeed(workdir, command):
    code, err = run_cli(BASE[command])
    assert code == 0, err


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(list(BASE)), data=st.data())
def test_fuzzed_options_give_one_error_line_and_a_non_zero_exit_never_a_traceback(workdir, command, data):
    args = list(BASE[command])
    for _ in range(data.draw(st.integers(1, 2), label="options")):
        option, value = data.draw(st.sampled_from(OPTIONS[command]), label="option"), data.draw(VALUES, label="value")
        args += [value] if option is None else [option, value]
    code, err = run_cli(args)
    assert "Traceback" not in err
    if code in (0, EXIT_DOES_NOT_FIT):  # an answer: valid but huge options (--seq-len 11202) do not fit
        return
    lines = [line for line in err.split("\n") if line.strip()]  # not splitlines: a fuzzed path may hold a \\r
    errors = [line for line in lines if line.startswith(("error:", "Error:"))]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert code == 2, (code, err)
