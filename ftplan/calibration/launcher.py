"""Run one trial: one process per rank, under a watchdog that never lets a rank hang.

Why not torchrun or the deepspeed launcher: when one rank dies (an OOM on one GPU), the others
block in their next collective until a 30-minute NCCL/gloo timeout, which is the known DeepSpeed
hang. Here every rank runs in its own session, and as soon as any rank fails or the trial's
timeout passes, every other rank's whole process group gets SIGTERM, then SIGKILL. Each rank also
dies with the launcher (PR_SET_PDEATHSIG), and a reaper process ends the ranks' process groups when
the launcher dies, so killing a calibration never leaves a rank or a child of a rank holding GPU memory.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ftplan.calibration.build_locks import clear_build_locks
from ftplan.calibration.extra import INSTALL_EXTRA, missing
from ftplan.calibration.scratch import trial_folder
from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting

REAL_TRIAL_COMMAND = (sys.executable, "-m", "ftplan.calibration.trial")
EXIT_OK, EXIT_OOM = 0, 3
POLL_SECONDS = 0.1
KILL_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1
# What a healthy rank dies of when a peer of its collective died first: the echo, not the cause.
# Both exit within one watchdog poll more often than not, so the order of exits cannot tell them apart.
PEER_LOSS_MARKERS = ("closed by peer", "reset by peer", "Broken pipe", "communicator was aborted", "NCCL error")
# Reads one process group a line until its pipe closes, which only the launcher's death does, then ends them.
_REAPER_CODE = """
import os, sys
groups = [int(line) for line in sys.stdin]
for group in groups:
    try:
        os.killpg(group, 9)
    except OSError:
        pass
"""


@dataclass(frozen=True)
class TrialSpec:
    """What one trial runs; written as SPEC.json for every rank."""

    setting: Setting
    micro_batch: int
    device: str
    steps: int
    warmup_steps: int

    def to_dict(self) -> dict:
        return {"setting": self.setting.to_dict(), "micro_batch": self.micro_batch, "device": self.device,
                "steps": self.steps, "warmup_steps": self.warmup_steps}


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended: its RESULT.json when it wrote one, else why not."""

    rank: int
    status: str
    message: str
    result: dict
    stopped: bool = False  # ended by the watchdog, not by its own failure


@dataclass(frozen=True)
class TrialOutcome:
    ranks: list[RankOutcome]
    seconds: float

    @property
    def status(self) -> str:
        """oom if any rank ran out of memory (the others were only stopped), else error if any failed."""
        statuses = {r.status for r in self.ranks}
        return "oom" if "oom" in statuses else "error" if "error" in statuses else "ok"

    @property
    def message(self) -> str:
        """The first cause, not its echo: a rank that failed by itself before one that lost a peer,
        and both before ranks the watchdog stopped."""
        def echo(rank: RankOutcome) -> bool:
            return any(marker in rank.message for marker in PEER_LOSS_MARKERS)

        failed = sorted((r for r in self.ranks if r.status == self.status != "ok"), key=lambda r: (r.stopped, echo(r)))
        return f"rank {failed[0].rank}: {failed[0].message}" if failed else ""


