#!/bin/bash
# The CUDA engine's device run (issue #6), from the checkout root on the GPU machine with .whl/
# (numpy 2.4.6, gguf 0.19 wheels) and optionally build/aotfull (a kernel bundle) carried;
# LIMIT=seconds; .engine_commit holds the commit. Runs the GPU tests (pool, hybrid, adaptive, mixes, ring
# waves) beside the OOM matrix (30B-A3B Q8_0 header-only file), then, once both are done (the
# CPU pool's timings need the cores), the miss-path sweep (mapped / cpu / hybrid) on a 4-layer
# real Q8_0 file. Everything under $OUT.
#   e.g. run: carry [".whl", "build/aotfull"], command: LIMIT=230 bash tests/gpu/run_engine_device.sh
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && \
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/strata . && \
export PYTHONPATH=/tmp/site:/tmp/strata PYTHONUNBUFFERED=1 STRATA_TEST_GPU=1 || exit 1
export STRATA_KERNEL_BUNDLE=$([ -f $R/build/aotfull/strata_kernels.zip ] && echo $R/build/aotfull/strata_kernels.zip) STRATA_COMMIT="$(cat $R/.engine_commit 2>/dev/null)"
cd /tmp
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
echo "install done t=$(el)" | tee $OUT/times.log
( timeout $((LIMIT - 8)) python3 -m pytest -q -s -p no:cacheprovider -p no:xdist -o addopts=-ra $R/tests/gpu/test_engine_gpu.py \
    -k "cpu_pool or hybrid or adaptive or IQ_MIX or LEGACY_MIX or ring_waves" --junitxml=$OUT/gpu_tests.xml \
    > $OUT/gpu_tests.log 2>&1; echo "tests rc=$? t=$(el)" >> $OUT/times.log ) &
python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q8_0 --header-only -o /tmp/q8h.gguf --quiet > $OUT/synth.log 2>&1
( python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q8_0 --skew 3 --layers 4 -o /tmp/q8l4.gguf >> $OUT/synth.log 2>&1; echo "synth4 t=$(el)" >> $OUT/times.log ) &
echo "oom start t=$(el)" >> $OUT/times.log
timeout $((LIMIT * 55 / 100)) python3 -m strata.bench.engine_cuda_suite -m /tmp/q8h.gguf --out $OUT --parts oom \
  --oom-budgets 6,8,16,24 --oom-contexts 4096,32768,131072 --oom-seconds $((LIMIT * 30 / 100)) \
  --file-note "strata synth qwen3-30b-a3b --quant Q8_0 --header-only (sparse: zero weights)" > $OUT/oom.log 2>&1
echo "oom rc=$? t=$(el)" >> $OUT/times.log
wait  # the tests and the synth
timeout $((LIMIT - 6 - $(el))) python3 -m strata.bench.engine_cuda_suite -m /tmp/q8l4.gguf --out $OUT --parts miss \
  --sweep 0,0.3 --gpu-mem 40GiB --file-note "strata synth qwen3-30b-a3b --quant Q8_0 --skew 3 --layers 4" > $OUT/miss.log 2>&1
echo "miss rc=$? t=$(el)" >> $OUT/times.log
wait
cat $OUT/times.log; tail -5 $OUT/gpu_tests.log; grep -A8 "budget " $OUT/oom.log | head -12; tail -4 $OUT/miss.log
