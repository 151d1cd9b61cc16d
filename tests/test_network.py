"""ftplan calibrate-network times real all-reduces (gloo over loopback) and records latency and bandwidth."""

import os
import sys
import time
import warnings

import pytest
from click.testing import CliRunner

from ftplan.calibration import launcher
from ftplan.calibration.network import (
    GB,
    NetworkSpec,
    _run_local_ranks,
    fit_alpha_beta,
    measure_allreduce,
    parse_sizes,
    resolve_backend,
)
from ftplan.core.errors import FtplanError
from ftplan.store.records import RecordWarning, append_record, iter_records, read_records
from ftplan.models.communication.collectives import COLLECTIVE_BASE_LATENCY_S
from ftplan.cli.main import cli, main


def test_real_gloo_allreduces_are_timed_at_every_size_on_two_ranks():
    """The real run only has to run and time each size: a loaded machine may make a small message
    slower than a large one, so the fit is checked on injected timings below, never on this one."""
    spec = NetworkSpec(backend="gloo", ranks_per_node=2, sizes=(4096, 1048576), repeats=2, warmup=1,
                       master_port=launcher._free_port())
    table = measure_allreduce(spec, timeout=120)
    assert list(table["bytes"]) == [4096, 1048576]
    assert (table["seconds"] > 0).all() and (table["bus_gbs"] > 0).all()
    assert table.attrs["device"]["device"] == "cpu"


def _injected_table(sizes, seconds):
    import pandas as pd

    table = pd.DataFrame({"bytes": sizes, "seconds": seconds})
    table["bus_gbs"] = table["bytes"] / table["seconds"] / GB
    table.attrs["device"] = {"device": "cpu", "gpu_name": None, "torch": "x", "cuda": None}
    return table


def test_calibrate_network_writes_the_fit_of_the_measured_times_into_a_network_record(tmp_path, monkeypatch):
    out = tmp_path / "machine.jsonl"
    sizes = [4096, 1048576, 16777216]
    seconds = [COLLECTIVE_BASE_LATENCY_S + 2 * 30e-6 + b / (2.0 * GB) for b in sizes]  # 30 us a hop, 2 GB/s
    monkeypatch.setattr("ftplan.calibration.network.measure_allreduce",
                        lambda spec, timeout, log_dir=None: _injected_table(sizes, seconds))
    result = CliRunner().invoke(cli, ["calibrate-network", "--backend", "gloo", "--ranks", "2", "--sizes", "4K,1M,16M",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    (record,) = read_records([out], kind="network")
    assert record["kind"] == "network" and record["backend"] == "gloo" and record["ranks"] == 2
    assert record["sizes_bytes"] == sizes and record["seconds"] == seconds
    assert record["bandwidth_gbs"] == pytest.approx(2.0, rel=1e-6)
    assert record["latency_s"] == pytest.approx(30e-6, rel=1e-3)
    assert "GB/s" in result.output


def test_timings_a_loaded_machine_inverted_are_a_one_line_error_and_no_record(tmp_path, monkeypatch):
    out = tmp_path / "machine.jsonl"
    monkeypatch.setattr("ftplan.calibration.network.measure_allreduce",
                        lambda spec, timeout, log_dir=None: _injected_table([4096, 1048576], [0.01, 0.001]))
    result = CliRunner().invoke(cli, ["calibrate-network", "--backend", "gloo", "--ranks", "2", "--sizes", "4K,1M",
                                      "--out", str(out)])
    assert result.exit_code != 0 and "wider range" in str(result.exception or result.output)
    assert not out.exists()


def test_trial_readers_skip_network_records_silently(tmp_path):
    path = tmp_path / "machine.jsonl"
    append_record(path, {"schema_version": 1, "kind": "network", "backend": "gloo", "ranks": 2,
                         "latency_s": 1e-5, "bandwidth_gbs": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordWarning)
        assert list(iter_records(path)) == []
    assert len(list(iter_records(path, kind="network"))) == 1


def test_the_alpha_beta_fit_recovers_latency_and_bandwidth_of_an_exact_table():
    import pandas as pd

    ranks, latency, gbs = 4, 20e-6, 12.0
    sizes = [8, 64, 512, *(4096 * 4**i for i in range(8))]
    seconds = [COLLECTIVE_BASE_LATENCY_S + 2 * (ranks - 1) * latency + 2 * (ranks - 1) / ranks * b / (gbs * GB)
               for b in sizes]
    fit = fit_alpha_beta(pd.DataFrame({"bytes": sizes, "seconds": seconds}), ranks)
    assert fit.latency_s == pytest.approx(latency, rel=1e-3)
    assert fit.bandwidth_gbs == pytest.approx(gbs, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_times_that_shrink_with_size_cannot_be_fitted():
    import pandas as pd

    table = pd.DataFrame({"bytes": [4096, 4 * 2**20], "seconds": [0.01, 0.001]})
    with pytest.raises(FtplanError, match="wider range"):
        fit_alpha_beta(table, 2)


def test_message_sizes_read_binary_units():
    assert parse_sizes("4K, 1M,64MiB,1g,512") == (512, 4096, 2**20, 64 * 2**20, 2**30)
    with pytest.raises(FtplanError, match="4Q"):
        parse_sizes("4K,4Q")


@pytest.mark.parametrize("kwargs, words", [({"backend": "mpi"}, "backend"), ({"ranks_per_node": 1}, "at least 2 ranks"),
                                           ({"nodes": 2, "node_rank": 2}, "node rank"), ({"sizes": (4096,)}, "two message sizes")])
def test_impossible_measurements_are_refused(kwargs, words):
    with pytest.raises(FtplanError, match=words):
        NetworkSpec(**kwargs)


def test_bad_sizes_are_a_one_line_error_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate-network", "--backend", "gloo", "--ranks", "2", "--sizes", "4K,lots"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: cannot read message size 'lots': give e.g. 4K,1M,64M"]


def test_when_one_rank_dies_the_others_are_ended(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    dier = f"import os, sys, time\nwhile not os.path.exists({str(pid_file)!r}): time.sleep(0.05)\nprint('rank died'); sys.exit(4)"
    started = time.monotonic()
    failure = _run_local_ranks([[sys.executable, "-c", sleeper], [sys.executable, "-c", dier]],
                               [tmp_path / "rank0.log", tmp_path / "rank1.log"], timeout=60)
    assert time.monotonic() - started < 30
    assert "rank died" in failure
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_auto_backend_falls_back_to_two_gloo_ranks_without_gpus():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    assert resolve_backend("auto", 0) == ("gloo", 2)
    assert resolve_backend("nccl", 4) == ("nccl", 4)
