#!/usr/bin/env bash
# `ftplan rehearse --no-lower` of every folder `emitted_runs.py prepare WORK` wrote, within a time budget, on the
# lent GPU, from the repository root, wheels carried in .whl/. Records go to $OUT/rehearsals.jsonl, the
# folders (their plan.json now lists the rehearsal) to $OUT/emitted/.
#   BUDGET=540 bash benchmarks/gpu/emitted_runs.sh .bench case1 case2 ...
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
work=${1:?work folder}; shift
start=$SECONDS budget=${BUDGET:-540}
mkdir -p "$OUT/emitted"
echo "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
for name in "$@"; do
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 60 ]; then echo "SKIPPED (budget): $name"; continue; fi
  echo "== $(date +%T) ${left}s left: $name"
  case "$name" in *@*) python3 benchmarks/gpu/emitted_runs.py probe "$work" "${name%@*}" "${name#*@}" ;; esac
  timeout "$left" python3 -m ftplan rehearse "$work/$name" --no-lower --steps 20 --timeout $((left - 5)) \
    --out "$OUT/rehearsals.jsonl" 2>&1 | tail -n 6
  cp -r "$work/$name" "$OUT/emitted/"
done
echo "done in $((SECONDS - start))s"
