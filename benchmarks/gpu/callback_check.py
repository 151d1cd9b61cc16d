"""A user's own Trainer run on the H200 with FtplanCallback: qwen2.5-0.5b full fine-tuning at batch 4,
seq 2048, with Trainer's default optimizer (adamw_torch_fused). Prints the callback's prediction
(its evidence should come from the shipped calibration, not the prior) and its record.

    python benchmarks/gpu/callback_check.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

from ftplan.calibration.callback import FtplanCallback
from ftplan.calibration.trial import RandomTokens
from ftplan.core.architecture import load_architecture


def main(out_dir: Path) -> None:
    arch = load_architecture("qwen2.5-0.5b")
    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to("cuda")
    model.config.use_cache = False
    args = TrainingArguments(output_dir=str(out_dir / "run"), per_device_train_batch_size=4, max_steps=6, bf16=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    callback = FtplanCallback(out=out_dir / "records.jsonl")
    Trainer(model=model, args=args, train_dataset=RandomTokens(24, 2048, arch.vocab), callbacks=[callback]).train()
    print(json.dumps({k: callback.record.get(k) for k in ("status", "optimizer", "model", "micro_batch", "seq_len",
                                                           "peak_allocated_bytes", "peak_reserved_bytes",
                                                           "seconds_per_step", "prediction")}, indent=1, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
