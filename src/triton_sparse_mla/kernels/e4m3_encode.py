"""fp32 to float8_e4m3fn by integer operations: the mirror of kernels/common.e4m3_to_f16.

Triton refuses its fp8 type below SM89, so a kernel that writes fp8 caches there (the SM80/86
replacements of vLLM's DSA-layer kernels, vllm_plugin/sm8x_model_kernels.py, which do it in
PyTorch today: docs/performance-plan.md counts their launches) encodes the bits itself. Round to
nearest, ties to even, as PyTorch's and the GPU's conversions do; subnormals included.
"""

import triton
import triton.language as tl

E4M3_MIN_NORMAL_BITS = tl.constexpr(0x3C800000)  # 2^-6 as fp32 bits: e4m3's smallest normal
E4M3_MAX_CODE = tl.constexpr(0x7E)  # 448; 0x7F is NaN
ROUND_SHIFT = tl.constexpr(2.0 ** 23)  # x + 2^23 - 2^23 rounds 0 <= x < 2^22 to an integer, ties even


@triton.jit
def f32_to_e4m3_bits(x):
    """The float8_e4m3fn byte of each fp32 value of ``x`` (as int32, 0-255), rounded to
    nearest even. Finite inputs: magnitudes from 464 up (past the midpoint of 448 and the next
    step, which e4m3fn lacks) saturate to 448 where PyTorch gives NaN; callers scale their
    rows to at most 448 first.

    Normal results (|x| >= 2^-6): the fp32 exponent and top 3 mantissa bits are the e4m3 ones
    after a rebias of 120 and a round at bit 20 (the carry runs into the exponent as it
    should). Subnormal ones: |x| * 2^9 rounded to an integer, 0-8 (8 is the smallest normal's
    code)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    scaled = a.to(tl.float32, bitcast=True) * 512.0
    sub = ((scaled + ROUND_SHIFT) - ROUND_SHIFT).to(tl.int32)
    code = tl.where(a < E4M3_MIN_NORMAL_BITS, sub, tl.minimum(normal, E4M3_MAX_CODE))
    return code | sign
