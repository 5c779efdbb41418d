"""Prototype (not in the library): the 64-head tile for SM90 written in Gluon, bf16 and
fp8_ds_mla rows.

Why: Triton's tile for 64+ heads (``exchange_p``, kernels/attention.py) reaches 0.5x FlashMLA.
Its SASS shows, per 64-row step, five full drains of the tensor pipe in QK (each of the five
column groups' dots ends with ``wgmma.wait_group 0``: Triton makes only loop-carried
accumulator dots asynchronous), the probabilities and rescale factors through a scratch slot
in global memory (an L2 round trip and our own barrier) and 14 barriers. Gluon (Triton's
lower-level language, in Triton 3.6 and 3.8 with the same calls used here) states each of
these directly:

* the five QK dots are issued asynchronously on one accumulator and waited for once;
* each warpgroup computes half of the score tile's rows (``warps_per_cta=[4, 2]``), the
  row max is reduced across the two, and the probabilities go to the PV dots through 8 KB of
  shared memory;
* the gathered rows go through a 2-stage ring of asynchronous copies, the next tile's copies
  issued while this step's score dots run (its slot was last read by the PV dots of the step
  before, which both warpgroups have waited for).

Same shared memory as the Triton tile (q 72 KB, two stages of 64 rows 144 KB, P 8 KB). bf16
rows with 64 rope columns, 64 heads per program; as the library's kernel: splits of the top-k
axis under its split rule (merged by its combine kernel), ``topk_length``, attention sink,
lse, invalid row ids skipped.

The row ids of a tile are loaded a step before its copies are issued. The PV dots take P
from registers (each warpgroup loads the whole tile once, 8 KB) rather than from shared
memory (2 KB per instruction, 16 instructions). Shared-memory bytes per 64-row step, counted:
q as the QK A operand 144 KB (each warpgroup reads all of q), rows as QK B 72 KB and PV B
64 KB, P 8 KB stored and 16 KB loaded, the copies 74 KB: 378 KB, about 2,950 cycles at 128 B
per cycle, against about 2,170 cycles of tensor work at the H200's peak; so shared memory,
not the tensor cores, would bound a perfectly overlapped step (about 730 TFLOP/s).

Compiled for sm90 (2026-12-01): Triton 3.6 743 instructions per warp and 64-row step against
the Triton tile's 980, 6 barriers against 14, 2 tensor-pipe drains against 9 (five QK, four
PV), 253 registers without spills (Triton 3.8: 744 instructions, 251 registers). fp8_ds_mla
rows (``sparse_mla_gluon_fp8_kernel``): 1153 instructions against 1414, 255 registers without
spills, 193.5 KB. Not yet run on a GPU: correctness and speed are what ``main_gpu`` checks
first.

Usage: ``python benchmarks/gluon_sm90.py --compile`` (CPU: compiles both kernels for sm90 and
prints their shared memory); ``python benchmarks/gluon_sm90.py OUT.json`` (GPU: checks 20
problems against the float64 reference by the library's test criteria, both formats, eager
and lazy rescaling, then times both beside the shipped tile, twice each, alternating);
``python benchmarks/gluon_sm90.py --small`` (GPU: four small problems, for compute-sanitizer).
"""

import json
import math
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

