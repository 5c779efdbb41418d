#!/usr/bin/env bash
# Fetch the wheels the GPU machine lacks into the git-ignored .whl/ (a new checkout does not
# have it), for benchmarks/device_run.sh, which installs .whl/*.whl first when a call carries
# it (carry: [".whl"]). Run from the repo root on a machine with network access:
#   bash benchmarks/device_wheels.sh
# Today: FlashMLA's sgl-flash-mla 1.0.0 (the bench's baseline: its legacy SM90 kernels), 10 MB.
set -euo pipefail
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  P="$P --platform $p"
done
mkdir -p .whl
python3 -m pip download -q $P -d .whl sgl-flash-mla==1.0.0 2>&1 | grep -v 'is ignored' || true
ls -l .whl
