#!/usr/bin/env bash
# The one-file binary on a GPU machine, needing only the NVIDIA driver: build dist/strata with
# every kernel compiled ahead of time, then run it in a clean environment (no CUDA_HOME, no nvcc,
# no toolkit library path) and generate on the GPU. Prints a table; logs go to $OUT (or /tmp).
#   bash tests/e2e/test_binary_device.sh            (pyinstaller importable by python3)
# STRATA_AOT / STRATA_ONEDIR pass through to strata.spec; CPU_RUNS=0 skips the CPU-backend runs.
set -uo pipefail
OUT=${OUT:-/tmp/strata-binary}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
T0=$EPOCHREALTIME
elapsed() { awk "BEGIN{printf \"%.2f\", $EPOCHREALTIME - $1}"; }

STRATA_AOT_JOBS=${STRATA_AOT_JOBS:-$(nproc)} "$PY" -m PyInstaller --noconfirm --log-level WARN \
  strata.spec >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
T_BUILD=$(elapsed "$T0")
grep "aot build:" "$OUT/build.log"
BIN=$PWD/dist/strata
[ "${STRATA_ONEDIR:-0}" = 1 ] && BIN=$PWD/dist/strata/strata   # the folder build
SIZE=$(du -sm "$(dirname "$BIN")" | cut -f1)

# The driver's own folder only (containers often reach libcuda through LD_LIBRARY_PATH).
DRV=""
if ! ldconfig -p | grep -q "libcuda.so.1 "; then
  for d in ${LD_LIBRARY_PATH//:/ } /usr/local/nvidia/lib64 /usr/lib64; do
    [ -e "$d/libcuda.so.1" ] && { DRV=$d; break; }
  done
fi
HOME_DIR=$(mktemp -d)
CLEAN=(env -i PATH=/usr/bin:/bin HOME="$HOME_DIR")
[ -n "$DRV" ] && CLEAN+=(LD_LIBRARY_PATH="$DRV")
echo "clean environment: ${CLEAN[*]}"
"${CLEAN[@]}" sh -c 'command -v nvcc; echo "CUDA_HOME=${CUDA_HOME:-unset}"; ls /usr/local/cuda/bin/nvcc 2>/dev/null'

run() {  # name, then the command; prints its wall time, keeps its output
  local name=$1; shift; local s=$EPOCHREALTIME
  "${CLEAN[@]}" "$BIN" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  printf "%-28s rc=%s %6s s\n" "$name" "$rc" "$(elapsed "$s")" | tee -a "$OUT/table.txt"
  return $rc
}
: >"$OUT/table.txt"
FAIL=0
run version --version || FAIL=1
run selfcheck selfcheck --gpu yes || FAIL=1
run synth-tiny synth tiny --quiet -o "$HOME_DIR/tiny.gguf" || FAIL=1
P=(--prompt "The capital of France is" --temperature 0 --seed 1)
run gpu-first-token-run1 generate --backend cuda "${P[@]}" -n 1 || FAIL=1
run gpu-first-token-run2 generate --backend cuda "${P[@]}" -n 1 || FAIL=1
run gpu-generate-32 generate --backend cuda "${P[@]}" -n 32 --json || FAIL=1
if [ "${CPU_RUNS:-1}" = 1 ]; then
  run cpu-first-token-run1 generate --backend cpu "${P[@]}" -n 1 || FAIL=1
  run cpu-first-token-run2 generate --backend cpu "${P[@]}" -n 1 || FAIL=1
fi
echo "--- selfcheck"; cat "$OUT/selfcheck.log"
echo "--- gpu generate -n 32 (json)"; tail -c 700 "$OUT/gpu-generate-32.log"; echo
for f in gpu-first-token-run1 gpu-first-token-run2; do echo "--- $f"; tail -4 "$OUT/$f.log"; done
echo "binary: $SIZE MiB (onedir=${STRATA_ONEDIR:-0}), build $T_BUILD s"
cat "$OUT/table.txt"
exit $FAIL
