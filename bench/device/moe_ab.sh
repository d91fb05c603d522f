# The one-launch MoE's variants and D1 on the device machine (the `device` tool; pack first:
# bench/device/pack.sh). Calls, each under the tool's 10 minutes:
#   bash build/clean/bench/device/moe_ab.sh probe     # bench/probes/moe_fused_variants.py
#                                                     # ($VARIANTS: names, default all)
#   bash build/clean/bench/device/moe_ab.sh tests     # the decode kernels' MoE GPU tests
#                                                     # ($K: another -k, e.g. "rounds or moe")
#   bash build/clean/bench/device/moe_ab.sh script PROBE [ARG..]  # any bench/probes/PROBE.py,
#                                                     # run from bench/probes, $OUT/PROBE.log
#   bash build/clean/bench/device/moe_ab.sh d1 [ARM..]  # D1 (30B-A3B Q4_K_M) per arm: strata
#        (the commit as packed), or NAME:MODULE:CONST=VALUE, a copy with that setting appended
#        to cuda_kernels/MODULE.py (e.g. three:moe_fused:BLOCKS_AN_SM=3)
# Writes $OUT/run.log (the table) and the JSONs beside it.
source build/clean/bench/device/env.sh || exit 1
L=$OUT/run.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L
mode=$1; shift
case "$mode" in
  probe)
    # 12 layers in a graph a variant, the same inputs, outputs compared bit for bit
    (cd "$R/bench/probes" && timeout 520 python3 moe_fused_variants.py \
      ${VARIANTS:+--only "$VARIANTS"} --json $OUT/variants.json 2>&1 | grep -v Warn | tail -16) \
      | tee -a $L
    ;;
  tests)
    # from /tmp, rooted there: the tree's strata/ (no cuda_kernels/) would shadow the installed
    # copy
    cd /tmp && timeout 520 $PT -s "$R/tests/gpu/test_kernels_decode_gpu.py" -k "${K:-moe}" \
      --rootdir /tmp > $OUT/gpu.log 2>&1
    grep -E "moe|passed|failed|Error" $OUT/gpu.log | tail -14 | tee -a $L
    ;;
  script)
    probe=$1; shift
    (cd "$R/bench/probes" && timeout 540 python3 "$probe.py" "$@" > $OUT/$probe.log 2>&1)
    grep -v Warn $OUT/$probe.log | tail -30 | tee -a $L
    ;;
  d1)
    cd /tmp  # not the tree's root: its strata/ (no cli/) would shadow the installed copy
    timeout 90 python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q4_K_M --skew 3 \
      -o /tmp/m.gguf --quiet 2>&1 | tail -1 | tee -a $L
    for arm in "${@:-strata}"; do
      name=${arm%%:*}
      if [ "$arm" != "$name" ]; then  # NAME:MODULE:CONST=VALUE
        rest=${arm#*:}
        ab_copy "$name" && printf '\n%s\n' "${rest#*:}" \
          >> "/tmp/$name/strata/cuda_kernels/${rest%%:*}.py" || exit 1
      fi
      echo "== D1 $arm" | tee -a $L
      timeout 240 env PYTHONPATH=/tmp/site:/tmp/$name python3 -m strata.cli.main bench \
        --backend cuda -m /tmp/m.gguf --prompt-tokens 512 --gen 128 --max-context 4096 \
        --json-out $OUT/d1_$name.json 2>&1 | grep -v Warn | tail -4 | tee -a $L
    done
    ;;
  *) echo "usage: moe_ab.sh probe|tests|script PROBE [ARG...]|d1 [ARM...]" >&2; exit 2 ;;
esac
