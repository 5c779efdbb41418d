"""Shared ``@triton.jit`` helpers: latent-tile gathers, fp8 decode, scores, softmax, sink.

The 512 latent columns of a cache row are handled as four tiles of 128 columns, the fp8_ds_mla
quantization tile. An fp8 tile is dequantized where it is loaded: each e4m3 value is converted
exactly (to fp16, then fp32 where needed), multiplied by its row's fp32 scale for that tile
(:func:`scale_tile`), and rounded once to q's dtype; from there on it is the same tile a bf16
cache would give. Measured on the H200 (BENCHMARKS.md, "fp8_ds_mla: dequantize at load"), this
beats keeping the exact e4m3 values and applying the scales to the scores and probabilities,
which needs one probability tile per latent tile, each moved between warps through shared
memory: 5-10% in decode, 14-23% in prefill, for one extra bf16 rounding of the cache values
(none with power-of-two scales, whose products with e4m3 values are exact in bf16).
"""

import os

import triton
import triton.language as tl

from .. import formats

# Compile options every launch of this package passes (and portability.py compiles with), so a
# kernel is the same code under every Triton: from 3.10 on Triton's default turns floating-point
# fusion off (3.9 warns of it), which would split each multiply-add the kernels were measured with
# (the softmax's scaled scores, the rescaling, the fp8 scales) into two rounded instructions.
LAUNCH_OPTIONS = {"enable_fp_fusion": True}

# Whether this package's kernels run in Triton's interpreter: Triton decides where a kernel is
# defined, from TRITON_INTERPRET, so the launchers read it here once, not on every call.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

LN2 = tl.constexpr(0.6931471805599453)
LATENT_TILE = tl.constexpr(formats.FP8_TILE)
FP8_SCALE_BYTE = tl.constexpr(formats.FP8_SCALE_OFFSET)
FP8_ROPE_BYTE = tl.constexpr(formats.FP8_ROPE_OFFSET)


# How e4m3 bytes become fp32 (chosen per device by configs.fp8_cvt_level): integer bit decoding
# (any GPU, the interpreter) or the hardware conversion (SM89 and newer).
FP8_CVT_INT = tl.constexpr(0)
FP8_CVT_F32 = tl.constexpr(1)


@triton.jit
def scalar_mask(offsets, cond):
    """A mask of ``offsets``' shape: all true where the scalar ``cond`` holds, else all false.
    (A scalar mask does the same on a GPU, but Triton 3.9's interpreter splats a scalar bool as
    int32 and then refuses it as a mask, or as the operand of a mask's ``&``. Compiled, this
    form is one comparison: the combine kernel's PTX is the same as with the comparison made on
    a tensor of the split index (Triton 3.8 and 3.9, sm80-sm120), and the fp8 row kernels' a
    few instructions shorter than with ``offsets >= tl.where(cond, 0, 1 << 30)`` (3.8).)"""
    return (tl.zeros(offsets.shape, tl.int32) + cond.to(tl.int32)) != 0


@triton.jit
def e4m3_to_f16(b_raw, FP8_CVT: tl.constexpr, EXACT: tl.constexpr = True):
    """Decode float8_e4m3fn bytes (uint8 tile) to float16, exactly (every e4m3 value is an
    fp16 value).

    With ``FP8_CVT == FP8_CVT_F32`` the hardware's packed conversion is used (SM89 and newer).
    Otherwise the bits are moved with integer operations, which every architecture (and the
    interpreter) runs: the sign to bit 15 and the 7 exponent and mantissa bits to bits 7-13
    give the fp16 number 2^-8 times the e4m3 one, subnormals included (the formats keep 3 and
    10 mantissa bits and exponent biases 7 and 15), and a multiply by 256 restores it. With
    ``EXACT`` off that multiply is left to the caller, who folds :func:`e4m3_unit` into its
    scales. The attention kernels decode words (:func:`e4m3_words_to_f16`); BENCHMARKS.md "e4m3
    decoded by moving bits" has what it saved. The NaN pattern (0x7F) is never written by the
    quantizers and decodes to 480.
    """
    if FP8_CVT != FP8_CVT_INT:
        return b_raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    x = b_raw.to(tl.uint16)
    b_v = (((x & 0x7F) << 7) | ((x & 0x80) << 8)).to(tl.float16, bitcast=True)
    if EXACT:
        b_v = b_v * 256.0
    return b_v


