#!/usr/bin/env bash
# OLMoE-1B-7B LoRA with attention-only targets (no LoRA on the fused experts) at batches 1 and 2, beside the
# shipped all-linear ladder: the static memory between them is what the prior counts as merged_expert_bytes
# (one bf16 copy of the expert weights per MoE layer, 12 GiB). From the repository root on the lent GPU,
# wheels carried in .whl/; records to $OUT/expert_copy.jsonl.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 -m ftplan calibrate --model olmoe-1b-7b --device cuda --out "${OUT:?where records go}/expert_copy.jsonl" \
  --seq-len 2048 --lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj --batch-sizes 1,2 --no-verify \
  --steps 2 --warmup-steps 1 --padding max_length --timeout 180 --machine device-nvidia-h200 \
  --log-dir /tmp/ftplan-logs 2>&1 | tail -n 6