BLOCK_H, BLOCK_N, LAT, D_PE, NUM_WARPS, NS = 64, 64, 128, 64, 8, 2
# Gathers: 16 bytes per thread and copy ([BLOCK_N, LAT] bf16, [BLOCK_N, D_PE] bf16, and for
# fp8_ds_mla rows [BLOCK_N, LAT] e4m3 bytes).
GATHER = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0]))
GATHER_PE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0]))
RAW = gl.constexpr(gl.BlockedLayout([1, 16], [4, 8], [NUM_WARPS, 1], [1, 0]))
SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
# Scores: each warpgroup computes half of the rows (columns of S). Output tiles: each
# warpgroup half of each tile's 128 columns.
S_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                             instr_shape=[16, BLOCK_N // 2, 16]))
O_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                             instr_shape=[16, LAT // 2, 16]))
LN2 = gl.constexpr(math.log(2.0))
# A barrier of all the program's threads: gl.thread_barrier in Triton 3.6, gl.barrier in 3.8.
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _row_ids(idx_ptr, n0, n_end, LAYOUT: gl.constexpr, BLOCK_N: gl.constexpr):
    """Row ids ``idx[n0:n0 + BLOCK_N]`` in ``LAYOUT``, -1 past ``n_end``."""
    o_n = n0 + gl.arange(0, BLOCK_N, layout=LAYOUT)
    return gl.load(idx_ptr + o_n, mask=o_n < n_end, other=-1)


@gluon.jit
def _gather(k_s0, k_s1, k_s2, k_s3, kp_s, kv_ptr, b_idx, b_idx2, n_rows, stride_kv, slot,
            GATHER: gl.constexpr, GATHER_PE: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr):
    """Issue the asynchronous copies of rows ``b_idx`` (the same ids in GATHER's and GATHER_PE's
    row slices) into ring slot ``slot``: four latent tiles [BLOCK_N, LAT] and the rope tile
    [BLOCK_N, D_PE]; invalid row ids (-1 past the end) are zero-filled."""
    m_n = (b_idx >= 0) & (b_idx < n_rows)
    p_row = kv_ptr + b_idx.to(gl.int64) * stride_kv
    o_c = gl.arange(0, LAT, layout=gl.SliceLayout(0, GATHER))
    # (one allocation per latent tile: copies into subviews of one allocation at a dynamic
    # index each get a barrier of their own, as the compiler cannot tell them apart)
    ptrs = p_row[:, None] + o_c[None, :]
    async_copy.async_copy_global_to_shared(k_s0.index(slot), ptrs, mask=m_n[:, None])
    async_copy.async_copy_global_to_shared(k_s1.index(slot), ptrs + LAT, mask=m_n[:, None])
    async_copy.async_copy_global_to_shared(k_s2.index(slot), ptrs + 2 * LAT, mask=m_n[:, None])
    async_copy.async_copy_global_to_shared(k_s3.index(slot), ptrs + 3 * LAT, mask=m_n[:, None])
    m_n2 = (b_idx2 >= 0) & (b_idx2 < n_rows)
    p_row2 = kv_ptr + b_idx2.to(gl.int64) * stride_kv + 4 * LAT
    o_p = gl.arange(0, D_PE, layout=gl.SliceLayout(0, GATHER_PE))
    async_copy.async_copy_global_to_shared(kp_s.index(slot), p_row2[:, None] + o_p[None, :],
                                           mask=m_n2[:, None])
    async_copy.commit_group()


@gluon.jit
def _load_q(q_ptr, i_t, h0, n_heads, stride_q_t, stride_q_h, GATHER: gl.constexpr,
            GATHER_PE: gl.constexpr, SMEM: gl.constexpr, BLOCK_H: gl.constexpr, LAT: gl.constexpr,
            D_PE: gl.constexpr):
    """q of this program's heads into shared memory, once: four latent tiles and the rope."""
    o_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, GATHER))
    m_h = o_h < n_heads
    p_q = q_ptr + i_t * stride_q_t + o_h * stride_q_h
    o_c = gl.arange(0, LAT, layout=gl.SliceLayout(0, GATHER))
    q_s0 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, LAT], SMEM,
                                     gl.load(p_q[:, None] + o_c[None, :], mask=m_h[:, None], other=0.0))
    q_s1 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, LAT], SMEM,
                                     gl.load(p_q[:, None] + (LAT + o_c)[None, :], mask=m_h[:, None], other=0.0))
    q_s2 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, LAT], SMEM,
                                     gl.load(p_q[:, None] + (2 * LAT + o_c)[None, :], mask=m_h[:, None], other=0.0))
    q_s3 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, LAT], SMEM,
                                     gl.load(p_q[:, None] + (3 * LAT + o_c)[None, :], mask=m_h[:, None], other=0.0))
    o_h2 = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, GATHER_PE))
    o_p = gl.arange(0, D_PE, layout=gl.SliceLayout(0, GATHER_PE))
    p_q2 = q_ptr + i_t * stride_q_t + o_h2 * stride_q_h + 4 * LAT
    q_sp = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_PE], SMEM,
                                     gl.load(p_q2[:, None] + o_p[None, :], mask=(o_h2 < n_heads)[:, None], other=0.0))
    return q_s0, q_s1, q_s2, q_s3, q_sp


@gluon.jit
def _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN: gl.constexpr, BLOCK_N: gl.constexpr):
    """``(n_start, n_end, steps)``: this program's entries of the top-k list."""
    n_start = i_s * split_size
    n_end = gl.minimum(n_start + split_size, topk)
    if HAS_LEN:
        n_end = gl.minimum(n_end, gl.load(len_ptr + i_t))
    return n_start, n_end, gl.cdiv(gl.maximum(n_end - n_start, 0), BLOCK_N)


@gluon.jit
def _init_state(BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr):
    """Running max, denominator and the four output accumulators. The denominator is kept per
    score-tile entry and summed over the rows once at the end: a sum across the two
    warpgroups each step would take two more barriers."""
    b_m = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(1, S_L))
    b_l2 = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L)
    acc0 = gl.zeros([BLOCK_H, LAT], gl.float32, layout=O_L)
    acc1 = gl.zeros([BLOCK_H, LAT], gl.float32, layout=O_L)
    acc2 = gl.zeros([BLOCK_H, LAT], gl.float32, layout=O_L)
    acc3 = gl.zeros([BLOCK_H, LAT], gl.float32, layout=O_L)
    return b_m, b_l2, acc0, acc1, acc2, acc3


