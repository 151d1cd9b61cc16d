#!/usr/bin/env bash
# The calibration ladders of one device call on the lent H200, within a time budget, appended to
# $OUT/h200.jsonl (a copy of the shipped file, so every ladder resumes from what is recorded).
# Run there from the repository root, with deepspeed and liger-kernel carried as wheels in .whl/:
#   BUDGET=540 bash benchmarks/gpu/calibrate_h200.sh 1
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out=$OUT/h200.jsonl
cp ftplan/data/calibrations/h200.jsonl "$out"
start=$SECONDS
budget=${BUDGET:-540}
echo "host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"

cal() {
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 40 ]; then echo "SKIPPED (budget): ftplan calibrate $*"; return; fi
  echo "== $(date +%T) ${left}s left: ftplan calibrate $*"
  timeout "$left" python3 -m ftplan calibrate --device cuda --out "$out" --machine device-nvidia-h200 \
    --timeout 240 --log-dir /tmp/ftplan-logs "$@" 2>&1 | tail -n 15
}

case "${1:?call number}" in
1)  # the flat-then-steep case of issue 15: small batches in the optimizer-step phase
    cal --model llama-3.2-3b --gradient-checkpointing on --liger on --batch-sizes 1,2,4
    cal --model llama-3.2-3b --seq-len 1024 --batch-sizes 1,2,4
    cal --model llama-3.2-3b --gradient-checkpointing on --liger on --max-batch 256 --steps 2 --warmup-steps 1
    cal --model llama-3.2-3b --seq-len 1024 --max-batch 64 --steps 3 --warmup-steps 1 ;;
2)  # precision regimes, ZeRO-3 on one GPU, offload + Liger
    cal --model llama-3-8b --precision bf16-pure --batch-sizes 1,2,4
    cal --model qwen2.5-0.5b --precision bf16-pure --batch-sizes 1,2,4
    cal --model llama-3.2-1b --zero-stage 2 --offload on --liger on --batch-sizes 1,2,4
    cal --model llama-3.2-1b --zero-stage 3 --batch-sizes 1,2,4
    cal --model llama-3-8b --precision bf16-pure --max-batch 64 --steps 3 --warmup-steps 1
    cal --model qwen2.5-0.5b --precision bf16-pure --max-batch 64 --steps 3 --warmup-steps 1
    cal --model llama-3.2-1b --zero-stage 2 --offload on --liger on --max-batch 256 --steps 3 --warmup-steps 1
    cal --model llama-3.2-1b --zero-stage 3 --max-batch 64 --steps 3 --warmup-steps 1 ;;
3)  # a user's Trainer run with FtplanCallback (issue 19); held-out checkpointing ladders for the phase rule
    timeout 200 python3 benchmarks/gpu/callback_check.py "$OUT/callback" 2>&1 | tail -n 25
    cal --model llama-3.2-1b --gradient-checkpointing on --liger on --batch-sizes 1,2,4
    cal --model llama-3.2-1b --gradient-checkpointing on --batch-sizes 1,2,4
    cal --model llama-3.2-1b --gradient-checkpointing on --liger on --max-batch 256 --steps 2 --warmup-steps 1
    cal --model llama-3.2-1b --gradient-checkpointing on --max-batch 64 --steps 2 --warmup-steps 1 ;;
4)  # the callback after the optimizer-variant label; the dataset benchmark on a real-size model (issue 20)
    timeout 120 python3 benchmarks/gpu/callback_check.py "$OUT/callback" 2>&1 | tail -n 25
    timeout 240 python3 benchmarks/dataset_memory.py --device cuda --model qwen2.5-0.5b --samples 0 \
      --max-length 2048 --batch-sizes 4,8 2>&1 | tail -n 30
    cal --model llama-3.2-1b --gradient-checkpointing on --max-batch 64 --steps 2 --warmup-steps 1 ;;
5)  # issue 24: padded, masked batches (the emitted collator's) against unmasked rows at three GQA ratios
    # (query/KV heads 14/2, 32/8, 16/16), then the masked ladders of the settings most plans use
    for model in qwen2.5-0.5b llama-3.2-1b qwen1.5-0.5b; do
      cal --model "$model" --padding max_length --padding none --batch-sizes 1,4,8 --no-verify --steps 3 --warmup-steps 1
    done
    python3 benchmarks/gpu/mask_path.py "$out"
    cal --model qwen2.5-0.5b --padding max_length --max-batch 64 --steps 3 --warmup-steps 1
    cal --model llama-3-8b --lora-rank 16 --padding max_length --max-batch 64 --steps 2 --warmup-steps 1
    cal --model llama-3.2-1b --padding max_length --max-batch 64 --steps 3 --warmup-steps 1
    cal --model qwen2.5-0.5b --liger on --padding max_length --max-batch 64 --steps 3 --warmup-steps 1 ;;
*)  echo "unknown call $1"; exit 2 ;;
esac
echo "== done after $((SECONDS - start)) s"
