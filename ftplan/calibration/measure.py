"""How ftplan measures memory and identity, shared by calibration trials and the Trainer callback.

On CUDA the caching allocator's peaks are the truth an OOM is decided by; on CPU the process's
peak resident set (VmHWM, reset through /proc/self/clear_refs) stands in, so CI runs the same path.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from ftplan.core.paths import file_name_part
from ftplan.core.versions import installed_versions

PROC_STATUS = Path("/proc/self/status")


def _cpu_peak_rss_bytes() -> int:
    match = re.search(r"VmHWM:\s+(\d+) kB", PROC_STATUS.read_text())
    if match:
        return int(match.group(1)) * 1024
    import resource  # non-Linux fallback: ru_maxrss cannot be reset, but is still a real peak

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_memory(device: str) -> None:
    """Start a new peak window, so model building before training can be left out or kept deliberately."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass


def peak_memory(device: str) -> tuple[int, int, int]:
    """(peak allocated bytes, peak reserved bytes, allocator retries) since the last reset."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        return (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
                int(stats.get("num_alloc_retries", 0)))
    peak = _cpu_peak_rss_bytes()
    return peak, peak, 0


def gpu_identity(device: str) -> tuple[str, int]:
    """(device name, total memory in bytes) of the device this process trains on."""
    if device == "cuda":
        import torch

        index = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))  # before set_device, too
        props = torch.cuda.get_device_properties(index)
        return props.name, props.total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return "cpu", total


def library_versions() -> dict:
    """The tracked packages' versions and the CUDA torch was built for, as a record stores them."""
    versions = dict(installed_versions())
    try:
        import torch

        versions["cuda"] = torch.version.cuda
    except ImportError:
        versions["cuda"] = None
    return versions


def alloc_conf() -> str:
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def machine_id(pinned: str | None = None) -> str:
    """$FTPLAN_MACHINE_ID, else the id the output file already pins (runner.pinned_machine_id), else the host name.

    The host name alone is unstable (a restarted container gets a new one), and resume keys on this id.
    """
    return os.environ.get("FTPLAN_MACHINE_ID") or pinned or socket.gethostname()


def default_records_path() -> Path:
    """Where `ftplan calibrate` and FtplanCallback write by default, so both kinds of record land in one file."""
    return Path("calibrations") / f"{file_name_part(machine_id())}.jsonl"


# What a CUDA, cuBLAS or host allocation failure says when it is not raised as OutOfMemoryError.
OOM_MARKERS = ("out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED")


def is_oom(exc: object) -> bool:
    """Whether an exception is the run running out of memory (GPU or host), however it was raised."""
    if not isinstance(exc, BaseException):
        return False
    import torch

    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or any(marker in str(exc) for marker in OOM_MARKERS)
