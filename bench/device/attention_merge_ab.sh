#!/usr/bin/env bash
# Device side (the `device` tool's command, after pack.sh; carry .whl and build/clean): decode
# attention's pass 1 merging its own splits (`cuda_kernels/attention_merge.py`, off by default:
# `attention.MERGE_SPLITS`) against the combine launch, in one call:
#   1. its GPU test (every length, 50 graph replays, the counts back to zero),
#   2. the kernel bench rows merged / combine at 600 live keys, a full 4K cache and 32K, and
#      pass 1 alone at 32K (`strata.bench.kernels_prefill`),
#   3. D1 (30B-A3B Q4_K_M, all on the GPU) with the merge and without, one process each.
# Writes gpu_attn.log, attn.json, d1_merged.json, d1_combine.json and run.log under $OUT.
#   bash build/clean/bench/device/attention_merge_ab.sh
source build/clean/bench/device/env.sh || exit 1
cd /tmp || exit 1
L=$OUT/run.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$L"
timeout 200 $PT -s "$R/tests/gpu/test_decode_attention_gpu.py" -k merged > "$OUT/gpu_attn.log" 2>&1
tail -3 "$OUT/gpu_attn.log" | tee -a "$L"
timeout 150 python3 -m strata.bench.kernels_prefill -k "_merged,_combine,decode_attn_f16_32k_pass1" \
  --json "$OUT/attn.json" 2>&1 | tail -12 | tee -a "$L"
timeout 60 python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q4_K_M --skew 3 \
  -o /tmp/m.gguf --quiet 2>&1 | tail -2 | tee -a "$L"
ab_copy merged && printf '\nMERGE_SPLITS = True\n' >> /tmp/merged/strata/cuda_kernels/attention.py
for arm in merged strata; do
  name=$([ $arm = merged ] && echo merged || echo combine)
  timeout 180 env PYTHONPATH=/tmp/site:/tmp/$arm python3 -m strata.cli.main bench --backend cuda \
    -m /tmp/m.gguf --prompt-tokens 512 --gen 128 --max-context 4096 \
    --json-out "$OUT/d1_$name.json" 2>&1 | tail -4 | tee -a "$L"
done
