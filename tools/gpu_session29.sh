#!/usr/bin/env bash
# Twenty-ninth session's device call (one script, files under $OUT), docs/device-queue.md
# item 0 (issue 21 and 22's short chunks):
#   1. GPU tests: the whole prefill against the reference with the PF = 2 default, the shared
#      fold, and Prefill.set_dense_bf16 bit for bit equal to decoding per chunk;
#   2. whole NVFP4 prefills of 512 and 1,024 tokens, PF 0 / 2 alternated twice in one process;
#   3. whole NVFP4 prefills of 25, 512 and 8,192 tokens, dense BF16 off / on alternated twice;
#   4. the 8K spread: 8,192-token prefills launched eagerly (--graph-max 4096) against replayed
#      as one more captured bucket (--graph-max 8192), two objects each, alternated twice.
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_session29.sh
# (SKIP_TESTS=1 skips step 1; PARTS: the steps to run, default "1 2 3")
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 560 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
summary() {
  grep '^{' "$1" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print(d['object'], d['tokens'], round(d['ms'], 2), round(d.get('gpu_ms', 0), 2), d['row_moe_max'][:40])"
}
parts=" ${PARTS:-1 2 3} "
if [[ $parts == *" 1 "* ]]; then
  timeout "$(left 220)" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_prefill_gpu.py -k "matches_reference or shared_fold or dense_bf16" 2>&1 \
    | tee "$OUT/gpu-tests.log" | tail -6
fi
if [[ $parts == *" 2 "* ]]; then
  timeout "$(left 170)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
    --tokens 512,1024 --reps 7 --profile-tokens 0 --kernel-tokens= --pf 0,2,0,2 \
    --out "$OUT/prefill-pf" > "$OUT/prefill-pf.log" 2>&1
  echo "prefill PF: exit $?"; summary "$OUT/prefill-pf.log"
fi
if [[ $parts == *" 3 "* ]]; then
  timeout "$(left 200)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
    --tokens 25,512,8192 --reps 7 --profile-tokens 0 --kernel-tokens= --dense-bf16 0,1,0,1 \
    --out "$OUT/prefill-dense" > "$OUT/prefill-dense.log" 2>&1
  echo "prefill dense BF16: exit $?"; summary "$OUT/prefill-dense.log"
fi
if [[ $parts == *" 4 "* ]]; then  # the 8K spread: eager (host launches) against a replayed 8K graph
  for gm in 4096 8192 4096 8192; do
    timeout "$(left 120)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
      --tokens 8192 --reps 7 --profile-tokens 0 --kernel-tokens= --overlap 1,1 \
      --graph-max $gm --out "$OUT/prefill-gm$gm" >> "$OUT/prefill-gm.log" 2>&1
    echo "prefill graph-max $gm: exit $?"
  done
  grep '^{' "$OUT/prefill-gm.log" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print(d['tokens'], round(d['ms'], 2), round(d['issue_ms'], 2), d['wall_ms_each'], d['gpu_state'])"
fi
echo "done in $(( $(date +%s) - start )) s"
