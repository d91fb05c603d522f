#!/usr/bin/env bash
# The README table's rows that need a GPU, in one device call (the `device` tool; pack first:
# bench/device/pack.sh; carry [".whl", "build/clean", "build/aot"], build/aot/sm90.zip being a
# kernel bundle of the packed commit's kernels, `python -m strata.aot.build build/aot/sm90.zip
# --arch sm_90`, where there is one: the kernels then load instead of compiling, which on a fresh
# machine took most of a call). Calls, each under the tool's 10 minutes:
#   bash build/clean/bench/device/table_rows.sh kernels  # MoE (defaults), decode attention at
#                                                        # 32K f16, matvecs (defaults)
#   bash build/clean/bench/device/table_rows.sh p1d2     # P1 and D2: a synthetic 30B-A3B Q8_0
#                                                        # (--skew 3), the suite at 8 GiB
#   bash build/clean/bench/device/table_rows.sh auto     # kernels on an H200, p1d2 elsewhere
#                                                        # (the H200 rows are the older ones)
# $LIMIT: the seconds this call may take (default 560), shared out over the parts in turn.
# Writes $OUT/<part>.log and the benches' JSONs beside them; prints each part's table last.
source build/clean/bench/device/env.sh || exit 1
T0=$(date +%s); left() { echo $(( ${LIMIT:-560} - ($(date +%s) - T0) )); }
B=$PWD/build/aot/sm90.zip
[ -f "$B" ] && export STRATA_KERNEL_BUNDLE=$B
echo "kernel bundle: ${STRATA_KERNEL_BUNDLE:-none (kernels compile on first use)}"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mode=${1:-auto}
[ "$mode" = auto ] && { case "$gpu" in *H200*) mode=kernels ;; *) mode=p1d2 ;; esac; }
echo "$gpu: $mode"
cd /tmp  # not the tree's root: its strata/ (no cuda_kernels/) would shadow the installed copy
case "$mode" in
  kernels)
    # each row is printed and written as it is measured, so a part cut short keeps its rows
    timeout $(( $(left) * 45 / 100 )) python3 -m strata.bench.kernels --only moe --no-ab \
      --out $OUT/moe > $OUT/moe.log 2>&1; echo "moe rc=$?"
    timeout $(( $(left) * 30 / 100 )) python3 -m strata.bench.kernels_prefill \
      -k 'decode_attn_f16$' --json $OUT/attn.json > $OUT/attn.log 2>&1; echo "attn rc=$?"
    timeout $(( $(left) - 15 )) python3 -m strata.bench.kernels --only matvec --no-ab \
      --out $OUT/matvec > $OUT/matvec.log 2>&1; echo "matvec rc=$?"
    tail -20 $OUT/moe.log; tail -12 $OUT/attn.log; tail -40 $OUT/matvec.log
    ;;
  p1d2)
    timeout 150 python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q8_0 --skew 3 \
      -o /tmp/q8.gguf --quiet > $OUT/synth.log 2>&1
    echo "synth rc=$? in $(( $(date +%s) - T0 )) s"
    timeout $(( $(left) - 10 )) python3 -m strata.bench.engine_cuda_suite -m /tmp/q8.gguf \
      --out $OUT/suite --parts p1,d2 --miss-paths mapped --temperature 1 \
      --commit "$STRATA_COMMIT" > $OUT/suite.log 2>&1
    echo "suite rc=$?"
    tail -40 $OUT/suite.log
    ;;
  *) echo "table_rows.sh: kernels, p1d2 or auto, not $mode" >&2; exit 2 ;;
esac
