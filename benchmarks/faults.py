"""Issue 17's fault list, tried again in one run: for each fault, does ftplan hold?

Most faults need an injection a user cannot make from a shell (a disk that fills mid-write, an OOM
the training loop catches, a rank killed at a chosen moment), so they are tried by the tests that
pin them, run here in one pytest session; the rest are tried as a user would meet them, through the
`ftplan` command. A fault holds when every one of its tries passes. CPU only: the tiny model and
the fake trial.

    python benchmarks/faults.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ONE_GPU_PLAN = ("plan", "--model", "llama-3.2-1b", "--dataset-size", "1000", "--gpu", "H200")
ETA = ("eta", "--model", "llama-3.2-1b", "--gpu", "H200", "--batch-size", "4", "--dataset-size", "1000")


def ftplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftplan", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def refused_in_one_line(*args: str) -> str | None:
    """None when ftplan refuses the command with one error line; else what it did instead."""
    done = ftplan(*args)
    if "Traceback" in done.stderr:
        return f"traceback: {done.stderr.strip().splitlines()[-1][:120]}"
    if done.returncode == 0:
        return "accepted"
    return None if len(done.stderr.strip().splitlines()) == 1 else "more than one error line"


def huge_card_specs() -> str:
    """A GPU catalog file whose one card claims 1e308 GiB."""
    header = (REPO / "ftplan" / "data" / "gpus.csv").read_text().splitlines()[0]
    path = Path(tempfile.mkdtemp(prefix="ftplan-faults-")) / "specs.csv"
    path.write_text(f"{header}\nHUGE,,1e308,989,4800,450,NVLink,fault list,,\n")
    return str(path)


def speedup_beyond_the_samples() -> str | None:
    """1,000 samples cannot be trained more than 1,000 times faster, however many GPUs there are."""
    done = ftplan(*ONE_GPU_PLAN, "--gpus", "1..100000", "--json")
    if done.returncode != 0:
        return refused_in_one_line(*ONE_GPU_PLAN, "--gpus", "1..100000")
    tables = json.loads(done.stdout)["scaling"]["tables"].values()
    fastest = max(row["speedup"] for rows in tables for row in rows)
    return f"{fastest:.1f}x speed-up shown" if fastest > 1000 else None


@dataclass(frozen=True)
class Fault:
    number: int
    what: str
    tests: tuple[str, ...] = ()  # pytest node ids (a parametrised test counts with all its cases)
    probes: tuple[tuple[str, Callable[[], str | None]], ...] = ()  # (what, None when held, else what broke)


CALLBACK = "tests/test_callback_oom_and_failures.py::test_"
HOSTILE = "tests/test_hostile_records.py::test_"
FAULTS = (
    Fault(1, "two calibrations of one file run each trial once", ("tests/test_trial_claims.py",)),
    Fault(2, "a new host name resumes instead of re-running", ("tests/test_machine_id.py",)),
    Fault(3, "a full disk: no torn record, one line, exit non-zero", ("tests/test_disk_full.py",)),
    Fault(4, "an OOM the user's code caught is recorded oom", (
        f"{CALLBACK}an_oom_counted_by_the_cuda_allocator_makes_the_record_oom_though_training_went_on",
        f"{CALLBACK}an_oom_the_training_loop_caught_and_skipped_makes_the_record_oom",
        f"{CALLBACK}an_oom_caught_around_train_then_the_process_exiting_is_recorded_oom_not_ok")),
    Fault(5, "callback failing on 1 of 2 ranks, then a collective", (
        f"{CALLBACK}the_callback_uses_no_collective",
        f"{CALLBACK}a_callback_failing_on_one_of_two_ranks_does_not_hang_the_users_next_collective",
        f"{CALLBACK}a_failure_inside_the_callback_at_a_step_is_reported_and_training_goes_on",
        f"{CALLBACK}an_unwritable_output_never_raises_into_training")),
    Fault(6, "fit caches keyed on content, catalog; edits refitted", (
        "tests/test_plan_gpus.py::test_fit_cache_returns_the_same_predictor_refits_on_any_change_and_never_trusts_an_edited_file",)),
    Fault(7, "deep nesting, huge ints, bad network records, absurd values", (
        f"{HOSTILE}a_hostile_trial_line_is_a_warning_naming_file_and_line",
        f"{HOSTILE}a_hostile_network_record_is_a_warning_not_a_type_error_in_every_plan")),
    Fault(8, "/dev/zero or a huge junk file: bounded memory and warnings", (
        f"{HOSTILE}a_line_longer_than_the_limit_is_skipped_without_being_held_in_memory",
        f"{HOSTILE}warnings_are_summarised_after_a_few_per_file",
        f"{HOSTILE}a_device_such_as_dev_zero_is_refused_in_one_line")),
    Fault(9, "broken config.json: one clear error", ("tests/test_architecture_config_errors.py",)),
    Fault(10, "absurd numbers: refused with the limit, no overflow", probes=(
        ("eta --epochs 1e308", lambda: refused_in_one_line(*ETA, "--epochs", "1e308")),
        ("eta --dataset-size of 400 digits", lambda: refused_in_one_line(*ETA, "--dataset-size", "9" * 400)),
        ("eta --dataset-size of 20 digits", lambda: refused_in_one_line(*ETA, "--dataset-size", "9" * 20)),
        ("plan on a 1e308 GiB card", lambda: refused_in_one_line("plan", "--model", "llama-3.2-1b", "--dataset-size",
                                                                 "1000", "--gpu", "HUGE", "--gpu-specs", huge_card_specs())),
        ("plan --gpus 1..100000 for 1,000 samples", speedup_beyond_the_samples))),
    Fault(11, "--emit: user files, symlinks, stale files, copied folder", ("tests/test_emit_safety.py",)),
    Fault(12, "kill -9 of calibrate ends a rank's own children", ("tests/test_kill_process_group.py",)),
    Fault(13, "LC_ALL=C or latin-1 output: ASCII, no traceback", ("tests/test_output_encoding.py",)),
    Fault(14, "control and bidi characters escaped in warnings", (
        f"{HOSTILE}control_and_bidi_characters_from_a_file_are_escaped_in_warnings",
        f"{HOSTILE}the_cli_escapes_control_and_bidi_characters_in_every_warning")),
    Fault(15, "no CUDA: refused up front; Liger skipped on a CPU", ("tests/test_calibrate_device_checks.py",)),
    # issue 27: the newcomer's path and the adversarial run
    Fault(16, "network calibration test needs no wall-clock luck", ("tests/test_network.py",)),
    Fault(17, "callback restores SIGTERM and excepthook; installs none if asked", (
        "tests/test_callback_signal_handlers.py",)),
    Fault(18, "hostile GPU/model names: no code injection on emit", ("tests/test_emit_hostile_names.py",)),
    Fault(19, "unknown optimizer/LoRA target record: skipped, file:line", ("tests/test_records_without_a_model.py",)),
    Fault(20, "calibrate --out: no user file, symlink or FIFO", ("tests/test_calibration_store_refusals.py",)),
    Fault(21, "dict/list machine_id, device, arch_hash: skipped", ("tests/test_records_identity_types.py",)),
    Fault(22, "fit cache keyed on configs; FIFO/device/huge cache refitted", ("tests/test_fit_cache_inputs.py",)),
    Fault(23, "callback records measured shapes, not seq_len=", ("tests/test_callback_measured_shapes.py",)),
    Fault(24, "--gpu-specs validated, intra_node_gbs used, FIFO; 1e309 link", ("tests/test_gpu_specs_file.py",)),
    Fault(25, "plan --dataset: bad lines by line, nesting, splits, FIFO, gzip", (
        "tests/test_dataset_hostile_inputs.py",)),
    Fault(26, "--emit --force atomic, manifest, user files kept", ("tests/test_emit_atomic_force.py",)),
    Fault(27, "adamw_torch_fused predicted from adamw_torch (CPU callback)", ("tests/test_callback_adamw_variants.py",)),
    Fault(28, "emitted README: files written, pack loads .py, WARNINGS", ("tests/test_emit_readme.py",)),
    Fault(29, "does not fit: exit 3 (plan, eta, predict), bad input 2", ("tests/test_exit_status_does_not_fit.py",)),
    Fault(30, "Hub id hint; a huge config.json refused unread", ("tests/test_model_argument_hints.py",)),
    Fault(31, "a FIFO among the calibrations never hangs a plan", ("tests/test_calibrations_fifo.py",)),
    Fault(32, "--gpus: at most 32 counts, each count's search announced", ("tests/test_plan_gpu_counts_bounded.py",)),
    Fault(33, "a model_type or machine id holding ../ stays in its folder", (
        "tests/test_callback.py::test_a_model_type_holding_dot_dot_slash_writes_its_config_inside_the_records_folder",
        "tests/test_machine_id.py::test_a_machine_id_holding_a_path_stays_one_file_name_in_the_calibrations_folder")),
    Fault(34, "a full disk is found before a trial runs", (
        "tests/test_disk_full.py::test_calibrate_checks_free_space_before_a_trial_runs_and_names_the_folder",)),
    Fault(35, "kill -9: stale trial folders and claim files removed", ("tests/test_stale_trial_files.py",)),
    Fault(36, "fit cache edited with its digest recomputed: refitted", (
        "tests/test_fit_cache_inputs.py::test_a_cache_edited_with_its_digest_recomputed_is_refitted_not_trusted",
        "tests/test_fit_cache_inputs.py::test_a_cache_file_others_could_write_is_refitted")),
    Fault(37, "a vanishing link bandwidth: refused, no traceback", probes=(
        ("plan --inter-node-bandwidth 1e-320", lambda: refused_in_one_line(*ONE_GPU_PLAN, "--gpus", "16",
                                                                            "--inter-node-bandwidth", "1e-320")),)),
    # 2026-12-07: a new user on the README and an adversarial run, one helper each
    Fault(38, "a trial ended mid-build leaves no extension lock", ("tests/test_build_locks.py",)),
    Fault(39, "bounds never fall as the batch grows: eta agrees with plan", (
        "tests/test_predictor.py::test_beyond_a_calibrated_batch_the_bounds_never_fall_so_eta_agrees_with_plan",)),
    Fault(40, "specs and prices that overflow: refused, no Infinity", (
        "tests/test_bad_input.py::test_numbers_that_overflow_to_infinity_are_refused",)),
    Fault(41, "a model class refusing a config its own way: one line", (
        "tests/test_architecture_config_errors.py::test_a_model_class_that_refuses_the_config_its_own_way_is_one_line",
        "tests/test_architecture_config_errors.py::test_an_encoder_is_refused_not_planned_as_a_decoder")),
    Fault(42, "plan.json edited under a re-hashed manifest: refused", (
        "tests/test_rehearse.py::test_plan_numbers_are_checked_even_under_a_rehashed_manifest",)),
    Fault(43, "a calibration batch no card holds: refused up front", (
        "tests/test_bad_input.py::test_calibrate_refuses_a_batch_no_card_holds_before_any_trial",)),
    Fault(44, "a busy host's CPU calibration moves no GPU plan", (
        "tests/test_communication.py::test_a_cpu_calibration_never_sets_the_gpu_ranks_spread",)),
    Fault(45, "dataset flags that would be ignored: refused", (
        "tests/test_bad_input.py::test_plan_refuses_a_dataset_flag_it_would_ignore",
        "tests/test_api_argument_checks.py::test_a_character_count_that_is_not_a_positive_number_is_refused")),
    # 2026-12-07, later: the helpers' leftovers
    Fault(46, "every trial failed: recorded, and calibrate exits 1", ("tests/test_failing_ranks.py",)),
    Fault(47, "a --gpu-specs alias naming another card: refused", (
        "tests/test_gpu_specs_file.py::test_an_alias_that_is_another_cards_name_is_refused_not_shadowed",)),
    Fault(48, "records saved as latin-1: named, not called torn", (
        "tests/test_hostile_records.py::test_a_record_saved_as_latin_1_is_named_as_not_utf8_not_as_torn",
        "tests/test_corrupt_records.py::test_a_write_torn_inside_a_character_is_a_torn_record_not_a_wrong_encoding")),
    # 2026-12-08: a new user on the README, and an attack with hostile inputs
    Fault(49, "a config.json edited after its rehearsal: not verified", (
        "tests/test_verified.py::test_a_config_edited_after_its_rehearsal_is_not_verified",)),
    Fault(50, "a run accumulating gradients: no record; old ones unfitted", (
        "tests/test_callback.py::test_a_run_accumulating_gradients_compares_but_leaves_no_record_and_old_ones_enter_no_fit",)),
    Fault(51, "a record claiming more memory than its card: left out", (
        "tests/test_impossible_records.py::test_a_capacity_above_the_cards_datasheet_is_left_out_with_its_line",)),
    Fault(52, "mistyped trial times, network timestamps, absurd links", (
        f"{HOSTILE}a_hostile_network_record_is_a_warning_not_a_type_error_in_every_plan",
        f"{HOSTILE}a_hostile_trial_line_is_a_warning_naming_file_and_line")),
    Fault(53, "a folder in place of an emitted file: one line", (
        "tests/test_rehearse.py::test_a_folder_where_an_emitted_file_was_is_one_line_not_a_traceback",)),
    Fault(54, "two emits into one folder at once: one after the other", (
        "tests/test_emit_atomic_force.py::test_a_second_emit_into_the_folder_waits_for_the_first_to_finish",)),
    Fault(55, "NaN or infinite timeouts and ratios: refused", ("tests/test_bad_input.py::test_bad_values_fail_with_one_line",)),
    Fault(56, "multimodal, classifier or GPTQ config: said, not planned blind", (
        "tests/test_architecture_config_errors.py::test_a_multimodal_config_says_where_its_language_model_is",
        "tests/test_architecture_config_errors.py::test_a_config_planned_as_something_else_says_so_at_the_top_of_the_plan")),
    Fault(57, "a --gpu-specs card without PyTorch's share: the least budgeted", (
        "tests/test_gpu_specs_file.py::test_a_row_without_torch_total_gib_budgets_no_more_than_any_catalog_card_gives_pytorch",)),
    Fault(58, "setting fields no run has (None allocator, twice-named targets)", (
        "tests/test_api_argument_checks.py::test_a_setting_no_run_has_is_refused_by_the_api_too",)),
    Fault(59, "bytecode planted beside training_args.py: never run", (
        "tests/test_rehearse.py::test_the_rehearsal_runs_the_folders_source_not_bytecode_planted_beside_it",)),
)


class Outcomes:
    """A pytest plugin keeping each test's outcome: failed if any phase failed."""

    def __init__(self) -> None:
        self.by_test: dict[str, str] = {}

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed or report.nodeid not in self.by_test:
            self.by_test[report.nodeid] = report.outcome

    def of(self, node: str) -> list[str]:
        """Outcomes of the tests under a node id: a file, a test, or every case of a parametrised test."""
        return [o for test, o in self.by_test.items() if _under(test, node)]

    def failed(self, node: str) -> list[str]:
        return [test for test, o in self.by_test.items() if _under(test, node) and o == "failed"]


