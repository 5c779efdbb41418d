#!/usr/bin/env bash
# Make the carried vLLM (0.33.0, or 0.34.0: the release .vllm-carry was built from) importable
# on the GPU machine (no network, no vLLM there), then run "$@".
# Needs the git-ignored .vllm-carry in the call's carry list: wheels/*.whl (cp312 deps missing
# there + this project's wheel, for its vllm.general_plugins entry point) and vllm-*.tar.xz
# (vllm-dg.tar.xz: DeepGEMM, which the DSA indexer needs), built by benchmarks/vllm_carry/build.sh.
# Usage, from the repo root:
#   bash benchmarks/vllm_device_setup.sh python3 -m pytest -q -p no:cacheprovider tests/vllm
set -euo pipefail
carry=.vllm-carry
site=/tmp/vsite
stamp=$(ls -l "$carry"/wheels "$carry"/*.tar.xz | md5sum | cut -c1-32)
if [ "$(cat "$site/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$site" && mkdir -p "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$carry"/wheels/*.whl
  rm -rf "$site/triton_sparse_mla"  # keep only its dist-info: the code comes from src/
  for t in "$carry"/vllm-*.tar.xz; do  # python's tarfile: no need for an xz binary there
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="fully_trusted")' "$t" "$site"
  done
  echo "$stamp" > "$site/.stamp"
fi
# The flash-attention extensions (~480 MB) are not carried; nothing here runs them, but the
# package refuses to import without them, and the model registry imports it on a GPU.
python3 - "$site/vllm/vllm_flash_attn/__init__.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read().replace("if not (FA2_AVAILABLE or FA3_AVAILABLE):", "if False:  # not carried")
open(p, "w").write(s)
PY
# The DeepSeek-V3.2 q kernel module imports cutlass-dsl (not installed there) at its top; the
# kernel itself is SM100-only, so a stub that reports "unsupported" behaves the same on SM90.
if ! python3 -c "import cutlass" 2>/dev/null; then
  cat > "$site/vllm/models/deepseek_v32/nvidia/ops/fused_q_cutedsl.py" <<'PY'
# Stub written by benchmarks/vllm_device_setup.sh: cutlass-dsl is not installed here.
def is_fused_q_cutedsl_supported(*args, **kwargs):
    return False


def fused_q_cutedsl(*args, **kwargs):
    raise RuntimeError("fused_q_cutedsl needs cutlass-dsl, which is not installed")
PY
  # vLLM's kernel warm-up calls the MiniMax-M3 one on every run; in 0.34 that module imports
  # the model's kernels, which import cutlass-dsl. The model is not run here, so its warm-up
  # does nothing (0.33's did nothing for other models either).
  w="$site/vllm/model_executor/warmup/minimax_m3_msa_warmup.py"
  if grep -q "minimax_m3_msa_warmup" "$site/vllm/model_executor/warmup/kernel_warmup.py"; then
    cat > "$w" <<'PY'
# Stub written by benchmarks/vllm_device_setup.sh: cutlass-dsl is not installed here.
def minimax_m3_msa_warmup(worker):
    return None
PY
  fi
fi
# DeepGEMM (carried in vllm-dg.tar.xz) compiles its kernels with nvcc at run time.
if [ -z "${CUDA_HOME:-}" ]; then
  for d in /usr/local/cuda "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo .)")")")"; do
    if [ -x "$d/bin/nvcc" ] && [ -f "$d/include/cuda.h" ]; then export CUDA_HOME=$d; break; fi
  done
fi
echo "CUDA_HOME=${CUDA_HOME:-unset}"
pp="$site:$PWD/src"
if [ -d /tmp/site ]; then pp="/tmp/site:$pp"; fi
export PYTHONPATH="$pp${PYTHONPATH:+:$PYTHONPATH}"
# no network there: keep vLLM and the HF libraries from trying
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 -c "import vllm; print('vllm', vllm.__version__, 'from', vllm.__file__)"
if [ $# -gt 0 ]; then exec "$@"; fi
