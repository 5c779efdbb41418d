"""The sparse MLA kernel: one program = one query token x BLOCK_H heads x one split of top-k.

Each program walks its slice of ``indices[t]`` in tiles of BLOCK_N rows. A gathered tile is
loaded once and shared by all BLOCK_H heads; its latent columns serve as V. The latent is four
128-column tiles (the fp8_ds_mla quantization tile); an fp8 tile is dequantized once, where it
is loaded (see :mod:`.common`). Scores use tensor-core dots over the 512 latent and 64 rope
columns (no padding to 1024) and an online softmax in base 2 with a finite running max, so
fully masked tiles give no NaN.

With one split the program writes the final output and lse. With several, it writes a
normalised partial output and its base-2 lse, and :mod:`.combine` merges them.

``EXCHANGE_P`` (tiles with ``exchange_p``): Triton lays out a dot whose result reaches another
dot with all warps along M; with 64 heads and 8 warps both warpgroups then compute the whole
score tile (BENCHMARKS.md, "What bounds the kernel"). With ``EXCHANGE_P`` no value computed
from the scores reaches a dot: the five QK dots are summed unfused (:func:`.common.score_part`), and
the probabilities and the rescale factor go through a scratch slot of this program's SM in
global memory (two buffers, alternating per step, one barrier per step). The slot is the
SM's, so the tile must own its SM: its accumulator alone takes over half of the SM's
registers (the launcher checks the tile's shape).

``SCORES_APART`` (tiles with ``scores_apart``; replaces ``EXCHANGE_P`` where both are set): the
same end by the compiler's own means. The scores and the softmax sit in a region of their own
(a branch on ``n_rows > 0``, taken whenever a row can be valid); the forward slice of a dot,
which Triton's layout choice searches for another dot, ends at the region's end. So each
warpgroup computes half of the score tile, and Triton moves the probabilities and rescale
factors into the PV dots' layout through shared memory: no scratch slot, no barrier of ours,
no SM-id query. Compiled for sm90: 36 QK ``wgmma`` per step, as with ``EXCHANGE_P``, and
by Triton 3.6 965 instructions per warp and step against 980 (bf16 64x64), 9 barriers against
14, 224 KB of shared memory as with ``EXCHANGE_P`` (fp8: 193 KB); Triton 3.8 converts the
probabilities three times there and needs 232 KB, over sm90's 227 KB; the 64x32 tiles fit
both (153-184 KB with 3 stages). On in no table until timed.

``PREFETCH_IDX`` (tiles with ``prefetch_idx``): the next tile's row ids are loaded one step
ahead, so forming the gather's addresses does not wait for them (BENCHMARKS.md, "Row ids a
step ahead").

``ROWS_AHEAD`` (fp8_ds_mla rows, tiles with ``rows_ahead``): the next tile's rows are loaded
into registers one step ahead (plain loads, their row ids two steps ahead) instead of through
the asynchronous-copy pipeline into shared memory, so a step's dequantization starts from
registers that arrived during the previous step. They are issued after the step's scores, or with
``ROWS_EARLY`` (tiles with ``rows_early``) before them.
"""

import dataclasses
import functools
import math
import os

import torch
import triton
import triton.language as tl

from .. import configs
from ..hostmath import cdiv
from .combine import launch_combine
from .common import (FP8_ROPE_BYTE, FP8_SCALE_BYTE, INTERPRETED, LATENT_TILE, LAUNCH_OPTIONS,
                     LN2, bf16_words_to_bf16, block_barrier, dequant_words, load_latent_tile,
                     load_rope_tile, load_words, opaque, score_part, sink_factor, sm_index,
                     tile_update)
from .launch import launch, scratch, shared, unrecorded

D_NOPE = 512


@triton.jit
def _load_q_tile(p_q, m_h, J: tl.constexpr):
    o_c = J * LATENT_TILE + tl.arange(0, LATENT_TILE)
    return tl.load(p_q[:, None] + o_c[None, :], mask=m_h[:, None], other=0.0)  # [BLOCK_H, 128]