def _under(test: str, node: str) -> bool:
    return test == node or test.startswith((f"{node}::", f"{node}["))


def run_tests(faults: tuple[Fault, ...]) -> Outcomes:
    outcomes = Outcomes()
    nodes = sorted({node for fault in faults for node in fault.tests})
    os.chdir(REPO)  # the project's pytest settings (import mode, pythonpath) apply from its root
    with contextlib.redirect_stdout(io.StringIO()):  # the table is the report; `pytest NODE` shows a failure
        pytest.main([*nodes, "-q", "-p", "no:cacheprovider"], plugins=[outcomes])
    return outcomes


def verdict(fault: Fault, outcomes: Outcomes) -> tuple[bool, str]:
    """(held, what was tried and what broke): held when nothing broke and at least one try really ran."""
    results = [o for node in fault.tests for o in outcomes.of(node)]
    failed = [test for node in fault.tests for test in outcomes.failed(node)]
    broken = [f"failed: {', '.join(failed)}"] if failed else []
    broken += [f"{what}: {problem}" for what, probe in fault.probes if (problem := probe()) is not None]
    tried = f"{len(results)} test(s)" if fault.tests else f"{len(fault.probes)} command(s)"
    skipped = results.count("skipped")
    tried += f", {skipped} skipped" if skipped else ""
    ran = len(results) - skipped + len(fault.probes)
    return ran > 0 and not broken, "; ".join([tried, *broken])


def main() -> int:
    outcomes = run_tests(FAULTS)
    rows = [(fault, *verdict(fault, outcomes)) for fault in FAULTS]
    width = max(len(f.what) for f in FAULTS)
    print(f"|  # | {'fault':<{width}} | held | tried |")  # a Markdown table, as the README shows it
    print(f"|---:|-{'-' * width}-|------|-------|")
    for fault, held, note in rows:
        print(f"| {fault.number:>2} | {fault.what:<{width}} | {'yes' if held else 'NO':<4} | {note} |")
    print(f"\nfaults tried / held: {len(rows)} / {sum(held for _, held, _ in rows)}")
    return 0 if all(held for _, held, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