@gluon.jit
def _scores_issue(q_s0, q_s1, q_s2, q_s3, q_sp, k0, k1, k2, k3, kp, s_zero):
    """Issue the five score dots (latent tiles and rope, shared memory) asynchronously on one
    accumulator; the caller waits for them once."""
    s = warpgroup_mma(q_s0, k0.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(q_s1, k1.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(q_s2, k2.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(q_s3, k3.permute((1, 0)), s, is_async=True)
    return warpgroup_mma(q_sp, kp.permute((1, 0)), s, is_async=True)


@gluon.jit
def _softmax_pv(s, acc0, acc1, acc2, acc3, b_m, b_l2, k0, k1, k2, k3, p_smem, p_idx, n0, n_end,
                n_rows, qk_scale, S_L: gl.constexpr, O_L: gl.constexpr, BLOCK_N: gl.constexpr,
                LAZY: gl.constexpr):
    """After a step's scores ``s`` [BLOCK_H, BLOCK_N] (S_L): the online softmax over entries
    ``idx[n0:n0 + BLOCK_N]`` and the PV dots over the four latent tiles ``k0..k3`` (shared
    memory, [BLOCK_N, LAT] bf16); returns the accumulators, running max and denominator.

    With LAZY the running max moves only when some head's max grew by more than 8 (base 2):
    otherwise the step's probabilities stay at most 2^8, exactly as representable, and the
    128 multiplications per thread that rescale the accumulators are skipped. The decision is
    the same in every thread (the maxima are reduced over the whole program)."""
    b_idx = _row_ids(p_idx, n0, n_end, gl.SliceLayout(0, S_L), BLOCK_N)
    m_n = (b_idx >= 0) & (b_idx < n_rows)
    s = gl.where(m_n[None, :], s * qk_scale, float("-inf"))
    b_m_new = gl.maximum(b_m, gl.max(s, axis=1))
    if LAZY:
        grow = gl.max(b_m_new - b_m, axis=0) > 8.0
    else:
        grow = True
    if grow:
        alpha = gl.exp2(b_m - b_m_new)
        b_l2 = b_l2 * alpha[:, None]
        # Every accumulator rescaled before the first PV dot is issued: ptxas serializes all
        # wgmma (a wait after each instruction; its remark C7515) when other instructions
        # write an accumulator while a wgmma is in flight.
        a_o = gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        acc0 = acc0 * a_o
        acc1 = acc1 * a_o
        acc2 = acc2 * a_o
        acc3 = acc3 * a_o
        b_m = b_m_new
    p = gl.exp2(s - b_m[:, None])
    b_l2 = b_l2 + p
    p_smem.store(p.to(gl.bfloat16))
    _barrier()  # both halves of P are in place (read back into registers below)
    p_op = p_smem.load(gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2))
    acc0 = warpgroup_mma(p_op, k0, acc0, is_async=True)
    acc1 = warpgroup_mma(p_op, k1, acc1, is_async=True)
    acc2 = warpgroup_mma(p_op, k2, acc2, is_async=True)
    acc3 = warpgroup_mma(p_op, k3, acc3, is_async=True)
    # One wait for the four PV dots, inside the step: a wgmma still in flight while the
    # next step defines its score accumulator would make ptxas serialize every wgmma.
    acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=[acc0, acc1, acc2, acc3])
    return acc0, acc1, acc2, acc3, b_m, b_l2


@gluon.jit
def _epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
              stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK: gl.constexpr,
              HAS_LSE: gl.constexpr, PARTIAL: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr,
              BLOCK_H: gl.constexpr, LAT: gl.constexpr):
    """The final output, lse and sink, or with PARTIAL the partial output and base-2 lse."""
    b_l = gl.sum(b_l2, axis=1)
    m_nonempty = b_l > 0.0
    b_inv_l = 1.0 / gl.where(m_nonempty, b_l, 1.0)
    b_lse2 = gl.where(m_nonempty, b_m + gl.log2(gl.where(m_nonempty, b_l, 1.0)), float("-inf"))
    o_hs = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, S_L))
    m_hs = o_hs < n_heads
    if PARTIAL:
        gl.store(lse_ptr + i_t * stride_lse_t + o_hs * stride_lse_h + i_s, b_lse2, mask=m_hs)
    else:
        if HAS_SINK:
            b_lse = b_lse2 * LN2
            b_sink = gl.load(sink_ptr + o_hs, mask=m_hs, other=0.0)
            b_inv_l = b_inv_l * gl.where(b_lse2 == float("-inf"), 0.0, 1.0 / (1.0 + gl.exp(b_sink - b_lse)))
        if HAS_LSE:
            gl.store(lse_ptr + i_t * stride_lse_t + o_hs * stride_lse_h, b_lse2 * LN2, mask=m_hs)
    inv_l = gl.convert_layout(b_inv_l, gl.SliceLayout(1, O_L))[:, None]
    o_ho = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_L))
    o_co = gl.arange(0, LAT, layout=gl.SliceLayout(0, O_L))
    p_o = out_ptr + i_t * stride_o_t + i_s * stride_o_s + o_ho[:, None] * stride_o_h + o_co[None, :]
    m_o = (o_ho < n_heads)[:, None]
    gl.store(p_o, (acc0 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + LAT, (acc1 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + 2 * LAT, (acc2 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + 3 * LAT, (acc3 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)


@gluon.jit
def sparse_mla_gluon_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr, qk_scale,
                            n_rows, n_heads, topk, split_size,
                            stride_q_t, stride_q_h, stride_kv, stride_idx_t,
                            stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                            HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, HAS_LSE: gl.constexpr,
                            PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                            LAT: gl.constexpr, D_PE: gl.constexpr, NS: gl.constexpr,
                            LAZY: gl.constexpr):
    """One program: one token x BLOCK_H heads x one split of its top-k (as
    kernels/attention.py): the final bf16 output, lse (natural log) and sink, or with PARTIAL
    the normalised fp32 partial output and its base-2 lse for the combine kernel."""

    n_h_tiles = gl.cdiv(n_heads, BLOCK_H)
    i_t = (gl.program_id(0) // n_h_tiles).to(gl.int64)
    h0 = (gl.program_id(0) % n_h_tiles) * BLOCK_H

    q_s0, q_s1, q_s2, q_s3, q_sp = _load_q(q_ptr, i_t, h0, n_heads, stride_q_t, stride_q_h, GATHER,
                                           GATHER_PE, SMEM, BLOCK_H, LAT, D_PE)
    k_s0 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, LAT], SMEM)
    k_s1 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, LAT], SMEM)
    k_s2 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, LAT], SMEM)
    k_s3 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, LAT], SMEM)
    kp_smem = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, D_PE], SMEM)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], SMEM)

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    G_ROWS: gl.constexpr = gl.SliceLayout(1, GATHER)
    GP_ROWS: gl.constexpr = gl.SliceLayout(1, GATHER_PE)
    _gather(k_s0, k_s1, k_s2, k_s3, kp_smem, kv_ptr, _row_ids(p_idx, n_start, n_end, G_ROWS, BLOCK_N),
            _row_ids(p_idx, n_start, n_end, GP_ROWS, BLOCK_N), n_rows, stride_kv, 0, GATHER,
            GATHER_PE, LAT, D_PE)
    # The next tile's row ids, loaded a step before its copies are issued.
    b_idx_g = _row_ids(p_idx, n_start + BLOCK_N, n_end, G_ROWS, BLOCK_N)
    b_idx_p = _row_ids(p_idx, n_start + BLOCK_N, n_end, GP_ROWS, BLOCK_N)

    b_m, b_l2, acc0, acc1, acc2, acc3 = _init_state(BLOCK_H, BLOCK_N, LAT)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L)
    for i in range(n_steps):
        slot = i % NS
        async_copy.wait_group(0)  # this thread's copies of step i
        # The wgmma read shared memory through the async proxy: this thread's writes (and, the
        # first time, q's stores) are fenced for it, then the barrier makes everyone's visible.
        fence_async_shared()
        _barrier()
        k0 = k_s0.index(slot)
        k1 = k_s1.index(slot)
        k2 = k_s2.index(slot)
        k3 = k_s3.index(slot)
        kp = kp_smem.index(slot)
        s = _scores_issue(q_s0, q_s1, q_s2, q_s3, q_sp, k0, k1, k2, k3, kp, s_zero)
        # While the score dots run: the next tile's copies, into the slot the last step's PV
        # dots read (both warpgroups waited for those before the barrier above).
        if i + 1 < n_steps:
            _gather(k_s0, k_s1, k_s2, k_s3, kp_smem, kv_ptr, b_idx_g, b_idx_p, n_rows, stride_kv,
                    (i + 1) % NS, GATHER, GATHER_PE, LAT, D_PE)
            b_idx_g = _row_ids(p_idx, n_start + (i + 2) * BLOCK_N, n_end, G_ROWS, BLOCK_N)
            b_idx_p = _row_ids(p_idx, n_start + (i + 2) * BLOCK_N, n_end, GP_ROWS, BLOCK_N)
        s = warpgroup_mma_wait(0, deps=[s])  # one wait for the five score dots
        acc0, acc1, acc2, acc3, b_m, b_l2 = _softmax_pv(
            s, acc0, acc1, acc2, acc3, b_m, b_l2, k0, k1, k2, k3, p_smem, p_idx,
            n_start + i * BLOCK_N, n_end, n_rows, qk_scale, S_L, O_L, BLOCK_N, LAZY)

    async_copy.wait_group(0)  # (with no step run, the prologue's masked copies)
    _epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
              stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK, HAS_LSE,
              PARTIAL, S_L, O_L, BLOCK_H, LAT)


