#!/usr/bin/env bash
# Eager attention against SDPA's masked path, same rows, same host: does the prior's eager score traffic
# (models/traffic.py eager_attention_bytes) price what eager costs? Three query/KV head ratios (Llama-3.2-1B 4,
# Qwen2.5-0.5B 7, Gemma-2-2B 2 with softcapping, which only eager computes) at padded batches, both paths.
# Records to $OUT/eager_path.jsonl; `python benchmarks/paired_paths.py eager RECORDS` compares them with the prior.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
out="${OUT:?where records go}/eager_path.jsonl"
run() { timeout 200 python3 -m ftplan calibrate --device cuda --out "$out" --seq-len 2048 --padding max_length \
  --no-verify --timeout 150 --machine "device-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr " " -)" --log-dir /tmp/ftplan-logs "$@" 2>&1 | tail -n 3; }
run --model gemma-2-2b --lora-rank 16 --liger on --attention eager --batch-sizes 2,4,8
run --model llama-3.2-1b --attention eager --batch-sizes 1,2,4
run --model llama-3.2-1b --attention sdpa --batch-sizes 1,2,4
run --model qwen2.5-0.5b --attention eager --batch-sizes 2,4
run --model qwen2.5-0.5b --attention sdpa --batch-sizes 2,4
