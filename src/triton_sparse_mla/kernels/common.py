"""Shared ``@triton.jit`` helpers: cache-row gathers, fp8 decode, the attention-sink factor."""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def e4m3_to_f32(b_raw, HW_CVT: tl.constexpr):
    """Decode float8_e4m3fn bytes (uint8 tile) to float32.

    ``HW_CVT`` uses the hardware conversion (SM89 and newer). Otherwise the bits are rebuilt
    with integer operations, which every architecture (and the interpreter) runs: a normal
    number ``(e, m)`` keeps its 3 mantissa bits and moves its exponent from bias 7 to bias 127;
    a subnormal (``e == 0``) is ``m * 2^-9``. The NaN pattern (0x7F) is never written by the
    quantizers and is not special-cased.
    """
    if HW_CVT:
        return b_raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    x = b_raw.to(tl.int32)
    mag = x & 0x7F
    normal = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    subnormal = (mag & 7).to(tl.float32) * 0.001953125
    v = tl.where((mag >> 3) == 0, subnormal, normal)
    return tl.where(x >= 128, -v, v)


@triton.jit
def load_rows_plain(p_row, m_n, D_NOPE: tl.constexpr, D_PE: tl.constexpr):
    """Gather bf16/fp16 rows: ``p_row`` [BLOCK_N] row pointers, ``m_n`` [BLOCK_N] validity.

    Returns ``(nope [BLOCK_N, D_NOPE], pe [BLOCK_N, max(D_PE, 16)])``; ``pe`` is zeros when
    ``D_PE == 0``. Masked rows are never read.
    """
    o_d = tl.arange(0, D_NOPE)
    b_kn = tl.load(p_row[:, None] + o_d[None, :], mask=m_n[:, None], other=0.0)
    if D_PE > 0:
        o_p = tl.arange(0, D_PE)
        b_kp = tl.load(p_row[:, None] + D_NOPE + o_p[None, :], mask=m_n[:, None], other=0.0)
    else:
        b_kp = tl.zeros([p_row.shape[0], 16], dtype=b_kn.dtype)
    return b_kn, b_kp


@triton.jit
def load_rows_fp8_ds_mla(p_row, m_n, OUT_DTYPE: tl.constexpr, HW_CVT: tl.constexpr):
    """Gather and dequantize fp8_ds_mla rows (656 bytes): ``p_row`` [BLOCK_N] uint8 row pointers.

    Each row is decoded once, as ``[BLOCK_N, 4, 128]`` fp8 tiles times their fp32 scales.
    Returns ``(nope [BLOCK_N, 512], pe [BLOCK_N, 64])`` in ``OUT_DTYPE``.
    """
    BLOCK_N: tl.constexpr = p_row.shape[0]
    o_tile = tl.arange(0, 4)
    o_c = tl.arange(0, 128)
    o_byte = o_tile[:, None] * 128 + o_c[None, :]  # [4, 128]
    b_raw = tl.load(p_row[:, None, None] + o_byte[None, :, :], mask=m_n[:, None, None], other=0)
    p_scale = (p_row + 512).to(tl.pointer_type(tl.float32))
    b_scale = tl.load(p_scale[:, None] + o_tile[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, 4]
    b_val = e4m3_to_f32(b_raw, HW_CVT) * b_scale[:, :, None]
    b_kn = tl.reshape(b_val, [BLOCK_N, 512]).to(OUT_DTYPE)
    p_pe = (p_row + 528).to(tl.pointer_type(tl.bfloat16))
    o_p = tl.arange(0, 64)
    b_kp = tl.load(p_pe[:, None] + o_p[None, :], mask=m_n[:, None], other=0.0).to(OUT_DTYPE)
    return b_kn, b_kp


@triton.jit
def sink_factor(b_lse2, b_sink):
    """``exp(lse) / (exp(lse) + exp(sink))`` from a base-2 lse; 0 for an empty row (lse -inf)."""
    b_lse = b_lse2 * LN2
    f = 1.0 / (1.0 + tl.exp(b_sink - b_lse))
    return tl.where(b_lse2 == float("-inf"), 0.0, f)


@triton.jit
def mma(a, b, UPCAST: tl.constexpr):
    """``tl.dot(a, b)`` with an fp32 accumulator.

    ``UPCAST`` multiplies in fp32. The launcher sets it under ``TRITON_INTERPRET=1`` only: the
    interpreter of Triton 3.8 returns garbage for bf16 operands (fp16 and fp32 are right).
    Operands are rounded to their storage dtype first either way, so results match the GPU's.
    """
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)
