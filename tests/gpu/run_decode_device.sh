#!/bin/bash
# The decode step's device run (issues #4 and #6), from the checkout root on the GPU machine with
# .whl/ (numpy 2.4.6 and gguf 0.19 cp312 wheels) carried; LIMIT=seconds (default 540);
# .engine_commit holds the commit. In order, each under its own time limit, so a slow part cannot
# take the ones after it:
#   1. bench/probes/decode_parts.py and phase_stamps.py: where a layer's time goes (~1.5 min)
#   2. the D1 bench: 30B-A3B Q4_K_M, 512-token prompt, 128 tokens, with the decode profile
#   3. the GPU tests of the decode kernels (decode attention, the decode kernel suite)
# The device returns at most 8 files, so everything lands in $OUT/decode_run.tgz, and
# $OUT/summary.txt holds the tables.
#   e.g. run: carry [".whl"], command: LIMIT=540 bash tests/gpu/run_decode_device.sh
R=$PWD
LIMIT=${LIMIT:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && \
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/strata . && \
export PYTHONPATH=/tmp/site:/tmp/strata PYTHONUNBUFFERED=1 STRATA_TEST_GPU=1 || exit 1
export STRATA_COMMIT="$(cat $R/.engine_commit 2>/dev/null)"
W=$OUT/decode_run; mkdir -p $W
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( LIMIT - 15 - $(el) )); }  # seconds left, keeping 15 for the archive
cd /tmp
# the D1 file is written while the probes run (the CPU side of the machine is idle meanwhile)
[ -s /tmp/m.gguf ] || python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q4_K_M --skew 3 \
  -o /tmp/m.gguf --quiet > $W/synth.log 2>&1 &
timeout 120 python3 $R/bench/probes/decode_parts.py --out $W/parts.json > $W/parts.log 2>&1
echo "parts rc=$? t=$(el)" | tee -a $W/times.log
timeout 150 python3 $R/bench/probes/phase_stamps.py > $W/stamps.log 2>&1
echo "stamps rc=$? t=$(el)" | tee -a $W/times.log
wait
# the first decode bench on a machine also compiles every decode kernel (~1 min)
t=$(left); [ $t -gt 300 ] && t=300; [ $t -lt 10 ] && t=10
timeout $t python3 -m strata.cli.main bench --backend cuda \
  -m /tmp/m.gguf --prompt-tokens 512 --gen 128 --max-context 4096 --profile-decode \
  --json-out $W/d1.json > $W/d1.log 2>&1
echo "d1 rc=$? t=$(el)" | tee -a $W/times.log
if [ $(left) -gt 30 ]; then
  timeout $(left) python3 -m pytest -q -p no:cacheprovider -n0 -o addopts=-ra -W ignore \
    --rootdir $R -c $R/pyproject.toml $R/tests/gpu/test_decode_attention_gpu.py \
    $R/tests/gpu/test_kernels_decode_gpu.py > $W/gpu_tests.log 2>&1
  echo "tests rc=$? t=$(el)" | tee -a $W/times.log
fi
{ cat $W/times.log
  grep -v -i warn $W/parts.log | tail -20
  grep -v -i "warn" $W/stamps.log
  grep -A16 "tok/s" $W/d1.log | head -24
  tail -3 $W/gpu_tests.log 2>/dev/null; } > $OUT/summary.txt
tar -czf $OUT/decode_run.tgz -C $OUT decode_run && rm -rf $W
cat $OUT/summary.txt
