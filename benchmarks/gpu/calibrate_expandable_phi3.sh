#!/usr/bin/env bash
# Phi-3-mini LoRA with checkpointing at batches 64 and 84 under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
# beside the shipped default-allocator ladder (25.0 and 32.8 GiB reserved but free there): does the allocator's
# growth with the activations go away with expandable segments? Records to $OUT/expandable_phi3.jsonl.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 300 python3 -m ftplan calibrate --model phi-3-mini-4k --device cuda --out "${OUT:?where records go}/expandable_phi3.jsonl" \
  --seq-len 2048 --lora-rank 16 --gradient-checkpointing on --alloc-conf expandable_segments:True --batch-sizes 64,84 \
  --no-verify --steps 2 --warmup-steps 1 --padding max_length --timeout 180 --machine device-nvidia-h200 \
  --log-dir /tmp/ftplan-logs 2>&1 | tail -n 6
