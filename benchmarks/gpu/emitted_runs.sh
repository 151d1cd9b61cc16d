#!/usr/bin/env bash
# `ftplan rehearse` of every folder `emitted_runs.py prepare WORK` wrote, within a time budget, on the lent GPU,
# from the repository root, wheels carried in .whl/: the planned batch first, then lowered or grown as rehearse
# searches (so the records also say how far the planned batch is from the largest that runs). Records go to
# $OUT/rehearsals.jsonl, the rewritten folders (their plan.json lists every rehearsal) to $OUT/emitted.tar.gz.
#   BUDGET=540 STEPS=20 [REHEARSE_ARGS=--no-grow] bash benchmarks/gpu/emitted_runs.sh .bench case1 case2 ...
set -uo pipefail
# The wheels go under a path holding "site-packages": dill (datasets' fingerprints, TRL's packing) pickles any module
# elsewhere by value and fails on pyarrow (PicklingError: MonthDayNano), as the packed rehearsal did from /tmp/site.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/wheels/site-packages ${WHEELS:-.whl}/*.whl || exit 1
export PYTHONPATH=/tmp/wheels/site-packages:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
work=${1:?work folder}; shift
start=$SECONDS budget=${BUDGET:-540} steps=${STEPS:-20}
echo "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
for name in "$@"; do
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 60 ]; then echo "SKIPPED (budget): $name"; continue; fi
  echo "== $(date +%T) ${left}s left: $name"
  case "$name" in *@*) python3 benchmarks/gpu/emitted_runs.py probe "$work" "${name%@*}" "${name#*@}" ;; esac
  timeout "$left" python3 -m ftplan rehearse "$work/$name" --steps "$steps" --timeout $((left - 5)) ${REHEARSE_ARGS:-} \
    --out "$OUT/rehearsals.jsonl" 2>&1 | tail -n 12
done
tar -czf "$OUT/emitted.tar.gz" -C "$work" "$@" 2>/dev/null
echo "done in $((SECONDS - start))s"
