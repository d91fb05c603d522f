# Device side of a device run: source it first in the tool's command, from the repository root
# it was sent (pack.sh made .whl and build/clean there):
#   source build/clean/bench/device/env.sh && python3 -m strata.bench.kernels --only moe ...
# It installs the carried wheels to /tmp/site, lays the clean tree out as an installed strata
# package at /tmp/strata (cli/ and cuda_kernels/ mapped into the namespace, as setup.py does) and
# exports PYTHONPATH, so every later command imports exactly the commit in build/clean/COMMIT.
# Helpers: $R (the clean tree, for its tests and probes), $PT (pytest, GPU tests on),
# ab_copy NAME (a second copy at /tmp/NAME, to sed a setting into and run with
# `env PYTHONPATH=/tmp/site:/tmp/NAME`), ngpu (the GPUs present). Run `python3 -m strata...`
# and pytest from outside the tree (cd /tmp; pytest also --rootdir /tmp): the tree's root holds
# strata/ without cli/ and cuda_kernels/, which shadows the installed copy.
set -o pipefail
export PYTHONUNBUFFERED=1 STRATA_TEST_GPU=1 NUMBA_CACHE_DIR=/tmp/numba_cache
# never NVLink multicast on these hosts (the device tool's KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$PWD/build/clean
export STRATA_COMMIT=$(cat "$R/COMMIT")  # the benches record it: the installed copy has no git
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || return 1
rm -rf /tmp/strata && mkdir -p /tmp/strata
cp -r "$R/strata" /tmp/strata/strata
cp -r "$R/cli" /tmp/strata/strata/cli
cp -r "$R/cuda_kernels" /tmp/strata/strata/cuda_kernels
export PYTHONPATH=/tmp/site:/tmp/strata
PT="python3 -m pytest -q -p no:cacheprovider -o addopts=-ra"

ab_copy() {  # ab_copy NAME: /tmp/NAME, a copy of /tmp/strata to change and run beside it
  rm -rf "/tmp/$1" && cp -r /tmp/strata "/tmp/$1"
}

ngpu() { nvidia-smi -L | wc -l; }

echo "strata $(cat "$R/COMMIT") on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
  "x$(ngpu); numpy $(python3 -c 'import numpy; print(numpy.__version__)')"