@gluon.jit
def _gather_fp8(raw0, raw1, raw2, raw3, sc0, sc1, sc2, sc3, rp_s, kv_ptr, b_idx_r, b_idx_p, n_rows,
                stride_kv, slot, RAW: gl.constexpr, GATHER_PE: gl.constexpr, LAT: gl.constexpr,
                D_PE: gl.constexpr):
    """Issue the asynchronous copies of fp8_ds_mla rows (the same ids in two layouts' row
    slices): the four latent tiles' e4m3 bytes [BLOCK_N, LAT] into ``raw0..3``, their fp32
    scales [BLOCK_N] into ``sc0..3`` and the bf16 rope [BLOCK_N, D_PE] into ring slot ``slot``
    of ``rp_s``; invalid row ids are zero-filled."""
    m_r = (b_idx_r >= 0) & (b_idx_r < n_rows)
    p_row = kv_ptr + b_idx_r.to(gl.int64) * stride_kv
    ptrs = p_row[:, None] + gl.arange(0, LAT, layout=gl.SliceLayout(0, RAW))[None, :]
    async_copy.async_copy_global_to_shared(raw0, ptrs, mask=m_r[:, None])
    async_copy.async_copy_global_to_shared(raw1, ptrs + LAT, mask=m_r[:, None])
    async_copy.async_copy_global_to_shared(raw2, ptrs + 2 * LAT, mask=m_r[:, None])
    async_copy.async_copy_global_to_shared(raw3, ptrs + 3 * LAT, mask=m_r[:, None])
    # the scales in RAW's row slice, the layout the dequantization reads them in
    p_sc = (p_row + 4 * LAT).to(gl.pointer_type(gl.float32))
    async_copy.async_copy_global_to_shared(sc0, p_sc, mask=m_r)
    async_copy.async_copy_global_to_shared(sc1, p_sc + 1, mask=m_r)
    async_copy.async_copy_global_to_shared(sc2, p_sc + 2, mask=m_r)
    async_copy.async_copy_global_to_shared(sc3, p_sc + 3, mask=m_r)
    m_p = (b_idx_p >= 0) & (b_idx_p < n_rows)
    p_pe = (kv_ptr + b_idx_p.to(gl.int64) * stride_kv + 4 * LAT + 16).to(gl.pointer_type(gl.bfloat16))
    async_copy.async_copy_global_to_shared(
        rp_s.index(slot), p_pe[:, None] + gl.arange(0, D_PE, layout=gl.SliceLayout(0, GATHER_PE))[None, :],
        mask=m_p[:, None])
    async_copy.commit_group()


