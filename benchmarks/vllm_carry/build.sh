#!/usr/bin/env bash
# Build the git-ignored .vllm-carry/ that benchmarks/vllm_device_setup.sh installs on the GPU
# machine (see docs/gpu-runs.md). Run from the repo root on a machine with network access:
#   VLLM_SP=<site-packages of a vLLM 0.33.0 or 0.34.0 install> bash benchmarks/vllm_carry/build.sh
# The cp312 wheels listed in wheels.txt (beside this file) are downloaded; vLLM's own files
# are taken from VLLM_SP (its Python files are version-independent, its .so files abi3).
set -euo pipefail
C=.vllm-carry
SP=${VLLM_SP:?set VLLM_SP to the site-packages folder of a vLLM 0.33.0 or 0.34.0 install}
DI=$(cd $SP && ls -d vllm-*.dist-info | head -1)  # vllm-VERSION.dist-info: the version carried
[ -n "$DI" ] || { echo "no vllm-*.dist-info in $SP" >&2; exit 1; }
HERE=benchmarks/vllm_carry
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for n in 28 27 26 24 17 12 5 31 34 35; do P="$P --platform manylinux_2_${n}_x86_64"; done
P="$P --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
rm -rf $C/wheels; mkdir -p $C/wheels
mkdir -p $C
sed 's/#.*//' $HERE/wheels.txt | xargs python3 -m pip download -q $P -d $C/wheels 2>&1 | grep -v 'is ignored' || true
# project wheel (only its dist-info / entry point is used on the device), built from a copy
tmp=$(mktemp -d); git ls-files -z | xargs -0 cp --parents -t $tmp
python3 -m pip wheel -q --no-deps --no-build-isolation $tmp -w $C/wheels; rm -rf $tmp
# vLLM package: python files + small .so; CUDA .so pruned to sm_90 images, stripped
stage=$(mktemp -d); mkdir -p $stage/vllm
(cd $SP && tar -c --exclude=__pycache__ --exclude='*.so' --exclude='vllm/vllm-rs' --exclude='*.h' \
   --exclude='*.hpp' --exclude='*.cuh' --exclude='*.inl' --exclude='*.cu' --exclude='*.cpp' --exclude='*.a' \
   --exclude="$DI/RECORD" vllm $DI) | tar -x -C $stage
for f in _flashmla_C _flashmla_extension_C cumem_allocator fs_io_C spinloop _C_stable_libtorch; do
  python3 -c "import sys; sys.path.insert(0, '$HERE'); import fatbin_prune as f; f.prune('$SP/vllm/$f.abi3.so', '$stage/vllm/$f.abi3.so')" 2>/dev/null \
    || cp $SP/vllm/$f.abi3.so $stage/vllm/
  strip --strip-all $stage/vllm/$f.abi3.so
done
(cd $stage && tar -c --exclude=vllm/_C_stable_libtorch.abi3.so vllm $DI | xz -T2 -9 > $OLDPWD/$C/vllm-pkg.tar.xz)
(cd $stage && tar -c vllm/_C_stable_libtorch.abi3.so | xz -T2 -9 > $OLDPWD/$C/vllm-C.tar.xz)
rm -rf $stage
du -cb $C/wheels/*.whl $C/*.tar.xz | tail -1
# DeepGEMM (the DSA indexer needs it on CUDA; JIT-compiled with nvcc there): stripped .so + headers
stage=$(mktemp -d); mkdir -p $stage/vllm/third_party/deep_gemm
cp -r $SP/vllm/third_party/deep_gemm/_C_extension.abi3.so $SP/vllm/third_party/deep_gemm/include $stage/vllm/third_party/deep_gemm/
strip --strip-all $stage/vllm/third_party/deep_gemm/_C_extension.abi3.so
(cd $stage && tar -c vllm | xz -T2 -9 > $OLDPWD/$C/vllm-dg.tar.xz); rm -rf $stage
