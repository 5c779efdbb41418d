#!/usr/bin/env bash
# Pack a Triton release for the GPU machine, which has no network (docs/gpu-runs.md, "Thirty-
# sixth session"). Run from the repo root on a machine with network access:
#   bash benchmarks/triton_carry.sh 3.9.0
# It downloads that release's Python 3.12 wheel (the device's Python), removes what the
# kernels never load (the Blackwell ptxas, the CUPTI folders, the AMD backend, the profiler
# library, the instrumentation test library: about half the size), and writes the rest as one
# xz stream split in two halves under 64 MB each, the most one call carries:
#   .tXYa/part-00 and .tXYb/part-01 (for 3.9: .t39a/part-00, .t39b/part-01; git-ignored).
# On the device, two calls back to back (the machine is released after about 30 s idle):
# `bash benchmarks/device_run.sh triton-a` carrying [".t39a"], then `... triton-b` carrying
# [".t39b"], which unpacks into /tmp/t39 and prints the version; then every call under that
# Triton with EXTRA_SITE=/tmp/t39 (device_run.sh puts it first on PYTHONPATH and sets
# TRITON_BACKENDS_IN_TREE=1: the machine's own Triton registers an AMD backend, which the
# stripped copy lacks).
set -euo pipefail
V=${1:?usage: triton_carry.sh VERSION (e.g. 3.9.0)}
TAG=t$(echo "$V" | cut -d. -f1-2 | tr -d .)
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for n in 28 27 17; do P="$P --platform manylinux_2_${n}_x86_64"; done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q $P "triton==$V" -d "$tmp" 2>&1 | grep -v 'is ignored' || true
mkdir "$tmp/site"; (cd "$tmp/site" && unzip -q "$tmp"/triton-*.whl)
T=$tmp/site/triton
rm -rf "$T/backends/amd" "$T/backends/nvidia/lib/cupti" "$T/backends/nvidia/lib/cupti-blackwell" \
       "$T/backends/nvidia/bin/ptxas-blackwell" "$T/_C/libproton.so"
rm -f "$T"/instrumentation/*.so
du -sh "$tmp/site"
rm -rf ".${TAG}a" ".${TAG}b"; mkdir ".${TAG}a" ".${TAG}b"
(cd "$tmp/site" && tar cf - .) | xz -6 -T2 > "$tmp/all.xz"
split -n 2 -d "$tmp/all.xz" "$tmp/part-"
mv "$tmp/part-00" ".${TAG}a/"; mv "$tmp/part-01" ".${TAG}b/"
ls -l ".${TAG}a/part-00" ".${TAG}b/part-01"
