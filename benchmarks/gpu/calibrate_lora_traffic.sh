#!/usr/bin/env bash
# LoRA on every linear against LoRA on q_proj and v_proj only, same rows, same host: the matmul FLOPs are the same
# (the frozen base runs forward and backward either way; the adapters' own FLOPs are rank-thin), so the step time
# between them is the adapters' memory traffic (models/traffic.py lora_adapter_bytes). Four shapes (Llama-3.2-1B,
# Qwen2.5-0.5B, Gemma-3-1B, Llama-3-8B), equal-length rows (no mask), batches 2-8.
# Records to $OUT/lora_traffic.jsonl; `python benchmarks/paired_paths.py lora RECORDS` compares them with the prior.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
out="${OUT:?where records go}/lora_traffic.jsonl"
run() { timeout 200 python3 -m ftplan calibrate --device cuda --out "$out" --seq-len 2048 --lora-rank 16 \
  --no-verify --timeout 150 --machine "device-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr " " -)" --log-dir /tmp/ftplan-logs "$@" 2>&1 | tail -n 2; }
for model in llama-3.2-1b qwen2.5-0.5b gemma-3-1b; do
  run --model "$model" --batch-sizes 2,4,8
  run --model "$model" --lora-targets q_proj,v_proj --batch-sizes 2,4,8
done
run --model llama-3-8b --batch-sizes 2,4
run --model llama-3-8b --lora-targets q_proj,v_proj --batch-sizes 2,4