def cuda_problem() -> str | None:
    """Why trials cannot use CUDA on this machine, or None.

    Asked of a child process, so the planner never imports torch (seconds, and CUDA state it does not need);
    without this, every trial failed in _cuda_setDevice, was recorded as an error, and calibrate exited 0.
    """
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        result = subprocess.run([sys.executable, "-c", probe], stdin=subprocess.DEVNULL, capture_output=True,
                                timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot check for a CUDA GPU: {exc}"
    if result.returncode == 3:
        return "no CUDA GPU is visible here (torch.cuda.is_available() is False)"
    if result.returncode:
        lines = result.stderr.decode(errors="replace").strip().splitlines()
        last = lines[-1] if lines else f"exit code {result.returncode}"
        if "No module named 'torch'" in last:
            return ("torch is not installed here: install the build for your platform, then "
                    "pip install 'ftplan[calibrate]' (README: To calibrate your own machine)")
        return f"cannot check for a CUDA GPU: {last}"
    return None


def setting_problem(setting: Setting, device: str) -> str | None:
    """Why the real trial cannot run this setting on this device, known before launching it."""
    if setting.liger and device != "cuda":
        return "Liger needs a CUDA GPU"  # its Triton kernels; on a CPU they fail with "0 active drivers"
    needs = {"peft": setting.lora_rank > 0, "deepspeed": setting.zero_stage > 0, "liger_kernel": setting.liger}
    absent = missing(*(module for module, needed in needs.items() if needed))
    return f"{', '.join(absent)} not installed ({INSTALL_EXTRA})" if absent else None


def run_trial(spec: TrialSpec, timeout: float, trial_command: Sequence[str] | None = None,
              log_dir: Path | None = None) -> TrialOutcome:
    """Launch every rank of one trial and wait until all have ended (or been ended).

    trial_command defaults to REAL_TRIAL_COMMAND; callers (tests) pass stand-ins that need no GPU.
    Rank logs go to log_dir (kept) when given, else to a temporary folder; a failed rank's last
    log line ends up in its message either way.
    """
    if spec.setting.nodes > 1:
        raise FtplanError(f"cannot launch a {spec.setting.nodes}-node trial from one machine; calibrate one node and let the planner scale")
    started = time.monotonic()
    with trial_folder() as workdir:
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        logs = [Path(log_dir or workdir) / f"{spec.setting.key()}-b{spec.micro_batch}-rank{rank}.log"
                for rank in range(spec.setting.world_size)]
        (workdir / "spec.json").write_text(json.dumps(spec.to_dict()))
        ended = run_ranks(_trial_launches(spec, workdir, logs, trial_command or REAL_TRIAL_COMMAND), timeout)
        outcomes = [_rank_outcome(rank, code, workdir / f"result-rank{rank}.json", logs[rank],
                                  ended.reason if rank in ended.stopped else "")
                    for rank, code in enumerate(ended.returncodes)]
    return TrialOutcome(outcomes, time.monotonic() - started)


def run_process(command: Sequence[str], result_path: Path, log: Path, timeout: float) -> RankOutcome:
    """One rank under the same watchdog as a trial's (a rehearsal), with a one-rank process-group environment
    for DeepSpeed: how it ended, with its result."""
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    ended = run_ranks([RankLaunch(list(command), log, env)], timeout)
    return _rank_outcome(0, ended.returncodes[0], result_path, log, ended.reason)


@dataclass(frozen=True)
class RankLaunch:
    """One rank's command line, environment (None: this process's) and log file."""

    command: list[str]
    log: Path
    env: dict[str, str] | None = None


@dataclass(frozen=True)
class RanksEnded:
    """How the ranks ended: exit codes, and why the watchdog ended those in `stopped` ('' when none)."""

    returncodes: tuple[int, ...]
    reason: str
    stopped: frozenset[int]


def run_ranks(launches: Sequence[RankLaunch], timeout: float) -> RanksEnded:
    """Run ranks under the watchdog: each in a process group of its own that dies with this process (its
    children too, through the reaper); when one fails or time runs out, every other is ended.
    Calibration trials and network calibration both launch through here."""
    started, started_at = time.monotonic(), time.time()
    procs: list[subprocess.Popen] = []
    reaper = _GroupReaper()
    try:
        for launch in launches:
            launch.log.parent.mkdir(parents=True, exist_ok=True)
            with open(launch.log, "wb") as log:
                procs.append(subprocess.Popen(launch.command, env=launch.env, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True,
                                              preexec_fn=_die_with_parent))
            reaper.watch(procs[-1].pid)  # the rank leads its own process group: its pid is the group's id
        reason, stopped = _watch(procs, started + timeout, timeout)
    finally:
        _end_all(procs)
        reaper.stop()
    if stopped:  # a rank ended mid-build leaves its extension's lock, on which every later trial would wait
        for lock in clear_build_locks(since=started_at):
            warnings.warn(f"removed {lock}: a build the ended trial had begun, which later trials would wait on",
                          stacklevel=2)
    return RanksEnded(tuple(p.returncode for p in procs), reason, frozenset(stopped))


class _GroupReaper:
    """A process that SIGKILLs the ranks' process groups once the launcher dies, however it dies.

    PR_SET_PDEATHSIG ends only the rank itself: a child of the rank's own (a DataLoader worker, a compile
    pool) was re-parented to PID 1 and lived on. The reaper learns each rank's group through a pipe, which
    the kernel closes when the launcher dies; it runs in a session of its own, so a signal to the launcher's
    process group does not end it too. A launcher that lives ends the groups itself and stops the reaper.
    """

    def __init__(self) -> None:
        self._process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER_CODE], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def watch(self, group: int) -> None:
        self._process.stdin.write(f"{group}\n".encode())
        self._process.stdin.flush()

    def stop(self) -> None:
        self._process.kill()  # before the pipe closes, so it never acts on groups already ended and reaped
        self._process.wait()
        self._process.stdin.close()


def _trial_launches(spec: TrialSpec, workdir: Path, logs: list[Path], trial_command: Sequence[str]) -> list[RankLaunch]:
    env = {**os.environ, "WORLD_SIZE": str(len(logs)), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    if spec.setting.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = spec.setting.alloc_conf
    return [RankLaunch([*trial_command, "--spec", str(workdir / "spec.json"),
                        "--result", str(workdir / f"result-rank{rank}.json")],
                       log, {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
            for rank, log in enumerate(logs)]


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _watch(procs: list[subprocess.Popen], deadline: float, timeout: float) -> tuple[str, set[int]]:
    """Wait until all ranks end, one fails, or the deadline passes; return why and which ranks to stop."""
    while True:
        codes = [p.poll() for p in procs]
        alive = {rank for rank, code in enumerate(codes) if code is None}
        failed = [rank for rank, code in enumerate(codes) if code not in (None, EXIT_OK)]
        if failed and alive:
            return f"stopped by the watchdog after rank {failed[0]} failed", alive
        if not alive:
            return "", set()
        if time.monotonic() > deadline:
            return f"timed out after {timeout:g} s", alive
        time.sleep(POLL_SECONDS)


def _end_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every live rank's process group, then SIGKILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc, sig)
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)  # children a rank left behind in its group
        proc.wait()


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _rank_outcome(rank: int, returncode: int, result_path: Path, log_path: Path, stopped_because: str) -> RankOutcome:
    """The rank's own result when it wrote one; else why it ended, with its last log line."""
    result = _read_result(result_path)
    if result.get("status") in ("ok", "oom", "error"):
        return RankOutcome(rank, result["status"], str(result.get("message", "")), result)
    if stopped_because:
        return RankOutcome(rank, "error", stopped_because, result, stopped=True)
    if returncode == EXIT_OOM:
        return RankOutcome(rank, "oom", "exited with the out-of-memory code", result)
    ending = "exited without writing a result" if returncode == EXIT_OK else _describe_exit(returncode)
    tail = last_line(log_path)
    return RankOutcome(rank, "error", f"{ending}: {tail}" if tail else ending, result)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"killed by {name}" + (" (host out of memory?)" if name == "SIGKILL" else "")
    return f"exited with code {returncode}"


def last_line(path: Path) -> str:
    try:
        lines = path.read_bytes()[-4096:].decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def _read_result(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
