#!/usr/bin/env bash
# Thirty-first session's device call (one script, files under $OUT; issues 24 and 21):
#   tests  moe_gate_up against its reference at PD = 0 and 1 (with the PDL slow-producer test),
#          and the decode layers and step against the reference with PD = 1 at B <= 2;
#   pd     tools/probe_moe_pd.py: the whole NVFP4 decode step at B = 1, 2, 4, 1K context, with
#          moe_gate_up at PD = 0 and PD = 1 alternated (and their logits bit for bit equal);
#   long   32K and 100K prefills (issue 21's 0.6 s and 3.5 s targets), NVFP4;
#   trace  flint-graph trace --preset full --context 1024 (NVFP4, B = 1): per kind, the count.
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_session31.sh
# (PARTS: the parts to run, default "tests pd long trace")
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 570 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
parts=" ${PARTS:-tests pd long trace} "
if [[ $parts == *" tests "* ]]; then
  timeout "$(left 150)" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_moe_gate_up_gpu.py tests/test_decode_layer_gpu.py tests/test_decode_step_gpu.py \
    2>&1 | tee "$OUT/gpu-tests.log" | tail -6
fi
if [[ $parts == *" pd "* ]]; then
  timeout "$(left 150)" python3 tools/probe_moe_pd.py --preset full --format nvfp4 \
    --buckets 1,2,4 --contexts 1024 > "$OUT/pd.log" 2>&1
  echo "pd: exit $?"; tail -4 "$OUT/pd.log"
fi
if [[ $parts == *" long "* ]]; then
  timeout "$(left 260)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
    --tokens 32768 --kernel-tokens 100000 --reps 2 --profile-tokens 0 --out "$OUT/long" \
    > "$OUT/long.log" 2>&1
  echo "long: exit $?"; tail -25 "$OUT/long.log"
fi
if [[ $parts == *" trace "* ]]; then
  timeout "$(left 120)" flint-graph trace --preset full --context 1024 --no-progress --top 30 \
    --out "$OUT/trace1k.json" > "$OUT/trace1k.txt" 2>&1
  echo "trace: exit $?"; grep -v '^ *[0-9]\+ ' "$OUT/trace1k.txt" | tail -40
fi
# at most 8 files come back: the install log and the prefill table (its JSON has it) go
rm -f "$OUT/install.log"  # the install succeeded (device_setup.sh stops otherwise)
rm -f "$OUT/long/prefill.md"
echo "done in $(( $(date +%s) - start )) s"