@triton.jit
def _to_operand(b_q, Q_SCALE: tl.constexpr, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    if Q_SCALE != 1.0:
        b_q = b_q.to(tl.float32) * Q_SCALE  # once per program; exact (a power of two)
        if not INTERPRET:
            # Without the fence the compiler rounds to DTYPE first and scales after (PTX:
            # cvt.rn.f16x2.f32, then mul.f16x2), and a q past fp16's range becomes inf.
            b_q = opaque(b_q, 1)
    return b_q.to(DTYPE)


@triton.jit
def _row_mask(o_n, b_idx, n_end, n_rows):
    """Which of a tile's entries name a row: inside this program's slice (``o_n < n_end``)
    and a valid row id (``0 <= id < n_rows``; -1 and larger ids are skipped), [BLOCK_N]."""
    return (o_n < n_end) & (b_idx >= 0) & (b_idx < n_rows)


@triton.jit
def _load_fp8_rows(kv_ptr, b_idx, m_n, stride_kv, D_PE: tl.constexpr):
    """Rows ``b_idx`` [BLOCK_N] of an fp8_ds_mla cache as stored, for ``ROWS_AHEAD``: each
    latent tile's e4m3 bytes in 32-bit words [BLOCK_N, 32] and its scales [BLOCK_N] fp32 (four
    of each), and the bf16 rope columns in words [BLOCK_N, D_PE / 2]; masked rows are never
    read and give zeros."""
    p_row = kv_ptr + b_idx.to(tl.int64) * stride_kv
    p_sc = (p_row + FP8_SCALE_BYTE).to(tl.pointer_type(tl.float32))
    b_w0 = load_words(p_row, m_n, LATENT_TILE // 4)
    b_w1 = load_words(p_row + LATENT_TILE, m_n, LATENT_TILE // 4)
    b_w2 = load_words(p_row + 2 * LATENT_TILE, m_n, LATENT_TILE // 4)
    b_w3 = load_words(p_row + 3 * LATENT_TILE, m_n, LATENT_TILE // 4)
    b_c0 = tl.load(p_sc, mask=m_n, other=0.0)
    b_c1 = tl.load(p_sc + 1, mask=m_n, other=0.0)
    b_c2 = tl.load(p_sc + 2, mask=m_n, other=0.0)
    b_c3 = tl.load(p_sc + 3, mask=m_n, other=0.0)
    b_pe = load_words(p_row + FP8_ROPE_BYTE, m_n, D_PE // 2)
    return b_w0, b_w1, b_w2, b_w3, b_c0, b_c1, b_c2, b_c3, b_pe


@triton.jit
def _next_rows(kv_ptr, p_idx, b_idx_next, o_n, n_end, n_rows, stride_kv, BLOCK_N: tl.constexpr,
               D_PE: tl.constexpr):
    """For ``ROWS_AHEAD``, in the step over entries ``o_n``: the next tile's rows
    (:func:`_load_fp8_rows`, from its row ids ``b_idx_next``), those ids, and the ids of the
    tile after it."""
    o_nn = o_n + BLOCK_N
    b_w0, b_w1, b_w2, b_w3, b_c0, b_c1, b_c2, b_c3, b_pe = _load_fp8_rows(
        kv_ptr, b_idx_next, _row_mask(o_nn, b_idx_next, n_end, n_rows), stride_kv, D_PE)
    b_idx_after = tl.load(p_idx + o_nn + BLOCK_N, mask=o_nn + BLOCK_N < n_end, other=-1)
    return b_w0, b_w1, b_w2, b_w3, b_c0, b_c1, b_c2, b_c3, b_pe, b_idx_next, b_idx_after


@triton.jit
def _scores(b_q0, b_q1, b_q2, b_q3, b_qp, b_k0, b_k1, b_k2, b_k3, b_kp, D_PE: tl.constexpr,
            UNFUSED: tl.constexpr, INTERPRET: tl.constexpr):
    """``q @ k^T`` over the four latent tiles and the rope columns, fp32 [BLOCK_H, BLOCK_N]."""
    b_s = score_part(b_q0, b_k0, UNFUSED, INTERPRET)
    b_s += score_part(b_q1, b_k1, UNFUSED, INTERPRET)
    b_s += score_part(b_q2, b_k2, UNFUSED, INTERPRET)
    b_s += score_part(b_q3, b_k3, UNFUSED, INTERPRET)
    if D_PE > 0:
        b_s += score_part(b_qp, b_kp, UNFUSED, INTERPRET)
    return b_s


@triton.jit
def _softmax(b_s, m_n, b_m, b_l, qk_scale, P_DTYPE: tl.constexpr):
    """One online-softmax step over raw scores ``b_s`` [BLOCK_H, BLOCK_N] (entries outside
    ``m_n`` masked): ``(p in P_DTYPE, rescale factor, new max, new sum)``, base 2."""
    b_s = tl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
    b_p = tl.exp2(b_s - b_m_new[:, None])
    b_alpha = tl.exp2(b_m - b_m_new)
    b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
    return b_p.to(P_DTYPE), b_alpha, b_m_new, b_l


@triton.jit
def _store_tile(p_o, b_acc, b_scale, m_h, J: tl.constexpr):
    o_c = J * LATENT_TILE + tl.arange(0, LATENT_TILE)
    b_o = b_acc * b_scale[:, None]
    tl.store(p_o[:, None] + o_c[None, :], b_o.to(p_o.dtype.element_ty), mask=m_h[:, None])


# Arguments that vary from call to call of one kind are not specialized (Triton would compile
# another variant for a value divisible by 16, or equal to 1): n_rows (the fp8 workspace passes
# its slot count) and the partial lse's strides (the split count). triton_sparse_mla.warmup
# relies on it.
@triton.jit(do_not_specialize=["n_rows", "stride_lse_t", "stride_lse_h"])
def sparse_mla_fwd_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr,
    out_ptr, lse_ptr, scratch_p_ptr, scratch_alpha_ptr,
    qk_scale, n_rows, n_heads, topk, split_size,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
    stride_kv, stride_idx_t,
    stride_o_t, stride_o_h, stride_o_s,
    stride_lse_t, stride_lse_h,
    D_PE: tl.constexpr, FP8: tl.constexpr, FP8_CVT: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_SINK: tl.constexpr, PARTIAL: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
    DTYPE: tl.constexpr, PIN_CVT: tl.constexpr, EXCHANGE_P: tl.constexpr,
    PREFETCH_IDX: tl.constexpr, FP8_F16: tl.constexpr, Q_SCALE: tl.constexpr,
    ROWS_AHEAD: tl.constexpr, ROWS_EARLY: tl.constexpr, SCORES_APART: tl.constexpr,
):
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 rows per tile")
    tl.static_assert(BLOCK_H >= 16, "tl.dot needs at least 16 heads per tile (pad in registers)")
    tl.static_assert((FP8 and D_PE > 0) or not ROWS_AHEAD, "ROWS_AHEAD is for fp8_ds_mla rows")
    # One grid axis for (token, head tile), head tiles fastest: a token's head tiles start
    # together on neighbouring SMs, and the rows one gathers are still in L2 for the others.
    # Against token-fastest order (every token's first head tile before any second one):
    # 1.01-1.05x with 128 heads on the sm90 64-head tile, 1.04-1.08x with 64 heads on the sm86
    # 32-head tile (H200, 2026-12-01, run 43, BENCHMARKS.md "Program order").
    n_h_tiles = tl.cdiv(n_heads, BLOCK_H)
    i_t = (tl.program_id(0) // n_h_tiles).to(tl.int64)
    i_h = tl.program_id(0) % n_h_tiles
    i_s = tl.program_id(1)

    o_h = i_h * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < n_heads
    p_qn = q_nope_ptr + i_t * stride_qn_t + o_h * stride_qn_h  # [BLOCK_H]
    # DTYPE is the tensor-core operand type: q's dtype, or fp16 for fp8 rows with FP8_F16 (fp8
    # rows are dequantized into it). Q_SCALE (a power of two) keeps a bf16 q inside fp16's range
    # there; the launcher divides it out of qk_scale.
    b_q0 = _to_operand(_load_q_tile(p_qn, m_h, 0), Q_SCALE, DTYPE, INTERPRET)
    b_q1 = _to_operand(_load_q_tile(p_qn, m_h, 1), Q_SCALE, DTYPE, INTERPRET)
    b_q2 = _to_operand(_load_q_tile(p_qn, m_h, 2), Q_SCALE, DTYPE, INTERPRET)
    b_q3 = _to_operand(_load_q_tile(p_qn, m_h, 3), Q_SCALE, DTYPE, INTERPRET)
    if D_PE > 0:
        o_p = tl.arange(0, D_PE)
        p_qp = q_pe_ptr + i_t * stride_qp_t + o_h[:, None] * stride_qp_h + o_p[None, :]
        b_qp = _to_operand(tl.load(p_qp, mask=m_h[:, None], other=0.0), Q_SCALE, DTYPE,
                           INTERPRET)  # [BLOCK_H, D_PE]
    else:
        b_qp = None

    n_start = i_s * split_size
    n_end = tl.minimum(n_start + split_size, topk)
    if HAS_LEN:
        n_end = tl.minimum(n_end, tl.load(len_ptr + i_t))

    # A finite initial max: a tile with every score masked to -inf then gives p = 0, alpha = 1.
    b_m = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    b_l = tl.zeros([BLOCK_H], dtype=tl.float32)
    b_acc0 = tl.zeros([BLOCK_H, LATENT_TILE], dtype=tl.float32)
    b_acc1 = tl.zeros([BLOCK_H, LATENT_TILE], dtype=tl.float32)
    b_acc2 = tl.zeros([BLOCK_H, LATENT_TILE], dtype=tl.float32)
    b_acc3 = tl.zeros([BLOCK_H, LATENT_TILE], dtype=tl.float32)
    p_idx = idx_ptr + i_t * stride_idx_t
    if PREFETCH_IDX or ROWS_AHEAD:
        o_n = n_start + tl.arange(0, BLOCK_N)
        b_idx_next = tl.load(p_idx + o_n, mask=o_n < n_end, other=-1)
    if ROWS_AHEAD:
        # The first tile's rows, and the row ids of the tile after it (as a step before the
        # first would load them).
        b_r0, b_r1, b_r2, b_r3, b_c0, b_c1, b_c2, b_c3, b_pe, b_idx, b_idx_next = _next_rows(
            kv_ptr, p_idx, b_idx_next, o_n - BLOCK_N, n_end, n_rows, stride_kv, BLOCK_N, D_PE)
    for n0 in range(n_start, n_end, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        m_n = o_n < n_end
        if ROWS_AHEAD:
            # This tile's rows were loaded into registers a step ago (the next tile's are
            # loaded below, after the scores).
            m_n = _row_mask(o_n, b_idx, n_end, n_rows)
            # [BLOCK_N, 128] each
            b_k0 = dequant_words(b_r0, b_c0, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            b_k1 = dequant_words(b_r1, b_c1, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            b_k2 = dequant_words(b_r2, b_c2, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            b_k3 = dequant_words(b_r3, b_c3, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            b_kp = bf16_words_to_bf16(b_pe).to(DTYPE)  # [BLOCK_N, D_PE]
        else:
            if PREFETCH_IDX:
                # The next tile's row ids are loaded a step ahead, so the gather's addresses do
                # not wait for them.
                b_idx = b_idx_next
                b_idx_next = tl.load(p_idx + o_n + BLOCK_N, mask=o_n + BLOCK_N < n_end, other=-1)
            else:
                b_idx = tl.load(p_idx + o_n, mask=m_n, other=-1)
            m_n = m_n & (b_idx >= 0) & (b_idx < n_rows)
            p_row = kv_ptr + b_idx.to(tl.int64) * stride_kv  # [BLOCK_N]
            # [BLOCK_N, 128] each
            b_k0 = load_latent_tile(p_row, m_n, 0, FP8, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            b_k1 = load_latent_tile(p_row, m_n, 1, FP8, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            b_k2 = load_latent_tile(p_row, m_n, 2, FP8, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            b_k3 = load_latent_tile(p_row, m_n, 3, FP8, FP8_CVT, DTYPE, PIN_CVT, FP8_F16, INTERPRET)
            if D_PE > 0:
                b_kp = load_rope_tile(p_row, m_n, D_PE, FP8, DTYPE)  # [BLOCK_N, D_PE]
        if ROWS_AHEAD and ROWS_EARLY:
            # (ROWS_EARLY: the next tile's rows are loaded before this tile's scores instead)
            b_r0, b_r1, b_r2, b_r3, b_c0, b_c1, b_c2, b_c3, b_pe, b_idx, b_idx_next = _next_rows(
                kv_ptr, p_idx, b_idx_next, o_n, n_end, n_rows, stride_kv, BLOCK_N, D_PE)
        if D_PE == 0:
            b_kp = None
        if SCORES_APART:
            # A region of its own (n_rows > 0 always holds where a row is valid): Triton lays
            # a dot out with every warp along M when another dot is in its forward slice, and
            # that slice ends at the region's yield.
            if n_rows > 0:
                b_s = _scores(b_q0, b_q1, b_q2, b_q3, b_qp, b_k0, b_k1, b_k2, b_k3, b_kp, D_PE,
                              True, INTERPRET)
                b_p, b_alpha, b_m_new, b_l = _softmax(b_s, m_n, b_m, b_l, qk_scale, DTYPE)
            else:
                # Zeros formed at run time: as a constant, Triton 3.6 keeps the tile in the
                # PV operand layout in 8 KB of shared memory of its own for the whole kernel.
                b_p = (tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32) * qk_scale).to(DTYPE)
                b_alpha = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
                b_m_new = b_m
        else:
            b_s = _scores(b_q0, b_q1, b_q2, b_q3, b_qp, b_k0, b_k1, b_k2, b_k3, b_kp, D_PE,
                          EXCHANGE_P, INTERPRET)  # [BLOCK_H, BLOCK_N]
        if ROWS_AHEAD and not ROWS_EARLY:
            # The next tile's rows, loaded while this one's softmax and PV run and the next
            # step's dequantization begins; ids of the tile after it.
            b_r0, b_r1, b_r2, b_r3, b_c0, b_c1, b_c2, b_c3, b_pe, b_idx, b_idx_next = _next_rows(
                kv_ptr, p_idx, b_idx_next, o_n, n_end, n_rows, stride_kv, BLOCK_N, D_PE)
        if not SCORES_APART:
            # P converted once here for fp8, inside tile_update for bf16: the codegen measured
            b_p, b_alpha, b_m_new, b_l = _softmax(b_s, m_n, b_m, b_l, qk_scale,
                                                  DTYPE if FP8 else tl.float32)
        if EXCHANGE_P:
            i_buf = sm_index(INTERPRET) * 2 + (n0 // BLOCK_N) % 2
            o_sh = tl.arange(0, BLOCK_H)
            p_sp = (scratch_p_ptr + i_buf.to(tl.int64) * (BLOCK_H * BLOCK_N)
                    + o_sh[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])  # [BLOCK_H, BLOCK_N]
            p_sa = scratch_alpha_ptr + i_buf.to(tl.int64) * BLOCK_H + o_sh  # [BLOCK_H]
            tl.store(p_sp, b_p.to(DTYPE))
            tl.store(p_sa, b_alpha)
            i_zero = block_barrier(INTERPRET)
            b_p = tl.load(p_sp + i_zero)
            b_alpha = tl.load(p_sa + i_zero)
        b_acc0 = tile_update(b_acc0, b_alpha, b_p, b_k0, INTERPRET)
        b_acc1 = tile_update(b_acc1, b_alpha, b_p, b_k1, INTERPRET)
        b_acc2 = tile_update(b_acc2, b_alpha, b_p, b_k2, INTERPRET)
        b_acc3 = tile_update(b_acc3, b_alpha, b_p, b_k3, INTERPRET)
        b_m = b_m_new

    # (empty: l == 0, so that a NaN l, from a row past fp16's range, gives NaN and not -inf)
    m_empty = b_l == 0.0
    b_inv_l = 1.0 / tl.where(m_empty, 1.0, b_l)
    b_lse2 = tl.where(m_empty, float("-inf"), b_m + tl.log2(tl.where(m_empty, 1.0, b_l)))
    if PARTIAL:
        p_o = out_ptr + i_t * stride_o_t + i_s * stride_o_s + o_h * stride_o_h
        tl.store(lse_ptr + i_t * stride_lse_t + o_h * stride_lse_h + i_s, b_lse2, mask=m_h)
    else:
        if HAS_SINK:
            b_inv_l = b_inv_l * sink_factor(b_lse2, tl.load(sink_ptr + o_h, mask=m_h, other=0.0))
        p_o = out_ptr + i_t * stride_o_t + o_h * stride_o_h
        if lse_ptr is not None:
            tl.store(lse_ptr + i_t * stride_lse_t + o_h * stride_lse_h, b_lse2 * LN2, mask=m_h)
    _store_tile(p_o, b_acc0, b_inv_l, m_h, 0)
    _store_tile(p_o, b_acc1, b_inv_l, m_h, 1)
    _store_tile(p_o, b_acc2, b_inv_l, m_h, 2)
    _store_tile(p_o, b_acc3, b_inv_l, m_h, 3)


@triton.jit
def _sm_id_count_kernel(out_ptr):
    n = tl.inline_asm_elementwise("mov.u32 $0, %nsmid;", "=r,r", [tl.program_id(0)], dtype=tl.int32,
                                  is_pure=True, pack=1)
    tl.store(out_ptr, n)


def sm_id_count(device_index: int) -> int | None:
    """How many values ``%smid`` takes on this device (``%nsmid``; SM ids need not be contiguous,
    so this can exceed the SM count). Queried once per device, by a kernel and a copy to the
    host; None while a CUDA graph is being captured and the query has not run yet."""
    if device_index not in _SM_ID_COUNT:
        if torch.cuda.is_current_stream_capturing():
            return None
        out = torch.zeros(1, dtype=torch.int32, device=torch.device("cuda", device_index))
        with unrecorded():
            launch(_sm_id_count_kernel, (1,), out, **LAUNCH_OPTIONS)
        _SM_ID_COUNT[device_index] = int(out.item())
    return _SM_ID_COUNT[device_index]


_SM_ID_COUNT: dict[int, int] = {}


def exchange_scratch(device, dtype, block_h, block_n, sm_ids):
    """The scratch slots of an ``exchange_p`` launch: two buffers per SM id, each a
    ``[block_h, block_n]`` probability tile (``dtype``) and ``block_h`` fp32 rescale factors.

    Allocated once per device, dtype and tile shape and kept (about 2 MB on an H200): every
    launch may share them, since a program that uses its SM's slot owns that SM while it
    runs, and no step reads a slot before its program wrote it. Inside a CUDA-graph capture a
    shape not seen before gets buffers of its own from the graph's pool, as any tensor would.
    """
    key = (str(device), dtype, block_h, block_n)
    if key in _SCRATCH:
        shared(*_SCRATCH[key])
        return _SCRATCH[key]
    slots = 2 * sm_ids
    bufs = (torch.empty(slots * block_h * block_n, dtype=dtype, device=device),
            torch.empty(slots * block_h, dtype=torch.float32, device=device))
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _SCRATCH[key] = bufs
        shared(*bufs)
    return bufs


_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def operand_dtype(q_dtype, fp8_f16: bool):
    """``(tensor-core operand dtype, q scale)`` for a query of ``q_dtype``: q's own 16-bit
    type, or fp16 for fp8_ds_mla rows with ``fp8_f16``. A bf16 q is then scaled by 2^-8 on its
    way to fp16 (exact): fp16 holds it without overflow up to |q| = 2^24 and with bf16's
    precision down to |q| = 2^-6; the launcher divides the scale out of ``qk_scale``."""
    if fp8_f16:
        return torch.float16, (2.0 ** -8 if q_dtype == torch.bfloat16 else 1.0)
    return (torch.float16 if q_dtype == torch.float16 else torch.bfloat16), 1.0


def gluon_kernels(tile, q_nope, kv, d_pe: int, fp8: bool, interpret: bool):
    """kernels/gluon_sm90.py where it runs this call with this tile, else None (this module's
    kernel then runs the tile, or for a tile with ``gluon`` its ``without_gluon`` tile): for a
    tile with ``gluon`` where :func:`gluon_applies`."""
    if not tile.gluon:
        return None
    return gluon_module() if gluon_applies(q_nope, kv, d_pe, fp8, interpret) else None


def gluon_applies(q_nope, kv, d_pe: int, fp8: bool, interpret: bool) -> bool:
    """Whether the Gluon kernels run a call: on an SM90 device, not under the interpreter,
    with Triton 3.6 to 3.9 (:data:`GLUON_TRITON`: the Gluon calls they use), for a q of
    576 columns that is bf16 (any row format) or fp16 (fp16 rows), over a cache whose start
    and row stride are multiples of 16 (bytes, and elements: what Triton's specialization can
    tell their 16-byte asynchronous copies; every cache vLLM allocates), unless the
    environment sets ``TRITON_SPARSE_MLA_GLUON=0``. All of it fixed per cache, dtypes and
    device, so CUDA graphs hold."""
    if interpret or os.environ.get("TRITON_SPARSE_MLA_GLUON", "1") == "0":
        return False
    if d_pe != 64 or (fp8 and q_nope.dtype != torch.bfloat16):
        return False
    if kv.stride(0) % 16 != 0 or kv.data_ptr() % 16 != 0:
        return False
    if configs.device_traits(q_nope.device.index)[0] != "sm90":  # (queried once a device)
        return False
    return gluon_module() is not None


# The Triton versions whose Gluon calls the kernels use, [first, past the last): compiled and
# tested on the H200 with 3.6, 3.8 (vLLM 0.33's; runs 236 and 239, 2026-12-04) and 3.9 (run
# 250, 2026-12-05: every Gluon and CUDA-graph test passes). Triton 3.9 renamed two of them
# (shared_memory_descriptor._reinterpret, async_copy's async_copy_global_to_shared); the
# kernels reach both through version-neutral names (gluon_sm90._reinterpret, _async_load).
# Under 3.9 the 64-head kernels ran at 0.96-0.97x of their 3.8 speed (run 251, one round; run
# 256: the bf16 one at 0.96-0.99x of 3.6, its spills there not the cause, its wgmma descriptors
# built in vector registers: BENCHMARKS.md), still well ahead of the Triton tiles they replace.
GLUON_TRITON = ((3, 6), (3, 10))


def triton_version() -> tuple:
    """This Triton's (major, minor) version, e.g. ``(3, 8)``."""
    return tuple(int(v) for v in triton.__version__.split(".")[:2])


def gluon_triton() -> bool:
    """Whether this Triton's version is one the Gluon kernels are written for
    (:data:`GLUON_TRITON`); imports nothing."""
    return GLUON_TRITON[0] <= triton_version() < GLUON_TRITON[1]


@functools.lru_cache(maxsize=None)
def gluon_module():
    """The Gluon kernels' module, imported once, or None where this Triton lacks the calls
    they use (:func:`gluon_triton`)."""
    if not gluon_triton():
        return None
    try:
        from . import gluon_sm90
    except ImportError:
        return None
    return gluon_sm90


def split_layout(topk: int, splits: int, block_n: int) -> tuple[int, int]:
    """``(split_size, splits)`` as launched for a planned split count: each split a whole
    number of ``block_n``-row tiles, so the count launched can be below the plan's (2048 rows
    in 17 planned splits of 32-row tiles: 16 splits of 128)."""
    split_size = cdiv(cdiv(topk, splits), block_n) * block_n
    return split_size, max(1, cdiv(topk, split_size))


def launch_sparse_mla_fwd(q_nope, q_pe, kv, indices, topk_length, attn_sink, sm_scale, out, lse,
                          *, fp8, plan, gluon_checked=False):
    """Launch the kernel (and the combine step when ``splits > 1``); return the compiled main kernel.

    Shapes: ``q_nope [T, H, 512]``, ``q_pe [T, H, D_PE]`` or None, ``kv [N, C]``,
    ``indices [T, K]`` int32, ``topk_length [T]`` int32 or None, ``attn_sink [H]`` fp32 or None,
    ``out [T, H, 512]``, ``lse [T, H]`` fp32 or None. Inputs are validated by the caller.
    ``plan``: a ``configs.LaunchPlan`` (tile, split count, fp8 decode path).
    ``gluon_checked``: the plan was made for this call with :func:`gluon_applies`'s answer
    (``api._run``), so a tile with ``gluon`` runs the Gluon kernels without asking again; a
    plan made elsewhere (tests, the sweep, another device) is checked here.
    """
    tile, splits, fp8_cvt = plan.tile, plan.splits, plan.fp8_cvt
    interpret = INTERPRETED
    d_pe = 0 if q_pe is None else q_pe.shape[2]
    if gluon_checked and tile.gluon:
        gluon = gluon_module()
    else:
        gluon = gluon_kernels(tile, q_nope, kv, d_pe, fp8, interpret)
    if gluon is None and tile.gluon:
        # a Gluon tile where Gluon does not run (a plan made for another device): its Triton
        # tile, as the planner would have chosen (configs.TileConfig.without_gluon), with the
        # 16 heads this module's tl.dot needs
        tile = tile.without_gluon()
        if tile.block_h < 16:
            tile = dataclasses.replace(tile, block_h=16)
    block_h, block_n = tile.block_h, tile.block_n
    exchange_p = tile.scratch_exchange
    t_count, h_count, _ = q_nope.shape
    n_rows, topk = kv.shape[0], indices.shape[1]
    split_size, splits = split_layout(topk, splits, block_n)
    grid = (t_count * cdiv(h_count, block_h), splits)
    if gluon is not None:
        kernel, args = gluon.kernel_args(q_nope, q_pe, kv, indices, topk_length, attn_sink, sm_scale,
                                         split_size, fp8, tile)
        return launch_with_combine(kernel, grid, args, out, lse, attn_sink, splits)
    fp8_f16 = fp8 and tile.triton_fp8_f16
    dtype, q_scale = operand_dtype(q_nope.dtype, fp8_f16)
    scratch_p = scratch_alpha = None
    if exchange_p:
        # The scratch slot is the SM's. A program whose fp32 accumulators alone fill half of
        # the 64K registers an SM has (every architecture from SM80 to SM120) holds over half
        # of them, whatever its warp count, so no other program of this kernel, from this
        # launch or another, can share its SM.
        if block_h * D_NOPE < 32768:
            raise ValueError(f"exchange_p: the tile must hold 32768 accumulator values (64 heads) "
                             f"to own its SM, got block_h={block_h}")
        sm_ids = 1 if interpret else sm_id_count(out.device.index)
        # First call inside a graph capture (the SM-id query cannot run there): the same tile
        # without the exchange, same results up to rounding.
        exchange_p = sm_ids is not None
    if exchange_p:
        scratch_p, scratch_alpha = exchange_scratch(out.device, dtype, block_h, block_n, sm_ids)
    common = dict(
        scratch_p_ptr=scratch_p, scratch_alpha_ptr=scratch_alpha,
        q_nope_ptr=q_nope, q_pe_ptr=q_pe if q_pe is not None else q_nope, kv_ptr=kv,
        idx_ptr=indices, len_ptr=topk_length, sink_ptr=attn_sink,
        qk_scale=float(sm_scale) * math.log2(math.e) / q_scale, n_rows=n_rows, n_heads=h_count,
        topk=topk, split_size=split_size,
        stride_qn_t=q_nope.stride(0), stride_qn_h=q_nope.stride(1),
        stride_qp_t=q_pe.stride(0) if q_pe is not None else 0,
        stride_qp_h=q_pe.stride(1) if q_pe is not None else 0,
        stride_kv=kv.stride(0), stride_idx_t=indices.stride(0),
        D_PE=d_pe, FP8=fp8, FP8_CVT=fp8_cvt,
        HAS_LEN=topk_length is not None, HAS_SINK=attn_sink is not None,
        DTYPE=tl.float16 if dtype == torch.float16 else tl.bfloat16, EXCHANGE_P=exchange_p,
        BLOCK_H=block_h, BLOCK_N=block_n, INTERPRET=interpret, PREFETCH_IDX=tile.prefetch_idx,
        FP8_F16=fp8_f16, Q_SCALE=q_scale, ROWS_AHEAD=fp8 and tile.rows_ahead,
        ROWS_EARLY=fp8 and tile.rows_ahead and tile.rows_early, SCORES_APART=tile.scores_apart,
        PIN_CVT=fp8 and plan.pin_conversion and not interpret,  # the interpreter runs no PTX
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return launch_with_combine(sparse_mla_fwd_kernel, grid, common, out, lse, attn_sink, splits)


def launch_with_combine(kernel, grid, args, out, lse, attn_sink, splits):
    """Launch a forward kernel (this module's or kernels/gluon_sm90.py's: the same output
    arguments) with ``args``: into ``out`` and ``lse`` with one split, else into partial
    outputs that the combine kernel merges. Returns the compiled forward kernel."""
    t_count, h_count, _ = out.shape
    if splits == 1:
        return launch(
            kernel, grid,
            out_ptr=out, lse_ptr=lse,
            stride_o_t=out.stride(0), stride_o_h=out.stride(1), stride_o_s=0,
            stride_lse_t=lse.stride(0) if lse is not None else 0,
            stride_lse_h=lse.stride(1) if lse is not None else 0,
            PARTIAL=False, **args, **LAUNCH_OPTIONS,
        )
    part_o, part_lse = scratch(((t_count, splits, h_count, D_NOPE), (t_count, h_count, splits)),
                               torch.float32, out.device)
    compiled = launch(
        kernel, grid,
        out_ptr=part_o, lse_ptr=part_lse,
        stride_o_t=part_o.stride(0), stride_o_h=part_o.stride(2), stride_o_s=part_o.stride(1),
        stride_lse_t=part_lse.stride(0), stride_lse_h=part_lse.stride(1),
        PARTIAL=True, **args, **LAUNCH_OPTIONS,
    )
    launch_combine(part_o, part_lse, attn_sink, out, lse)
    return compiled
