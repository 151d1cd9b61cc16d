#!/usr/bin/env bash
# Issue 25 #4 on one H200 (about 9 minutes): carry each new family's calibrated setting
# (benchmarks/gpu/calibrate_families.sh) on to its out-of-memory wall, at the batches around the one the fits of
# those first records put at the card's edge, so every family has a ladder that reached an OOM.
# Appends to $OUT/family_walls.jsonl. Run there from the repository root, with the wheels in .whl/:
#   BUDGET=540 bash benchmarks/gpu/calibrate_family_walls.sh
set -uo pipefail
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out=${OUT:?where records go}/family_walls.jsonl
start=$SECONDS
budget=${BUDGET:-540}

cal() {
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 40 ]; then echo "SKIPPED (budget): ftplan calibrate $*"; return; fi
  echo "== $(date +%T) ${left}s left: ftplan calibrate $*"
  timeout "$left" python3 -m ftplan calibrate --device cuda --out "$out" --seq-len 2048 --timeout 180 --steps 2 \
    --warmup-steps 1 --padding max_length --machine device-nvidia-h200 --log-dir /tmp/ftplan-logs --no-verify "$@" \
    2>&1 | tail -n 6
}

# The same settings as calibrate_families.sh; batches: the fits' edge of the card (137 GiB usable), then above it.
cal --model llama-3-8b --precision bf16 --lora-rank 16 --quantization nf4 --optimizer paged_adamw_8bit \
    --gradient-checkpointing on --batch-sizes 24,26,28
cal --model olmoe-1b-7b --lora-rank 16 --batch-sizes 14,15,16
cal --model gemma-3-1b --lora-rank 16 --batch-sizes 10,11,12
cal --model qwen3-1.7b --batch-sizes 10,11,12
cal --model phi-3-mini-4k --lora-rank 16 --gradient-checkpointing on --batch-sizes 64,72
echo "done in $((SECONDS - start))s: $(wc -l < "$out") records in $out"