@triton.jit
def e4m3_unit(b_c, FP8_CVT: tl.constexpr):
    """Scales ``b_c`` (fp32) for values decoded with ``EXACT`` off: times 256 after integer
    decoding, unchanged after the hardware's. The products equal those of the exact values
    and the given scales (a power of two moves between the factors)."""
    if FP8_CVT == FP8_CVT_INT:
        b_c = b_c * 256.0
    return b_c


@triton.jit
def opaque(b_x, PACK: tl.constexpr):
    """Identity through a one-instruction inline asm the compiler may not move, duplicate or
    fold into neighbouring operations; ``PACK`` values per 32-bit register (2 for 16-bit
    tiles, 1 for 32-bit ones). Not for the interpreter, which runs no PTX."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [b_x], dtype=b_x.dtype,
                                     is_pure=False, pack=PACK)


@triton.jit
def convert_here(b_x):
    """Identity on a 16-bit tile that the compiler may not move or duplicate.

    Without it, Triton moves an fp8 tile's dequantization past the layout change that feeds
    ``tl.dot`` (for MMAs whose operands come from registers: SM80-SM89, SM120, and 16- or
    32-head tiles everywhere): the latent bytes leave the asynchronous-copy pipeline for plain
    global loads and the operands are read from shared memory piecewise. In the SASS of a
    16-head, 32-row tile on SM90: 1158 instructions per step without, 883 with (before fp8
    tiles were dequantized at load: 1542 and 815, the conversion then done twice). With it
    the raw bytes are staged by cp.async, dequantized once in the layout they were loaded in,
    and the result is staged once for both dots. Not for the interpreter, which runs no PTX.
    """
    return opaque(b_x, 2)


@triton.jit
def load_words(p_byte, m_n, N_WORDS: tl.constexpr):
    """``N_WORDS`` 32-bit words from each of BLOCK_N byte addresses ``p_byte`` (4-byte
    aligned), ``[BLOCK_N, N_WORDS]`` int32; masked rows give zeros. Bytes and 16-bit values
    held in registers across loop steps take a register each; words keep four or two."""
    p_w = p_byte.to(tl.pointer_type(tl.int32))
    return tl.load(p_w[:, None] + tl.arange(0, N_WORDS)[None, :], mask=m_n[:, None], other=0)


@triton.jit
def e4m3_rows_operand(p_rows, m_rows, D: tl.constexpr, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr,
                      FP8_DOT: tl.constexpr):
    """``[R, D]`` float8_e4m3fn rows from byte pointers ``p_rows`` (4-byte aligned; masked rows
    zero) as a ``tl.dot`` operand: with FP8_DOT the bytes themselves as float8e4nv (fp8 tensor
    cores: SM89 and newer, never under the interpreter), else fp16 decoded from 32-bit words
    without the integer decoder's unit (:func:`e4m3_words_to_f16` with ``EXACT`` off; scale by
    :func:`e4m3_unit`, the identity wherever FP8_DOT can be on)."""
    if FP8_DOT:
        b = tl.load(p_rows[:, None] + tl.arange(0, D)[None, :], mask=m_rows[:, None], other=0)
        b = b.to(tl.float8e4nv, bitcast=True)
    else:
        b = e4m3_words_to_f16(load_words(p_rows, m_rows, D // 4), FP8_CVT, INTERPRET, False)
    return b


@triton.jit
def e4m3_words_to_f16(b_w, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr, EXACT: tl.constexpr = True):
    """``[R, W]`` int32 words of four float8_e4m3fn bytes each (in memory order) to
    ``[R, 4 W]`` float16, exactly (``EXACT`` as for :func:`e4m3_to_f16`).

    On a GPU both paths work on whole words: the hardware's packed conversion (SM89 and
    newer), or :func:`e4m3_to_f16`'s bit moves applied to two bytes at once (bytes 0 and 2
    shifted left, bytes 1 and 3 right, into the two fp16 halves of a register), two
    instructions per value."""
    if not INTERPRET:
        if FP8_CVT != FP8_CVT_INT:
            b_0, b_1, b_2, b_3 = tl.inline_asm_elementwise(
                """{
                .reg .b16 lo, hi;
                .reg .b32 a, b;
                mov.b32 {lo, hi}, $4;
                cvt.rn.f16x2.e4m3x2 a, lo;
                cvt.rn.f16x2.e4m3x2 b, hi;
                mov.b32 {$0, $1}, a;
                mov.b32 {$2, $3}, b;
                }""", "=h,=h,=h,=h,r", [b_w], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
                is_pure=True, pack=1)
        else:
            b_0, b_1, b_2, b_3 = tl.inline_asm_elementwise(
                """{
                .reg .b32 a, b, s;
                shl.b32 a, $4, 7;
                and.b32 a, a, 0x3F803F80;
                shl.b32 s, $4, 8;
                and.b32 s, s, 0x80008000;
                or.b32 a, a, s;
                shr.u32 b, $4, 1;
                and.b32 b, b, 0x3F803F80;
                and.b32 s, $4, 0x80008000;
                or.b32 b, b, s;
                mov.b32 {$0, $2}, a;
                mov.b32 {$1, $3}, b;
                }""", "=h,=h,=h,=h,r", [b_w], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
                is_pure=True, pack=1)
    else:  # the interpreter runs no PTX: byte by byte, with the same unit
        b_0 = e4m3_to_f16((b_w & 0xFF).to(tl.uint8), FP8_CVT, False)
        b_1 = e4m3_to_f16(((b_w >> 8) & 0xFF).to(tl.uint8), FP8_CVT, False)
        b_2 = e4m3_to_f16(((b_w >> 16) & 0xFF).to(tl.uint8), FP8_CVT, False)
        b_3 = e4m3_to_f16(((b_w >> 24) & 0xFF).to(tl.uint8), FP8_CVT, False)
    # join puts its pair on a new last axis: [R, W, 2, 2] with [r, w, i, j] = byte 2 i + j
    b_v = tl.reshape(tl.join(tl.join(b_0, b_2), tl.join(b_1, b_3)), [b_w.shape[0], 4 * b_w.shape[1]])
    if EXACT and FP8_CVT == FP8_CVT_INT:
        b_v = b_v * 256.0
    return b_v


@triton.jit
def bf16_words_to_bf16(b_w):
    """``[R, W]`` int32 words of two bf16 values each (in memory order) to ``[R, 2 W]`` bf16."""
    b_lo = (b_w & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    b_hi = ((b_w >> 16) & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return tl.reshape(tl.join(b_lo, b_hi), [b_w.shape[0], 2 * b_w.shape[1]])


@triton.jit
def scale_tile(b_v, b_c, DTYPE: tl.constexpr, PIN: tl.constexpr, F16: tl.constexpr):
    """Exact e4m3 values ``b_v`` [BLOCK_N, 128] (fp16 with ``F16``, else fp32) times their
    rows' scales ``b_c`` [BLOCK_N] fp32, in DTYPE (see the module docstring). With ``F16``
    (DTYPE fp16, ``TileConfig.fp8_f16``) the product is taken in fp16: the scale is rounded
    to it, one packed multiply per two values instead of the fp32 round trip; a scale under
    2^-14 (a tile whose largest value is under 0.027) is an fp16 subnormal and loses
    precision, values stay finite up to 65504. ``PIN`` keeps the work where it stands
    (:func:`convert_here`; ``configs.pin_fp8_conversion``)."""
    if F16:
        b_k = b_v * b_c.to(tl.float16)[:, None]
    else:
        b_k = (b_v * b_c[:, None]).to(DTYPE)
    if PIN:
        b_k = convert_here(b_k)
    return b_k


@triton.jit
def dequant_words(b_w, b_c, FP8_CVT: tl.constexpr, DTYPE: tl.constexpr, PIN: tl.constexpr,
                  F16: tl.constexpr, INTERPRET: tl.constexpr):
    """An fp8 tile held as words (:func:`load_words`, ``[BLOCK_N, 32]`` int32) and its rows'
    scales ``b_c`` [BLOCK_N] dequantized into DTYPE ``[BLOCK_N, 128]`` (:func:`scale_tile`),
    the decoder's unit folded into the scales."""
    b_v = e4m3_words_to_f16(b_w, FP8_CVT, INTERPRET, False)
    if not F16:
        b_v = b_v.to(tl.float32)  # exact
    return scale_tile(b_v, e4m3_unit(b_c, FP8_CVT), DTYPE, PIN, F16)


