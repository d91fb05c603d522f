#!/usr/bin/env bash
# Workstation side of a device run (the `device` tool): the wheels the H200 image lacks or holds
# at a version that breaks numba-cuda, and the commit under test as a clean tree. Then call the
# tool's run with carry [".whl", "build/clean", "build/dev"] and a command that sources
# bench/device/env.sh (see there). Run from the repository root; commit first: only HEAD travels.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# numpy 2.5 (the image's) breaks numba-cuda 0.30; gguf is not in the image
if ! ls .whl/numpy-2.4.*-cp312-*.whl .whl/gguf-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    "numpy>=2.4,<2.5" "gguf>=0.17,<0.20"
fi
rm -rf build/clean && mkdir -p build/clean build/dev
git archive HEAD | tar -x -C build/clean
git rev-parse --short HEAD > build/clean/COMMIT
echo "packed $(cat build/clean/COMMIT): $(du -sh .whl build/clean | tr '\n' ' ')"
