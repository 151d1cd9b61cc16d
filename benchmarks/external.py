"""Public measurements (not ftplan's) turned into calibration records, to test fits on data nobody here made.

They come from the public study gpjt/fine-tune-2024-04 (see ../shared/external/seed000/README.md):
Hugging Face Trainer, fp16, AdamW, DeepSpeed, sequences of exactly 2048 tokens. Memory is
torch's `active_bytes.all.peak` (what ftplan calls peak allocated) and `reserved_bytes.all.peak`,
in MiB. The files stay where they are; nothing is copied into the project.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from ftplan.core.hardware import find_gpu
from ftplan.store.records import build_record, summarise_per_gpu
from ftplan.core.settings import Setting

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "external" / "seed000"
MIB = 1024**2
SOURCE = "public measurements (gpjt/fine-tune-2024-04)"
EXPANDABLE = "expandable_segments:True"

QWEN = dict(model="qwen1.5-0.5b", seq_len=2048, precision="fp16", gpus=1)
LLAMA = dict(model="llama-3-8b", seq_len=2048, precision="fp16", zero_stage=3, gradient_checkpointing=True, gpus=8)

# file name -> (setting, GPU): the set-up each file's README section describes
FILES = {
    "0.5b-results-no-optimizer-offload.csv": (Setting(**QWEN, zero_stage=3), "RTX-3090"),
    "0.5b-results-with-optimizer-offload.csv":
        (Setting(**QWEN, zero_stage=2, offload_optimizer=True, gradient_checkpointing=True), "RTX-3090"),
    "0.5b-results-with-gradient-checkpointing-no-expandable-segments.csv":
        (Setting(**QWEN, zero_stage=3, gradient_checkpointing=True), "RTX-3090"),
    "0.5b-results-with-gradient-checkpointing-with-expandable-segments.csv":
        (Setting(**QWEN, zero_stage=3, gradient_checkpointing=True, alloc_conf=EXPANDABLE), "RTX-3090"),
    "8b-results-no-optimizer-offload-with-gradient-checkpointing-no-expandable-segments.csv":
        (Setting(**LLAMA), "A100-80GB"),
    "8b-results-no-optimizer-offload-with-gradient-checkpointing-with-expandable-segments.csv":
        (Setting(**LLAMA, alloc_conf=EXPANDABLE), "A100-80GB"),
}


def load_external(folder: Path = DEFAULT_DIR) -> list[dict]:
    """All public measurements as records; an empty list, said on stderr, when the folder is absent (a user's
    clone), so that tables without their rows are not read as the README's."""
    folder = Path(folder)
    if not folder.is_dir():
        print(f"note: no public measurements at {folder} (the README's figures include them): their rows are "
              "left out", file=sys.stderr)
        return []
    records: list[dict] = []
    for name, (setting, gpu_name) in FILES.items():
        path = folder / name
        if path.exists():
            records.extend(_file_records(path, setting, gpu_name))
    return records


def _file_records(path: Path, setting: Setting, gpu_name: str) -> list[dict]:
    """One record per batch size: a single-GPU line, or the 8 per-rank lines of one run merged."""
    runs: dict[int, list[list[str]]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fields = [f.strip() for f in line.split(",") if f.strip()]
        if fields:
            runs.setdefault(int(fields[0]), []).append([*fields[1:], f"{path}:{number}"])
    return [_record(setting, gpu_name, batch, lines) for batch, lines in sorted(runs.items())]


def _record(setting: Setting, gpu_name: str, batch: int, lines: list[list[str]]) -> dict:
    common = dict(message="", timestamp=None, source=SOURCE, machine_id=None, device="cuda",
                  gpu_name=gpu_name, gpu_memory_total_bytes=find_gpu(gpu_name).memory_bytes,
                  gpu_count=setting.world_size, versions={}, num_alloc_retries=None,
                  _source=lines[0][-1])
    if lines[0][0] == "OOM":
        return build_record(setting, batch, "oom", **{**common, "message": "out of memory"})
    # each line holds (active, reserved) MiB pairs, one per rank, only the reporting rank's non-zero
    pairs = [(float(a), float(r)) for line in lines for a, r in zip(line[:-2:2], line[1:-2:2]) if float(a) > 0]
    seconds = statistics.median(1.0 / float(line[-2]) for line in lines)
    tokens = batch * setting.seq_len * setting.world_size
    return build_record(
        setting, batch, "ok", **common,
        **summarise_per_gpu("peak_allocated_bytes", [int(a * MIB) for a, _ in pairs]),
        **summarise_per_gpu("peak_reserved_bytes", [int(r * MIB) for _, r in pairs]),
        seconds_per_step=seconds, step_seconds=None, tokens_per_second=tokens / seconds,
        steps_measured=29)
