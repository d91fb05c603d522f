#!/usr/bin/env bash
# Every single-GPU test file on the device machine, kernels loaded from a carried kernel bundle
# where one is (pack first: bench/device/pack.sh; build the bundle on the workstation with
# `python -m strata.aot.build build/aot/sm90.zip --arch sm_90`, whose keys must match the packed
# commit's kernels: a kernel it lacks is compiled and listed). Calls, each under the tool's
# 10 minutes (carry [".whl", "build/clean", "build/dev", "build/aot"]):
#   bash build/clean/bench/device/gpu_suite.sh engine    # engine, batch, wide experts, D1 bench
#   bash build/clean/bench/device/gpu_suite.sh kernels   # every kernel test file
#   bash build/clean/bench/device/gpu_suite.sh FILE...   # those tests/gpu files (no .py)
#   bash build/clean/bench/device/gpu_suite.sh d1 ARM... # D1 per arm, a fresh process each: jit
#        (no bundle: kernels compile), or a bundle's name under build/aot (e.g. sm90.zip);
#        NAME+ profiles that arm's decode step by kernel family (--profile-decode)
# $LIMIT: the seconds this call may take (default 560), shared out over the files in turn.
# Writes $OUT/<file>.log per file, $OUT/suite.log (the table), and $OUT/d1.json (engine) or
# $OUT/d1_N.json per arm (d1).
source build/clean/bench/device/env.sh || exit 1
ROOT=$PWD  # the checkout sent (build/aot under it)
B=$ROOT/build/aot/sm90.zip
[ -f "$B" ] && export STRATA_KERNEL_BUNDLE=$B
echo "kernel bundle: ${STRATA_KERNEL_BUNDLE:-none (kernels compile on first use)}"
L=$OUT/suite.log
T0=$(date +%s); left() { echo $(( ${LIMIT:-560} - ($(date +%s) - T0) )); }
cd /tmp  # not the tree's root: its strata/ (no cuda_kernels/) would shadow the installed copy
d1=0
if [ "$1" = d1 ]; then
  shift
  timeout 90 python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q4_K_M --skew 3 \
    -o /tmp/m.gguf --quiet > /dev/null 2>&1
  i=0
  for arm in "$@"; do
    i=$((i + 1)); name=${arm%+}; prof=; [ "$name" != "$arm" ] && prof=--profile-decode
    if [ "$name" = jit ]; then unset STRATA_KERNEL_BUNDLE
    else export STRATA_KERNEL_BUNDLE=$ROOT/build/aot/$name; fi
    [ "$(left)" -lt 150 ] && { echo "$i $arm: not run (time)" | tee -a $L; continue; }
    t=$(date +%s)
    timeout 200 python3 -m strata.cli.main bench --backend cuda -m /tmp/m.gguf \
      --prompt-tokens 512 --gen 128 --max-context 4096 $prof --json-out $OUT/d1_$i.json \
      > $OUT/d1_$i.log 2>&1
    echo "$i $arm rc=$? $(( $(date +%s) - t )) s: $(grep -E '^ +decode ' $OUT/d1_$i.log | tr -s ' ')" \
      | tee -a $L
    [ -n "$prof" ] && sed -n '/decode step/,/ordering/p' $OUT/d1_$i.log | tee -a $L
  done
  exit 0
fi
case "$1" in
  engine) files="test_engine_gpu test_batch_gpu test_wide_experts_gpu"; d1=1 ;;
  kernels) files="test_kernels_decode_gpu test_kernels_prefill_gpu test_decode_attention_gpu
                  test_prefill_attention_gqa_gpu test_matvec_f32_gpu test_matvec_normed_gpu
                  test_router_fused_gpu test_direct_launch_gpu" ;;
  *) files="$*" ;;
esac
if [ $d1 = 1 ]; then  # D1 first: a fresh process's start-up is what the bundle saves
  timeout 90 python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q4_K_M --skew 3 \
    -o /tmp/m.gguf --quiet > /dev/null 2>&1
  t=$(date +%s)
  timeout 200 python3 -m strata.cli.main bench --backend cuda -m /tmp/m.gguf --prompt-tokens 512 \
    --gen 128 --max-context 4096 --json-out $OUT/d1.json > $OUT/d1.log 2>&1
  echo "D1 rc=$? in $(( $(date +%s) - t )) s: $(grep -E 'decode' $OUT/d1.log | head -2 | tr '\n' ' ')" \
    | tee -a $L
fi
for f in $files; do
  s=$(left); [ "$s" -lt 30 ] && { echo "$f: not run (time)" | tee -a $L; continue; }
  t=$(date +%s)
  timeout $((s - 10)) $PT -s -p no:xdist "$R/tests/gpu/$f.py" --rootdir /tmp ${K:+-k "$K"} \
    > $OUT/$f.log 2>&1
  rc=$?
  echo "$f rc=$rc $(( $(date +%s) - t )) s: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' \
    $OUT/$f.log | tail -1)" | tee -a $L
  grep -E "^kernel bundle|not bundled" $OUT/$f.log | head -8 | tee -a $L
done
