#!/usr/bin/env bash
# Issue 25 on one H200 (about 8 minutes): short ladders of one model per new family and QLoRA on an
# 8B model, appended to $OUT/families.jsonl. Random weights from the shipped configs.
# Run there from the repository root, with deepspeed, liger-kernel and bitsandbytes wheels in .whl/:
#   BUDGET=480 bash benchmarks/gpu/calibrate_families.sh
# DEVICE=cpu with tiny configs (tests/test_gpu_scripts.py) runs every command here on a CPU.
set -uo pipefail
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
device=${DEVICE:-cuda}
out=${OUT:?where records go}/families.jsonl
start=$SECONDS
budget=${BUDGET:-480}
qwen3=${QWEN3:-qwen3-1.7b} gemma=${GEMMA:-gemma-2-2b} phi=${PHI:-phi-3-mini-4k} moe=${MOE:-olmoe-1b-7b} big=${BIG:-llama-3-8b}
seq=${SEQ:-2048} ladder_top=${LADDER_TOP:-64}
python_bin=${PYTHON:-python3}

cal() {
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 30 ]; then echo "SKIPPED (budget): ftplan calibrate $*"; return; fi
  echo "== $(date +%T) ${left}s left: ftplan calibrate $*"
  timeout "$left" "$python_bin" -m ftplan calibrate --device "$device" --out "$out" --seq-len "$seq" \
    --timeout 180 --steps 2 --warmup-steps 1 --log-dir /tmp/ftplan-logs "$@" 2>&1 | tail -n 8
}

# One ladder to OOM (QLoRA: the setting people ask calculators about), the others 1,2,4.
cal --model "$big" --precision bf16 --lora-rank 16 --quantization nf4 --optimizer paged_adamw_8bit \
    --gradient-checkpointing on --max-batch "$ladder_top"
cal --model "$qwen3" --batch-sizes 1,2,4 --no-verify
cal --model "$gemma" --lora-rank 16 --batch-sizes 1,2,4 --no-verify
cal --model "$phi" --lora-rank 16 --gradient-checkpointing on --batch-sizes 1,2,4 --no-verify
cal --model "$moe" --lora-rank 16 --batch-sizes 1,2,4 --no-verify
cal --model "$big" --precision bf16 --lora-rank 16 --quantization nf4 --optimizer paged_adamw_8bit \
    --batch-sizes 1,2,4 --no-verify
echo "done in $((SECONDS - start))s: $(wc -l < "$out") records in $out"
