"""Where a packed step's time goes: the emitted packed folder trained as `ftplan rehearse` trains it (TRL's
SFTTrainer, padding-free), with torch.profiler over a few steps after warm-up; prints the ops by CUDA time and
by CPU time, and the steps' wall time against the GPU's busy time (a gap is host-side: syncs, Python, metrics).

    python benchmarks/gpu/packed_profile.py FOLDER [STEPS]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ftplan.calibration.rehearsal import build_model, load_emitted, packed_sample_lengths, packed_trainer, step_clock
from ftplan.core.settings import Setting


def main(folder: Path, steps: int = 12) -> None:
    import torch
    from transformers import TrainerCallback

    plan = json.loads((folder / "plan.json").read_text())
    emitted = load_emitted(folder)
    model, arch = build_model(emitted, Setting.from_dict(plan["setting"]))
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA],
                                      schedule=torch.profiler.schedule(wait=0, warmup=4, active=steps - 6, repeat=1))

    class Step(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            profiler.step()

    clock = step_clock()
    args = emitted.training_arguments(output_dir="/tmp/packed-profile", max_steps=steps, report_to=[],
                                      save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = packed_trainer(model, args, packed_sample_lengths(plan, steps), arch.vocab, [clock, Step()])
    with profiler:
        trainer.train()
    print("step seconds:", [round(s, 3) for s in clock.seconds])
    averages = profiler.key_averages()
    print(averages.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    print(averages.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    busy = sum(getattr(e, "self_device_time_total", 0) for e in averages  # not the step annotations
               if not e.key.startswith("ProfilerStep")) / 1e6
    print(f"GPU busy {busy:.3f} s over {steps - 6} profiled steps; their wall {sum(clock.seconds[4:steps - 2]):.3f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *map(int, sys.argv[2:3]))