@gluon.jit
def _dequant_tile(raw, sc, k_c, RAW: gl.constexpr):
    """A latent tile: e4m3 bytes times its rows' scales (both in shared memory), rounded once
    to bf16, stored into the operand tile ``k_c`` (shared memory)."""
    b_sc = sc.load(gl.SliceLayout(1, RAW))  # [BLOCK_N] fp32
    b_v = raw.load(RAW).to(gl.float8e4nv, bitcast=True).to(gl.float32)
    k_c.store((b_v * b_sc[:, None]).to(gl.bfloat16))


@gluon.jit
def sparse_mla_gluon_fp8_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr, qk_scale,
                                n_rows, n_heads, topk, split_size,
                                stride_q_t, stride_q_h, stride_kv, stride_idx_t,
                                stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                                HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, HAS_LSE: gl.constexpr,
                                PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                                LAT: gl.constexpr, D_PE: gl.constexpr, LAZY: gl.constexpr):
    """The same program over fp8_ds_mla rows (656 bytes: 512 e4m3, 4 fp32 scales, 64 bf16 rope).

    Each step's raw bytes come through one buffer of asynchronous copies (33 KB) and are
    dequantized into one bf16 operand tile (64 KB), read by the QK and PV dots; the raw buffer
    is free once dequantized, so the next tile's copies are issued right after, and run during
    this step's dots and softmax. The rope columns go straight to a 2-slot ring (they are an
    operand as stored). Shared memory: q 72 KB + 33 + 16 + 64 + P 8 = 193 KB."""
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    FLAT1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    n_h_tiles = gl.cdiv(n_heads, BLOCK_H)
    i_t = (gl.program_id(0) // n_h_tiles).to(gl.int64)
    h0 = (gl.program_id(0) % n_h_tiles) * BLOCK_H
    q_s0, q_s1, q_s2, q_s3, q_sp = _load_q(q_ptr, i_t, h0, n_heads, stride_q_t, stride_q_h, GATHER,
                                           GATHER_PE, SMEM, BLOCK_H, LAT, D_PE)
    raw0 = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, LAT], FLAT)
    raw1 = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, LAT], FLAT)
    raw2 = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, LAT], FLAT)
    raw3 = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, LAT], FLAT)
    sc0 = gl.allocate_shared_memory(gl.float32, [BLOCK_N], FLAT1)
    sc1 = gl.allocate_shared_memory(gl.float32, [BLOCK_N], FLAT1)
    sc2 = gl.allocate_shared_memory(gl.float32, [BLOCK_N], FLAT1)
    sc3 = gl.allocate_shared_memory(gl.float32, [BLOCK_N], FLAT1)
    rp_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_PE], SMEM)
    k0 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, LAT], SMEM)
    k1 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, LAT], SMEM)
    k2 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, LAT], SMEM)
    k3 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, LAT], SMEM)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], SMEM)

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    R_ROWS: gl.constexpr = gl.SliceLayout(1, RAW)
    GP_ROWS: gl.constexpr = gl.SliceLayout(1, GATHER_PE)
    _gather_fp8(raw0, raw1, raw2, raw3, sc0, sc1, sc2, sc3, rp_s, kv_ptr,
                _row_ids(p_idx, n_start, n_end, R_ROWS, BLOCK_N), _row_ids(p_idx, n_start, n_end, GP_ROWS, BLOCK_N),
                n_rows, stride_kv, 0, RAW, GATHER_PE, LAT, D_PE)
    b_idx_r = _row_ids(p_idx, n_start + BLOCK_N, n_end, R_ROWS, BLOCK_N)
    b_idx_p = _row_ids(p_idx, n_start + BLOCK_N, n_end, GP_ROWS, BLOCK_N)

    b_m, b_l2, acc0, acc1, acc2, acc3 = _init_state(BLOCK_H, BLOCK_N, LAT)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L)
    for i in range(n_steps):
        slot = i % 2
        async_copy.wait_group(0)  # this thread's copies of step i
        _barrier()  # everyone's; and both warpgroups' last PV dots, which read k0..k3, are done
        _dequant_tile(raw0, sc0, k0, RAW)
        _dequant_tile(raw1, sc1, k1, RAW)
        _dequant_tile(raw2, sc2, k2, RAW)
        _dequant_tile(raw3, sc3, k3, RAW)
        fence_async_shared()  # the operand tiles (and the rope copies, and q) for the wgmma
        _barrier()  # every thread's part dequantized: the raw buffer is free
        if i + 1 < n_steps:
            _gather_fp8(raw0, raw1, raw2, raw3, sc0, sc1, sc2, sc3, rp_s, kv_ptr, b_idx_r, b_idx_p,
                        n_rows, stride_kv, (i + 1) % 2, RAW, GATHER_PE, LAT, D_PE)
            b_idx_r = _row_ids(p_idx, n_start + (i + 2) * BLOCK_N, n_end, R_ROWS, BLOCK_N)
            b_idx_p = _row_ids(p_idx, n_start + (i + 2) * BLOCK_N, n_end, GP_ROWS, BLOCK_N)
        kp = rp_s.index(slot)
        s = _scores_issue(q_s0, q_s1, q_s2, q_s3, q_sp, k0, k1, k2, k3, kp, s_zero)
        s = warpgroup_mma_wait(0, deps=[s])  # one wait for the five score dots
        acc0, acc1, acc2, acc3, b_m, b_l2 = _softmax_pv(
            s, acc0, acc1, acc2, acc3, b_m, b_l2, k0, k1, k2, k3, p_smem, p_idx,
            n_start + i * BLOCK_N, n_end, n_rows, qk_scale, S_L, O_L, BLOCK_N, LAZY)

    async_copy.wait_group(0)  # (with no step run, the prologue's masked copies)
    _epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
              stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK, HAS_LSE,
              PARTIAL, S_L, O_L, BLOCK_H, LAT)


