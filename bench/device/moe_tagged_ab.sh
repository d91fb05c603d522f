# The one-launch MoE with h's tags polled (moe_fused.TAGGED_H) against the barrier, on the device
# machine (the `device` tool; pack first: bench/device/pack.sh). Two calls, each under the
# tool's 10 minutes:
#   bash build/clean/bench/device/moe_tagged_ab.sh kernels   # GPU tests both ways, the probe
#   bash build/clean/bench/device/moe_tagged_ab.sh d1        # D1 (30B-A3B Q4_K_M) both ways
# Writes $OUT/run.log (the table) and the JSONs beside it.
source build/clean/bench/device/env.sh || exit 1
L=$OUT/run.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L
case "$1" in
  kernels)
    # the fused MoE against float64 and 50 graph replays, with the barrier and tagged
    timeout 200 $PT -s "$R/tests/gpu/test_kernels_decode_gpu.py" -k "moe" > $OUT/gpu.log 2>&1
    grep -E "moe fused graph|passed|failed|Error" $OUT/gpu.log | tail -6 | tee -a $L
    # 12 layers in a graph a pair, the same inputs, outputs compared bit for bit
    (cd "$R/bench/probes" && timeout 300 python3 moe_fused_variants.py \
      --only "defaults,tagged h" --json $OUT/variants.json 2>&1 | grep -v Warn | tail -8) \
      | tee -a $L
    ;;
  d1)
    ab_copy tagged && printf '\nTAGGED_H = True\n' >> /tmp/tagged/strata/cuda_kernels/moe_fused.py
    timeout 90 python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q4_K_M --skew 3 \
      -o /tmp/m.gguf --quiet 2>&1 | tail -1 | tee -a $L
    for arm in strata tagged; do
      echo "== D1 $arm" | tee -a $L
      timeout 200 env PYTHONPATH=/tmp/site:/tmp/$arm python3 -m strata.cli.main bench \
        --backend cuda -m /tmp/m.gguf --prompt-tokens 512 --gen 128 --max-context 4096 \
        --json-out $OUT/d1_$arm.json 2>&1 | grep -v Warn | tail -4 | tee -a $L
    done
    ;;
  *) echo "usage: moe_tagged_ab.sh kernels|d1" >&2; exit 2 ;;
esac
