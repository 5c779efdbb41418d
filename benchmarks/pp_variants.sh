#!/usr/bin/env bash
# One device call: the alternate-tile kernel's GPU tests, then TileConfig.pingpong off and on
# (bf16 workloads of $PP_HEADS heads, default 64,128) for each row count in $PP_BLOCKS
# (default "64 32"; 64-row tiles in one set of slots, 32-row tiles in two sets).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
if [ "${PP_TESTS:-1}" = 1 ]; then  # (PP_TESTS=0: timings only)
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_attention.py -k "gluon_producer and pingpong" 2>&1 | tee "$OUT/pp-tests.log" | tail -3
  grep -q " passed" "$OUT/pp-tests.log" && ! grep -q "failed\|error" "$OUT/pp-tests.log" || exit 1
fi
for n in ${PP_BLOCKS:-64 32}; do
  echo "=== BLOCK_N=$n"
  timeout 200 python3 - "$OUT/toggle-pp$n${PP_TAG:-}.json" "$n" "${PP_HEADS:-64,128}" <<'PY' 2>&1 | grep TOGGLE
import sys, runpy
from triton_sparse_mla.kernels import gluon_pingpong
gluon_pingpong.BLOCK_N = int(sys.argv[2])
sys.argv = ["sweep.py", sys.argv[1], "--toggle", "pingpong", "--fmt", "bf16", "--heads", sys.argv[3]]
runpy.run_path("benchmarks/sweep.py", run_name="__main__")
PY
done
