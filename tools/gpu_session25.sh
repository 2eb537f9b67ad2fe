#!/usr/bin/env bash
# Twenty-fifth session's device call (one script, files under $OUT):
#   1. the first torch.linalg.lstsq of a process on this machine (the suspect of issue 22's
#      turn-2 stall: the prefill pacer's first fit ran at that turn's admission);
#   2. issue 22's 512-new-token turns in NVFP4 with the pacer's plain-Python solve;
#   3. flint-nano (the embedded checkpoint) on the reference engine, then the graph engine
#      (BF16, then the NVFP4 GGUF) held to it with --compare (tools/gpu_eval_nano.sh).
set -uo pipefail
start=$(date +%s)
export DEADLINE=${DEADLINE:-$(( start + 560 ))}
R=${OUT:?}
for i in 1 2; do python3 - <<'PY' 2>&1 | tee -a "$R/lstsq-probe.txt"
import time, torch
torch.cuda.init(); torch.zeros(1, device="cuda")
a = torch.rand(3, 2, dtype=torch.float64); y = torch.rand(3, 1, dtype=torch.float64)
t0 = time.perf_counter(); torch.linalg.lstsq(a, y); t1 = time.perf_counter()
torch.linalg.lstsq(a, y); t2 = time.perf_counter()
print(f"torch {torch.__version__}: first lstsq {1e3 * (t1 - t0):.1f} ms, second {1e3 * (t2 - t1):.3f} ms")
PY
done
mkdir -p /tmp/r1
OUT=/tmp/r1 PARTS=reuse REUSE_FORMAT=nvfp4 REUSE_RUNS=new512 DEADLINE=$(( start + 150 )) \
  bash tools/gpu_first_request.sh 2>&1 | tail -12 | tee "$R/reuse.txt"
cp /tmp/r1/reuse-new512.log "$R/" 2>/dev/null
mkdir -p /tmp/e1
OUT=/tmp/e1 N=30 CONTEXTS=1024,4096 GRAPH_PLANTS= PLANTS= SKIP_RERUN=1 REF_T=300 T=130 \
  SUITES=tools,arith,recall,chain,chat,phrasing \
  bash tools/gpu_eval_nano.sh 2>&1 | tail -80 > "$R/eval-tail.txt"
tar czf "$R/eval.tgz" -C /tmp/e1 . 2>/dev/null
echo "done in $(( $(date +%s) - start )) s" | tee -a "$R/reuse.txt"
