#!/bin/bash
# The layer split's exit and correctness check on an nvidia-h200-x2 machine (issue #8), from a
# checkout root with .whl/ carried. Every process that used both GPUs must end with status 0:
# the split GPU tests, `strata generate` over two GPUs (the installed entry point and
# `python -m`), and the split bench on a small 12-layer file. Writes $OUT/split_exit.json.
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && \
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/strata . && \
export PYTHONPATH=/tmp/site:/tmp/strata PYTHONUNBUFFERED=1 STRATA_TEST_GPU=1 || exit 1
cd /tmp
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
declare -A RC
python3 -m strata.cli.main synth tiny --quant Q8_0 -o /tmp/tiny.gguf > $OUT/log.txt 2>&1
( python3 -m strata.cli.main synth qwen3-30b-a3b --quant Q8_0 --skew 3 --layers 12 -o /tmp/q8l12.gguf --quiet > /tmp/synth.log 2>&1 ) &
python3 -m pytest -q -p no:cacheprovider -n0 -o addopts=-ra $R/tests/gpu/test_split_gpu.py --rootdir $R -c $R/pyproject.toml >> $OUT/log.txt 2>&1
RC[pytest_split]=$?
echo "pytest rc=${RC[pytest_split]} t=$(el)" | tee -a $OUT/log.txt
G="generate -m /tmp/tiny.gguf --gpus 0,1 --gpu-mem 1GiB --prompt-tokens 1,2,3,4,5 -n 8 --temperature 0 --max-context 256 --json"
python3 -m strata.cli.main $G > /tmp/gen_m.json 2>> $OUT/log.txt; RC[generate_python_m]=$?
/tmp/strata/bin/strata $G --handoff host > /tmp/gen_e.json 2>> $OUT/log.txt; RC[generate_entry_host]=$?
cat /tmp/gen_m.json /tmp/gen_e.json >> $OUT/log.txt
wait
python3 -m strata.engine.multi.bench /tmp/q8l12.gguf --gpu-mem 2GiB,2GiB --max-context 2048 --prompt 256 --decode 17 \
  --skip 1x8,carve --out $OUT/split_bench_l12.json >> $OUT/log.txt 2>&1; RC[split_bench]=$?
echo "bench t=$(el)" >> $OUT/log.txt
python3 - "$OUT" <<PY
import json, sys
rc = {"pytest_split": ${RC[pytest_split]}, "generate_python_m": ${RC[generate_python_m]},
      "generate_entry_host": ${RC[generate_entry_host]}, "split_bench": ${RC[split_bench]}}
toks = [json.load(open(p)).get("tokens") for p in ("/tmp/gen_m.json", "/tmp/gen_e.json")
        if open(p).read().strip()]
json.dump({"exit_status": rc, "generate_tokens": toks}, open(sys.argv[1] + "/split_exit.json", "w"), indent=1)
print(json.dumps(rc), toks)
PY
tail -15 $OUT/log.txt