def launch(q, kv, indices, sm_scale, topk_length=None, attn_sink=None, out=None, lse=None,
           splits=None, lazy=False):
    """``q [T, H, 576]`` bf16, ``kv [N, 576]`` bf16 or ``[N, 656]`` uint8 (fp8_ds_mla),
    ``indices [T, K]`` int32, optional
    ``topk_length [T]`` int32 and ``attn_sink [H]`` fp32 -> ``out [T, H, 512]`` bf16 and, if
    given, ``lse [T, H]`` fp32. ``splits``: of the top-k axis, by default the library's rule
    for a tile of one program per SM (the combine kernel merges them). ``lazy``: rescale only
    when a head's max grew by more than 8 (``_softmax_pv``)."""
    from triton_sparse_mla import configs
    from triton_sparse_mla.kernels.attention import split_layout
    from triton_sparse_mla.kernels.combine import launch_combine

    t_count, h_count, _ = q.shape
    topk = indices.shape[1]
    out = torch.empty(t_count, h_count, 512, dtype=torch.bfloat16, device=q.device) if out is None else out
    if splits is None:
        splits = configs.choose_splits(t_count, triton.cdiv(h_count, BLOCK_H), topk, BLOCK_N,
                                       torch.cuda.get_device_properties(q.device).multi_processor_count, 1)
    split_size, splits = split_layout(topk, splits, BLOCK_N)
    grid = (t_count * triton.cdiv(h_count, BLOCK_H), splits)
    common = dict(q_ptr=q, kv_ptr=kv, idx_ptr=indices,
                  len_ptr=topk_length if topk_length is not None else indices,
                  sink_ptr=attn_sink if attn_sink is not None else q,
                  qk_scale=float(sm_scale) * math.log2(math.e), n_rows=kv.shape[0], n_heads=h_count,
                  topk=topk, split_size=split_size, stride_q_t=q.stride(0), stride_q_h=q.stride(1),
                  stride_kv=kv.stride(0), stride_idx_t=indices.stride(0),
                  HAS_LEN=topk_length is not None, HAS_SINK=attn_sink is not None,
                  BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, LAT=LAT, D_PE=D_PE, LAZY=lazy, num_warps=NUM_WARPS)
    if kv.dtype == torch.uint8:
        kernel = sparse_mla_gluon_fp8_kernel
    else:
        kernel, common["NS"] = sparse_mla_gluon_kernel, NS
    if splits == 1:
        kernel[grid](
            out_ptr=out, lse_ptr=lse if lse is not None else out, stride_o_t=out.stride(0),
            stride_o_h=out.stride(1), stride_o_s=0,
            stride_lse_t=lse.stride(0) if lse is not None else 0,
            stride_lse_h=lse.stride(1) if lse is not None else 0,
            HAS_LSE=lse is not None, PARTIAL=False, **common)
        return out
    part_o = torch.empty(t_count, splits, h_count, 512, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(t_count, h_count, splits, dtype=torch.float32, device=q.device)
    kernel[grid](
        out_ptr=part_o, lse_ptr=part_lse, stride_o_t=part_o.stride(0), stride_o_h=part_o.stride(2),
        stride_o_s=part_o.stride(1), stride_lse_t=part_lse.stride(0), stride_lse_h=part_lse.stride(1),
        HAS_LSE=True, PARTIAL=True, **common)
    launch_combine(part_o, part_lse, attn_sink, out, lse)
    return out


def compile_check(cap=90, partial=False, fp8=False, lazy=False):
    """Compile for ``sm{cap}`` without a GPU (final or partial outputs, bf16 or fp8_ds_mla
    rows); return (shared bytes, the compiled kernel)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = sparse_mla_gluon_fp8_kernel if fp8 else sparse_mla_gluon_kernel
    types = dict(q_ptr="*bf16", kv_ptr="*u8" if fp8 else "*bf16", idx_ptr="*i32", len_ptr="*i32",
                 sink_ptr="*fp32", out_ptr="*fp32" if partial else "*bf16", lse_ptr="*fp32",
                 qk_scale="fp32")
    consts = dict(HAS_LEN=True, HAS_SINK=not partial, HAS_LSE=True, PARTIAL=partial, BLOCK_H=BLOCK_H,
                  BLOCK_N=BLOCK_N, LAT=LAT, D_PE=D_PE, LAZY=lazy)
    if not fp8:
        consts["NS"] = NS
    signature = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in fn.arg_names}
    div = [n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride_")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
    src = GluonASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", cap, 32), options={"num_warps": NUM_WARPS})
    return k.metadata.shared, k


def _check(records, t, h, n, k, splits, lengths, sink, seed, fmt="bf16", lazy=False):
    """One problem against the float64 reference: output (relative norm error) and lse."""
    sys.path.insert(0, "tests")
    from problems import assert_close  # noqa: E402
    from triton_sparse_mla.reference import sparse_mla_reference

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(t, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = torch.randn(n, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    if fmt == "fp8_ds_mla":
        from triton_sparse_mla.formats import quantize_fp8_ds_mla
        kv = quantize_fp8_ds_mla(kv)
    idx = torch.randint(-1, n + 2, (t, k), device="cuda", dtype=torch.int32, generator=g)  # some invalid
    lens = (torch.randint(0, k + 1, (t,), device="cuda", dtype=torch.int32, generator=g)
            if lengths else None)
    snk = torch.randn(h, device="cuda", generator=g) if sink else None
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, 576 ** -0.5, topk_length=lens, attn_sink=snk)
    out = torch.empty(t, h, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(t, h, device="cuda", dtype=torch.float32)
    name = (f"{fmt} T={t} H={h} N={n} K={k} splits={splits} len={int(lengths)} sink={int(sink)}"
            f" lazy={int(lazy)}")
    err = float("nan")
    try:  # the library's own test criteria (tests/problems.py) and tolerances
        launch(q, kv, idx, 576 ** -0.5, lens, snk, out, lse, splits=splits, lazy=lazy)
        torch.cuda.synchronize()
        err = ((out.double().cpu() - ref_out).norm() / ref_out.norm().clamp_min(1e-30)).item()
        assert_close(out, lse, ref_out, ref_lse, rtol_norm=2e-2 if fmt == "bf16" else 3e-2)
        ok, why = True, "ok"
    except AssertionError as exc:
        ok, why = False, f"FAIL {exc}"
    except Exception as exc:  # noqa: BLE001 - a launch that fails (resources, compile) is a result
        ok, why = False, f"ERROR {type(exc).__name__}: {str(exc)[:300]}"
    print(f"GLUON check {name:48} out rel err {err:.2e} {why}", flush=True)
    records.append(dict(check=name, rel_err=err, ok=ok, why=why))
    return ok


def main_gpu(path):
    sys.path.insert(0, "benchmarks")
    from sweep import plan_call  # noqa: E402
    from triton_sparse_mla import configs
    from triton_sparse_mla.bench import Caches, Workload, make_inputs, time_us

    records = []
    cases = [(3, 64, 500, 64, 1, False, False), (5, 128, 3000, 256, 1, True, True),
             (5, 128, 3000, 256, 3, True, True), (2, 80, 700, 200, 2, False, True),
             (4, 64, 5000, 2048, 4, True, False)]
    passed = {(fmt, lazy): all([_check(records, *c, seed=i, fmt=fmt, lazy=lazy) for i, c in enumerate(cases)])
              for fmt in ("bf16", "fp8_ds_mla") for lazy in (False, True)}
    all_ok = all(passed.values())
    print(f"GLUON checks passed: {passed}", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    workloads = [Workload("decode", 32, 64, "bf16"), Workload("decode", 128, 64, "bf16"),
                 Workload("decode", 128, 128, "bf16"), Workload("decode", 512, 128, "bf16"),
                 Workload("decode", 128, 128, "bf16", lengths="random"),
                 Workload("prefill", 4096, 64, "bf16", n_rows=32768),
                 Workload("prefill", 4096, 128, "bf16", n_rows=32768),
                 Workload("prefill", 4096, 128, "bf16", n_rows=1 << 20),
                 Workload("decode", 128, 64, "fp8_ds_mla"), Workload("decode", 128, 128, "fp8_ds_mla"),
                 Workload("decode", 512, 128, "fp8_ds_mla")]
    for w in workloads:
        if not (passed[(w.fmt, False)] or passed[(w.fmt, True)]):
            continue  # nothing correct to time for this format
        q, kv, idx, lengths = make_inputs(w, caches)
        fp8 = w.fmt == "fp8_ds_mla"
        tile = configs.plan_launch("sm90", sms, 1, t_count=w.t, h_count=w.h, topk=2048, fp8=fp8).tile
        ref_out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
        _, fn = plan_call((q, kv, idx, lengths), ref_out, tile, 1, fp8, sms,
                          pin=configs.pin_fp8_conversion("sm90", tile.block_h))
        g_out = torch.empty_like(ref_out)
        times = {}
        runs = (("shipped", fn),
                ("gluon", lambda: launch(q, kv, idx, 576 ** -0.5, lengths, out=g_out)),
                ("lazy", lambda: launch(q, kv, idx, 576 ** -0.5, lengths, out=g_out, lazy=True)))
        runs = [(n, f) for n, f in runs if n == "shipped" or passed[(w.fmt, n == "lazy")]]
        for rep in range(2):
            for name, f in runs:
                try:
                    times[f"{name}{rep}"] = time_us(f)
                except Exception as exc:  # noqa: BLE001 - recorded, the other variants still run
                    times[f"{name}{rep}"] = float("nan")
                    print(f"GLUON {w.name} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        us_s, us_g, us_l = (min([t for t in (times.get(f"{n}0"), times.get(f"{n}1")) if t is not None and t == t],
                                default=float("nan")) for n in ("shipped", "gluon", "lazy"))
        # (g_out: the output of the last Gluon variant run)
        diff = ((g_out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
        rec = dict(workload=w.name, shipped_us=us_s, gluon_us=us_g, lazy_us=us_l, speedup=us_s / us_g,
                   speedup_lazy=us_s / us_l, rel_diff=diff, times=times)
        print(f"GLUON {w.name:40} shipped {us_s:9.1f} us  gluon {us_g:9.1f} us ({us_s / us_g:4.2f}x)  "
              f"lazy {us_l:9.1f} us ({us_s / us_l:4.2f}x)  diff={diff:.1e}", flush=True)
        records.append(rec)

    with open(path, "w") as f:
        json.dump(records, f, indent=1)
    return 0 if all_ok else 1


def main_small():
    """Two small problems per format (splits, lengths, sink, invalid ids): for
    compute-sanitizer's memcheck and racecheck, which check the copies' bounds and the
    barriers between the warpgroups' shared-memory accesses. Exits non-zero on a wrong result."""
    records = []
    ok = all([_check(records, 3, 128, 700, 200, splits, True, True, seed=splits, fmt=fmt, lazy=lazy)
              for fmt in ("bf16", "fp8_ds_mla") for splits, lazy in ((1, False), (2, True))])
    return 0 if ok else 1


if __name__ == "__main__":
    if "--small" in sys.argv:
        sys.exit(main_small())
    if "--compile" in sys.argv:
        for fp8 in (False, True):
            shared, _ = compile_check(fp8=fp8)
            print(f"sm90 {'fp8_ds_mla' if fp8 else 'bf16'}: {shared / 1024:.1f} KB shared memory")
    else:
        sys.exit(main_gpu(sys.argv[1]))
