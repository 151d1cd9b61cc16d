#!/usr/bin/env bash
# LoRA + Liger ladders of two models the prior had only seen in rehearsals (Phi-3-mini, Qwen3-8B): Liger on a
# half-precision LoRA base, where the prior's pooled Liger scale (from full fine-tunes) counted 10-12% under.
# Records to $OUT/lora_liger.jsonl. Run on the lent GPU from the repository root, wheels in .whl/.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for model in phi-3-mini-4k qwen3-8b; do
  timeout 200 python3 -m ftplan calibrate --model "$model" --device cuda --out "${OUT:?where records go}/lora_liger.jsonl" \
    --seq-len 2048 --lora-rank 16 --liger on --gradient-checkpointing off --batch-sizes 1,2,4 \
    --no-verify --steps 2 --warmup-steps 1 --padding max_length --timeout 150 --machine device-nvidia-h200 \
    --log-dir /tmp/ftplan-logs 2>&1 | tail -n 5
done
