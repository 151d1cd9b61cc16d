"""One rank of `ftplan calibrate-network`: time all-reduces of each message size.

Kept apart from ftplan.calibration.network so each rank imports only torch, not pandas or scikit-learn.
Every repeat starts after a barrier; a repeat's time is the slowest rank's (a training step waits
for it too); the median over repeats is reported by global rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def time_allreduces(spec: dict, local_rank: int) -> dict | None:
    """Sizes and median seconds (on global rank 0; None elsewhere), plus what the device was."""
    import torch
    import torch.distributed as dist

    rank = spec["node_rank"] * spec["ranks_per_node"] + local_rank
    os.environ.update(MASTER_ADDR=spec["master_addr"], MASTER_PORT=str(spec["master_port"]))
    on_gpu = spec["backend"] == "nccl"
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(spec["backend"], init_method="env://", rank=rank,
                            world_size=spec["ranks_per_node"] * spec["nodes"],
                            **({"device_id": device} if on_gpu else {}))
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    sizes, medians = [], []
    for size in spec["sizes"]:
        tensor = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)  # zeros: sums never overflow
        for _ in range(spec["warmup"]):
            dist.all_reduce(tensor)
        sync()
        repeats = []
        for _ in range(spec["repeats"]):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(tensor)
            sync()
            repeats.append(time.perf_counter() - started)
        slowest = torch.tensor(repeats, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        sizes.append(tensor.numel() * 4)
        medians.append(statistics.median(slowest.tolist()))
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {"sizes": sizes, "seconds": medians,
            "device": {"device": device.type, "torch": torch.__version__, "cuda": torch.version.cuda,
                       "gpu_name": torch.cuda.get_device_name(device) if on_gpu else None}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one rank of ftplan calibrate-network")
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--local-rank", type=int, required=True)
    args = parser.parse_args(argv)
    result = time_allreduces(json.loads(args.spec.read_text()), args.local_rank)
    if result is not None:
        args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