@triton.jit
def load_latent_tile(p_row, m_n, J: tl.constexpr, FP8: tl.constexpr, FP8_CVT: tl.constexpr,
                     DTYPE: tl.constexpr, PIN: tl.constexpr, F16: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """Latent columns ``[128 J, 128 J + 128)`` of BLOCK_N gathered rows, ``[BLOCK_N, 128]``.

    ``p_row`` [BLOCK_N] row pointers (element pointers for bf16/fp16 rows, byte pointers for
    fp8_ds_mla rows, 4-byte aligned), ``m_n`` [BLOCK_N] validity: masked rows are never read
    and give zeros. An fp8 tile is loaded as 32-bit words and dequantized here into DTYPE
    (:func:`dequant_words`): decoding words takes two instructions per value below SM89, where
    bytes took four to five (loop of an sm80 16x32 tile, Triton 3.8: 1064 instructions per warp
    and step against 1476; unchanged where the hardware converts).
    """
    # (no early return: Triton 3.6 compiles the code after a constexpr-guarded return)
    if FP8:
        p_scale = (p_row + FP8_SCALE_BYTE).to(tl.pointer_type(tl.float32)) + J
        b_c = tl.load(p_scale, mask=m_n, other=0.0)
        b_w = load_words(p_row + J * LATENT_TILE, m_n, LATENT_TILE // 4)
        b_k = dequant_words(b_w, b_c, FP8_CVT, DTYPE, PIN, F16, INTERPRET)
    else:
        o_c = J * LATENT_TILE + tl.arange(0, LATENT_TILE)
        b_k = tl.load(p_row[:, None] + o_c[None, :], mask=m_n[:, None], other=0)
    return b_k


@triton.jit
def load_rope_tile(p_row, m_n, D_PE: tl.constexpr, FP8: tl.constexpr, DTYPE: tl.constexpr):
    """The ``D_PE`` rope columns of BLOCK_N gathered rows, ``[BLOCK_N, D_PE]`` in DTYPE."""
    o_p = tl.arange(0, D_PE)
    if FP8:
        p_pe = (p_row + FP8_ROPE_BYTE).to(tl.pointer_type(tl.bfloat16))
    else:
        p_pe = p_row + 4 * LATENT_TILE
    return tl.load(p_pe[:, None] + o_p[None, :], mask=m_n[:, None], other=0.0).to(DTYPE)


@triton.jit
def mma(a, b, INTERPRET: tl.constexpr):
    """``tl.dot(a, b)`` with an fp32 accumulator.

    Under the interpreter (``INTERPRET``, set by the launcher under ``TRITON_INTERPRET=1``) it
    multiplies in fp32: the interpreter of Triton 3.8 returns garbage for bf16 operands (fp16
    and fp32 are right). Operands are rounded to their storage dtype first either way, so
    results match the GPU's.
    """
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


@triton.jit
def tile_update(b_acc, b_alpha, b_p, b_v, INTERPRET: tl.constexpr):
    """One output tile's online-softmax update: ``acc * alpha + p @ v_tile`` (p in v's dtype)."""
    return b_acc * b_alpha[:, None] + mma(b_p.to(b_v.dtype), b_v, INTERPRET)


@triton.jit
def sink_factor(b_lse2, b_sink):
    """``exp(lse) / (exp(lse) + exp(sink))`` from a base-2 lse; 0 for an empty row (lse -inf)."""
    b_lse = b_lse2 * LN2
    f = 1.0 / (1.0 + tl.exp(b_sink - b_lse))
    return tl.where(b_lse2 == float("-inf"), 0.0, f)


@triton.jit
def score_part(b_q, b_k, UNFUSED: tl.constexpr, INTERPRET: tl.constexpr):
    """``q @ k^T`` for one group of columns, fp32 ``[BLOCK_H, BLOCK_N]``. Summed as
    ``s = part + part + ...``, Triton folds each addition into the next dot's accumulator;
    with ``UNFUSED`` the result passes an identity it cannot fold (kernels/attention.py,
    ``EXCHANGE_P``)."""
    b_s = mma(b_q, tl.trans(b_k), INTERPRET)
    if UNFUSED:
        if not INTERPRET:
            b_s = opaque(b_s, 1)
    return b_s


@triton.jit
def sm_index(INTERPRET: tl.constexpr):
    """The SM this program runs on (``%smid``; 0 under the interpreter, which runs programs
    one after another)."""
    if INTERPRET:
        return tl.program_id(0) * 0
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [tl.program_id(0)],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def block_barrier(INTERPRET: tl.constexpr):
    """``bar.sync`` of all threads of the program, once each; returns 0 (for an address, so
    that loads after it cannot move before it). Global stores made before it are visible to
    every thread of the program after it."""
    if INTERPRET:
        return tl.program_id(0) * 0
    return tl.inline_asm_elementwise("bar.sync 0;\n\tmov.u32 $0, 0;", "=r,r", [tl.program_id(0)],
                                     dtype=tl.int32, is_pure=False, pack=1)
