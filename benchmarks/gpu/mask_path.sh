#!/usr/bin/env bash
# The attention path on one GPU: each model at three GQA ratios calibrated with padded, masked batches
# (--padding max_length, the emitted collator's) and with equal-length unmasked rows (--padding none),
# at the same batches, in one file. Usage: OUT=dir bash benchmarks/gpu/mask_path.sh
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}/mask_path.jsonl"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
for model in qwen2.5-0.5b llama-3.2-1b qwen1.5-0.5b; do   # query/KV heads 14/2, 32/8, 16/16
  python3 -m ftplan calibrate --device cuda --model "$model" --seq-len 2048 --padding max_length --padding none \
    --batch-sizes 1,4,8 --no-verify --steps 3 --warmup-steps 1 --machine device-nvidia-h200 --timeout 240 --out "$out"
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["model"], r.get("padding", "none"), r["micro_batch"]): r for r in rows}
print(f"{'model':14} {'batch':>5} {'alloc none':>11} {'alloc mask':>11} {'diff GiB':>9} {'s none':>7} {'s mask':>7}")
for (model, padding, batch), r in sorted(by.items()):
    if padding != "max_length":
        continue
    n = by.get((model, "none", batch))
    if not n or r["status"] != "ok" or n["status"] != "ok":
        print(model, batch, r["status"], n and n["status"]); continue
    a, b = n["peak_allocated_bytes"] / 2**30, r["peak_allocated_bytes"] / 2**30
    print(f"{model:14} {batch:>5} {a:>11.2f} {b:>11.2f} {b - a:>9.2f} {n['seconds_per_step']:>7.3f} {r['seconds_per_step']:>7.3f}")
PY
