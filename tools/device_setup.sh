# Sourced by the tools/gpu_*.sh scripts at the start of a device call: installs the carried
# gguf wheel (the H200 has no registry, ../shared/device.md) and this package, and points the
# kernel and checkpoint cache at the carried .kcache. Needs OUT; the install log goes there.
# Also the call's clock for scripts that source it first: `deadline` (DEADLINE, else start +
# CALL_SECONDS, default 570) and `left N`, the seconds left capped at N (at least 1); a script
# that set `start` or `deadline` before sourcing keeps its own.
start=${start:-$(date +%s)}
deadline=${deadline:-${DEADLINE:-$(( start + ${CALL_SECONDS:-570} ))}}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
gpu_tests() {  # gpu_tests LOG SECONDS PYTEST-ARGS...: GPU tests into $OUT/LOG (-k: every file)
  local log=$1 limit=$2; shift 2
  timeout "$(left "$limit")" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 \
    | tee "$OUT/$log" | tail -4
}
mkdir -p "$OUT"
export FLINT_GRAPH_CACHE=${FLINT_GRAPH_CACHE:-$PWD/.kcache} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 \
  || { cat "$OUT/install.log"; exit 1; }
