"""The SM90 Gluon kernels' shared parts (Gluon: Triton's lower-level language), the 64-head
lockstep consumers and the producer warps that copy bf16/fp16 rows; and the choice of kernel
for a tile (:func:`tile_variant`) with its launch arguments (:func:`kernel_args`).

Every Gluon kernel runs the program of kernels/attention.py (one token x a head tile x one
split of its top-k, rows gathered once per program, the latent columns reused as V, online
softmax in base 2, partial outputs merged by kernels/combine.py), with what Triton's tiles
cannot say:

* producer warps (``gl.warp_specialize``) gather each step's rows into a 2-slot ring of
  asynchronous copies and hand each slot over through mbarriers (``ready``, ``free``); the
  consumers neither form addresses nor issue copies;
* the five QK dots are issued asynchronously on one accumulator and waited for once (Triton
  drains the tensor pipe after each: it makes only dots with a loop-carried accumulator
  asynchronous), and the four PV dots likewise;
* every accumulator is rescaled before the first PV dot is issued: ptxas serializes all wgmma
  (its remark C7515) when other instructions write an accumulator while a wgmma is in flight.

The kernels (``TileConfig.gluon``; sm90's tables): fp8_ds_mla rows, the producer also
dequantizing (kernels/gluon_fp8_producer.py: 64 heads with this module's lockstep consumers,
:func:`_ws_consumer`, each warpgroup half of the score tile's rows; 8-32 heads with
kernels/gluon_narrow.py's, heads along the wgmma's N); bf16/fp16 rows, 64 heads with two
consumer warpgroups on alternate tiles (kernels/gluon_pingpong.py), 8-16 heads with
gluon_narrow's consumers and this module's producer (kernels/gluon_narrow_plain.py).

Timed and removed (H200, 2026-12-01 to -03; BENCHMARKS.md "The Gluon tile", "The producer
warpgroup shipped", "The alternate-tile kernel shipped"): the first 64-head kernels without
producer warps (1.18-1.41x over the Triton tile on bf16 rows, 1.18-1.22x on fp8_ds_mla; the
producers then gave 1.05-1.07x and 1.22-1.25x more), the lockstep bf16 kernel with producer
warps (the alternate-tile kernel 1.03-1.22x over it, run 153), and the next tile's score dots
issued during this tile's softmax (0.75-0.82x, run 76). Their code: commit 44043de and
earlier. Also (2026-12-05): the few-head consumers freeing each ring slot in two halves for
the producer to refill sooner (``free_halves``, 0.88-0.99x under Triton 3.8, run 245; commit
580c519); and (H100, run 261) the few-head bf16 tile with two consumer warpgroups, each over
half of the latent columns, exchanging partial scores through shared memory (0.90x at 16 heads,
0.97x at 8 in prefill over 32K rows; commit 1b1d773).

Import only where this Triton has the Gluon calls used (:func:`kernels.attention.gluon_module`);
the kernels run only on SM90 GPUs, never under the interpreter
(:func:`kernels.attention.gluon_kernels`).
"""

import math

import torch

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .attention import triton_version

# The 64-head shape: 64 heads, 64 rows per step, 8 warps (two warpgroups), latent in four
# 128-column tiles, 64 rope columns, two ring slots (the few-head tile takes its BLOCK_H and
# warps from its TileConfig: tile_variant).
BLOCK_H, BLOCK_N, LAT, D_PE, NUM_WARPS, NS = 64, 64, 128, 64, 8, 2
# The 64-head kernels' loads of q (:func:`_q_values`): 16 bytes per thread ([BLOCK_H, LAT] and
# [BLOCK_H, D_PE] 16-bit values).
GATHER = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0]))
GATHER_PE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0]))
SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
FLAT = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
FLAT1 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
# Scores: each warpgroup computes half of the rows (columns of S). Output tiles: each
# warpgroup half of each tile's 128 columns.
S_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                             instr_shape=[16, BLOCK_N // 2, 16]))
O_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                             instr_shape=[16, LAT // 2, 16]))
LN2 = gl.constexpr(math.log(2.0))
# q's scale on its way to fp16 operands (fp8_ds_mla rows with F16): exact, and fp16 then holds
# a bf16 q up to |q| = 2^24, with bf16's precision down to 2^-6 (kernels.attention.operand_dtype).
Q_F16_SCALE = gl.constexpr(2.0 ** -8)
# A barrier of all the program's threads: gl.thread_barrier in Triton 3.6, gl.barrier in 3.8.
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# Whether Gluon's ``mbarrier.arrive(bar, count=1)`` always places a barrier of the partition's
# threads before its one thread's arrival: from Triton 3.8 on. Triton 3.6 and 3.7 place one only
# where their shared-memory analysis asks for it (this thread's stores since the last barrier).
# :func:`_arrive_all` adds its own barrier only where this is false, so each arrival that frees
# or fills a slot synchronizes its partition once.
# (tests/test_portability.py checks the PTX of the installed Triton for it.)
ARRIVE_SYNCS = gl.constexpr(triton_version() >= (3, 8))
# Gluon's asynchronous copy from global to shared memory: async_copy_global_to_shared in Triton
# 3.6, async_load from 3.8 on (3.8 keeps the old name as an alias, 3.9 as a stub that raises).
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# A shared-memory view read as other values, ``_reinterpret(view, dtype, shape, layout)``: the
# view's ``_reinterpret`` in Triton 3.6-3.8, ``reinterpret`` in 3.9.
_reinterpret = (getattr(gl.shared_memory_descriptor, "reinterpret", None)
                or gl.shared_memory_descriptor._reinterpret)
# Arguments not specialized on their value (a new variant for a value divisible by 16 or
# equal to 1), as kernels/attention.py: triton_sparse_mla.warmup relies on it.
_NOT_SPECIALIZED = ["n_rows", "stride_lse_t", "stride_lse_h"]


@gluon.jit
def _arrive_all(bar):
    """One arrival on ``bar`` (an mbarrier counting one) once every thread of the calling
    partition has got here: Gluon's arrive, after a barrier of the partition's threads where
    this Triton's arrive does not place one itself (:data:`ARRIVE_SYNCS`)."""
    if not ARRIVE_SYNCS:
        _barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _row_ids(idx_ptr, n0, n_end, LAYOUT: gl.constexpr, BLOCK_N: gl.constexpr):
    """Row ids ``idx[n0:n0 + BLOCK_N]`` in ``LAYOUT``, -1 past ``n_end``."""
    o_n = n0 + gl.arange(0, BLOCK_N, layout=LAYOUT)
    return gl.load(idx_ptr + o_n, mask=o_n < n_end, other=-1)


@gluon.jit
def _ring_rows(ring, slot, row0, ROWS: gl.constexpr):
    """Rows ``row0 : row0 + ROWS`` of ring slot ``slot`` (the whole slot when ROWS is its
    height)."""
    view = ring.index(slot)
    if ROWS != view.shape[0]:
        view = view.slice(row0, ROWS)
    return view


@gluon.jit
def _copy_rows(k_s0, k_s1, k_s2, k_s3, kp_s, kv_ptr, b_idx, b_idx2, n_rows, stride_kv, slot, row0,
               GATHER: gl.constexpr, GATHER_PE: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr):
    """The asynchronous copies of rows ``b_idx`` ([ROWS] ids) into rows ``row0 : row0 + ROWS``
    of ring slot ``slot`` of the latent tiles ``k_s0..3`` and the rope tile ``kp_s``; invalid
    row ids (-1 past the end) are zero-filled."""
    ROWS: gl.constexpr = b_idx.shape[0]
    m_n = (b_idx >= 0) & (b_idx < n_rows)
    p_row = kv_ptr + b_idx.to(gl.int64) * stride_kv
    o_c = gl.arange(0, LAT, layout=gl.SliceLayout(0, GATHER))
    # (one allocation per latent tile: copies into subviews of one allocation at a dynamic
    # index each get a barrier of their own, as the compiler cannot tell them apart)
    ptrs = p_row[:, None] + o_c[None, :]
    _async_load(_ring_rows(k_s0, slot, row0, ROWS), ptrs, mask=m_n[:, None])
    _async_load(_ring_rows(k_s1, slot, row0, ROWS), ptrs + LAT, mask=m_n[:, None])
    _async_load(_ring_rows(k_s2, slot, row0, ROWS), ptrs + 2 * LAT, mask=m_n[:, None])
    _async_load(_ring_rows(k_s3, slot, row0, ROWS), ptrs + 3 * LAT, mask=m_n[:, None])
    m_n2 = (b_idx2 >= 0) & (b_idx2 < n_rows)
    p_row2 = kv_ptr + b_idx2.to(gl.int64) * stride_kv + 4 * LAT
    o_p = gl.arange(0, D_PE, layout=gl.SliceLayout(0, GATHER_PE))
    _async_load(_ring_rows(kp_s, slot, row0, ROWS), p_row2[:, None] + o_p[None, :], mask=m_n2[:, None])


@gluon.jit
def _q_part(p_q, m_h, LAYOUT: gl.constexpr, WIDTH: gl.constexpr, TO_F16: gl.constexpr):
    """``q[heads, :WIDTH]`` from row pointers ``p_q`` (masked heads zero), in registers; with
    TO_F16 scaled by Q_F16_SCALE (exact) and rounded to fp16, else as loaded."""
    o_c = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, LAYOUT))
    b_q = gl.load(p_q[:, None] + o_c[None, :], mask=m_h[:, None], other=0.0)
    if TO_F16:
        b_q = q_to_f16(b_q)
    return b_q


@gluon.jit
def q_to_f16(b_q):
    """q's values ``b_q`` scaled by Q_F16_SCALE (exact) and rounded to fp16."""
    # The fence keeps the scale before the rounding: without it the compiler rounds to fp16
    # first (cvt.rn.f16x2.f32, then mul.f16x2) and a q past fp16's range becomes inf, as in
    # the Triton tiles (kernels/attention._to_operand).
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [b_q.to(gl.float32) * Q_F16_SCALE],
                                     dtype=gl.float32, is_pure=False, pack=1).to(gl.float16)


@gluon.jit
def _q_values(q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t, stride_qn_h, stride_qp_t,
              stride_qp_h, BLOCK_H: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
              F16: gl.constexpr, G: gl.constexpr = GATHER, G_PE: gl.constexpr = GATHER_PE):
    """q of this program's heads as the score dots' operands, in registers: four latent tiles
    [BLOCK_H, LAT] and the rope [BLOCK_H, D_PE], loaded in layouts ``G`` and ``G_PE`` (those
    of the warps that load them). With F16 (fp8_ds_mla rows into fp16 operands) the latent
    tiles become fp16 and the rope stays bf16 (the rows' rope is bf16), both scaled by
    Q_F16_SCALE."""
    o_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, G))
    p_q = q_nope_ptr + i_t * stride_qn_t + o_h * stride_qn_h
    m_h = o_h < n_heads
    b_q0 = _q_part(p_q, m_h, G, LAT, F16)
    b_q1 = _q_part(p_q + LAT, m_h, G, LAT, F16)
    b_q2 = _q_part(p_q + 2 * LAT, m_h, G, LAT, F16)
    b_q3 = _q_part(p_q + 3 * LAT, m_h, G, LAT, F16)
    o_h2 = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, G_PE))
    p_qp = q_pe_ptr + i_t * stride_qp_t + o_h2 * stride_qp_h
    b_qp = _q_part(p_qp, o_h2 < n_heads, G_PE, D_PE, False)
    if F16:
        b_qp = (b_qp.to(gl.float32) * Q_F16_SCALE).to(gl.bfloat16)
    return b_q0, b_q1, b_q2, b_q3, b_qp


@gluon.jit
def _load_q(q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t, stride_qn_h, stride_qp_t,
            stride_qp_h, BLOCK_H: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
            F16: gl.constexpr, G: gl.constexpr = GATHER, G_PE: gl.constexpr = GATHER_PE):
    """q of this program's heads (:func:`_q_values`) into shared memory, once."""
    b_q0, b_q1, b_q2, b_q3, b_qp = _q_values(q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                                             stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H, LAT,
                                             D_PE, F16, G, G_PE)
    return (gl.allocate_shared_memory(b_q0.dtype, [BLOCK_H, LAT], SMEM, b_q0),
            gl.allocate_shared_memory(b_q1.dtype, [BLOCK_H, LAT], SMEM, b_q1),
            gl.allocate_shared_memory(b_q2.dtype, [BLOCK_H, LAT], SMEM, b_q2),
            gl.allocate_shared_memory(b_q3.dtype, [BLOCK_H, LAT], SMEM, b_q3),
            gl.allocate_shared_memory(b_qp.dtype, [BLOCK_H, D_PE], SMEM, b_qp))


@gluon.jit
def _tile_origin(n_heads, BLOCK_H: gl.constexpr):
    """``(i_t, h0)``: this program's token and first head (head tiles fastest, as
    kernels/attention.py orders them)."""
    n_h_tiles = gl.cdiv(n_heads, BLOCK_H)
    return (gl.program_id(0) // n_h_tiles).to(gl.int64), (gl.program_id(0) % n_h_tiles) * BLOCK_H


@gluon.jit
def _latent_ring(dtype: gl.constexpr, rope_dtype: gl.constexpr, BLOCK_N: gl.constexpr,
                 LAT: gl.constexpr, D_PE: gl.constexpr, NS: gl.constexpr):
    """An NS-slot ring of gathered rows: four latent tiles [NS, BLOCK_N, LAT] of ``dtype`` and
    the rope tile [NS, BLOCK_N, D_PE] of ``rope_dtype``, in the 128-byte-swizzled layout."""
    k_s0 = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, LAT], SMEM)
    k_s1 = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, LAT], SMEM)
    k_s2 = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, LAT], SMEM)
    k_s3 = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, LAT], SMEM)
    kp_smem = gl.allocate_shared_memory(rope_dtype, [NS, BLOCK_N, D_PE], SMEM)
    return k_s0, k_s1, k_s2, k_s3, kp_smem


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
def _scores(q_s0, q_s1, q_s2, q_s3, q_sp, k0, k1, k2, k3, kp, s_zero):
    """Issue the five score dots (latent tiles and rope, shared memory) asynchronously on one
    accumulator; the caller waits for them once."""
    s = warpgroup_mma(q_s0, k0.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(q_s1, k1.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(q_s2, k2.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(q_s3, k3.permute((1, 0)), s, is_async=True)
    return warpgroup_mma(q_sp, kp.permute((1, 0)), s, is_async=True)


@gluon.jit
def _rescale(s, acc0, acc1, acc2, acc3, b_m, b_l2, p_idx, n0, n_end, n_rows, qk_scale,
             BLOCK_N: gl.constexpr):
    """The softmax's first half: scores masked and scaled, the running max moved, the
    denominator and every accumulator rescaled (before any PV dot is issued: module
    docstring, C7515). Returns the scaled scores and the state."""
    b_idx = _row_ids(p_idx, n0, n_end, gl.SliceLayout(0, S_L), BLOCK_N)
    m_n = (b_idx >= 0) & (b_idx < n_rows)
    s = gl.where(m_n[None, :], s * qk_scale, float("-inf"))
    b_m_new = gl.maximum(b_m, gl.max(s, axis=1))
    alpha = gl.exp2(b_m - b_m_new)
    b_l2 = b_l2 * alpha[:, None]
    a_o = gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
    acc0 = acc0 * a_o
    acc1 = acc1 * a_o
    acc2 = acc2 * a_o
    acc3 = acc3 * a_o
    return s, acc0, acc1, acc2, acc3, b_m_new, b_l2


@gluon.jit
def _probs_pv(s, acc0, acc1, acc2, acc3, b_m, b_l2, k0, k1, k2, k3, p_smem):
    """The softmax's second half and the PV dots: probabilities from the scaled scores, the
    denominator, P through shared memory into registers, the four PV dots, and their wait."""
    p = gl.exp2(s - b_m[:, None])
    b_l2 = b_l2 + p
    p_smem.store(p.to(p_smem.dtype))
    _barrier()  # both halves of P are in place (read back into registers below)
    p_op = p_smem.load(gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2))
    acc0 = warpgroup_mma(p_op, k0, acc0, is_async=True)
    acc1 = warpgroup_mma(p_op, k1, acc1, is_async=True)
    acc2 = warpgroup_mma(p_op, k2, acc2, is_async=True)
    acc3 = warpgroup_mma(p_op, k3, acc3, is_async=True)
    # One wait for the four PV dots, inside the step: a wgmma still in flight while the next step defines its
    # score accumulator would make ptxas serialize every wgmma.
    acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=[acc0, acc1, acc2, acc3])
    return acc0, acc1, acc2, acc3, b_m, b_l2


@gluon.jit
def _lse_and_scale(b_m, b_l, sink_ptr, lse_ptr, i_t, i_s, h0, n_heads, stride_lse_t, stride_lse_h,
                   HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr, WRITES_LSE: gl.constexpr,
                   BLOCK_H: gl.constexpr):
    """From the final max and denominator of this program's heads (base 2, in ``b_m``'s
    layout): the factor each head's output is scaled by (1/l, times the sink's share in the
    final output), and where WRITES_LSE the lse stored (natural log; with PARTIAL the partial
    base-2 lse for kernels/combine.py)."""
    # (empty: l == 0, so that a NaN l, from a row past fp16's range, gives NaN and not -inf)
    m_empty = b_l == 0.0
    b_inv_l = 1.0 / gl.where(m_empty, 1.0, b_l)
    b_lse2 = gl.where(m_empty, float("-inf"), b_m + gl.log2(gl.where(m_empty, 1.0, b_l)))
    o_hs = h0 + gl.arange(0, BLOCK_H, layout=b_m.type.layout)
    m_hs = o_hs < n_heads
    if PARTIAL:
        if WRITES_LSE:
            gl.store(lse_ptr + i_t * stride_lse_t + o_hs * stride_lse_h + i_s, b_lse2, mask=m_hs)
    else:
        if HAS_SINK:  # kernels/common.sink_factor, which Gluon code cannot call
            b_lse = b_lse2 * LN2
            b_sink = gl.load(sink_ptr + o_hs, mask=m_hs, other=0.0)
            b_inv_l = b_inv_l * gl.where(b_lse2 == float("-inf"), 0.0, 1.0 / (1.0 + gl.exp(b_sink - b_lse)))
        if WRITES_LSE:
            if lse_ptr is not None:
                gl.store(lse_ptr + i_t * stride_lse_t + o_hs * stride_lse_h, b_lse2 * LN2, mask=m_hs)
    return b_inv_l


@gluon.jit
def _epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
              stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK: gl.constexpr,
              PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr, LAT: gl.constexpr):
    """The final output, lse and sink, or with PARTIAL the partial output and base-2 lse
    (kernels/attention.py's conventions, which kernels/combine.py reads)."""
    b_inv_l = _lse_and_scale(b_m, gl.sum(b_l2, axis=1), sink_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                             stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL, True, BLOCK_H)
    inv_l = gl.convert_layout(b_inv_l, gl.SliceLayout(1, O_L))[:, None]
    o_ho = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_L))
    o_co = gl.arange(0, LAT, layout=gl.SliceLayout(0, O_L))
    p_o = out_ptr + i_t * stride_o_t + i_s * stride_o_s + o_ho[:, None] * stride_o_h + o_co[None, :]
    m_o = (o_ho < n_heads)[:, None]
    gl.store(p_o, (acc0 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + LAT, (acc1 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + 2 * LAT, (acc2 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + 3 * LAT, (acc3 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)


# The producer warps for bf16/fp16 rows (:func:`_ws_producer`; the few-head kernel,
# kernels/gluon_narrow_plain.py): one warpgroup (setmaxnreg works per warpgroup; with one
# warp, Triton pads it to four and the register split no longer adds up), 24 registers per
# thread. A tile is copied in passes of 8 rows, 16 threads per row, so that each copy
# instruction of a warp reads two whole 256-byte row segments (the rope: 128-byte segments,
# 8-byte copies); a thread's 8 row ids (one per pass) are loaded a step ahead. Measured when it
# fed the 64-head lockstep consumers (H200, 2026-12-01, runs 73-75): with the 8 ids loaded
# before each pass, 0.68-0.73x of the kernel without a producer; with one row per two threads
# and 32-byte segments per row and copy, 0.97x over a 32K-row cache and 0.48-0.53x over 1M rows
# (a row read in 36 separate 32-byte pieces costs DRAM more, we infer, than in 5 whole
# segments); as here, 1.05-1.07x. With ``TileConfig.wide_producer`` it has 8 warps (passes of
# 16 rows): 1.02-1.04x there (run 87), not shipped with the few-head consumers.
PRODUCER_REGS = gl.constexpr(24)
GATHER_W4 = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))
ROPE_W4 = gl.constexpr(gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0]))
GATHER_W8 = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0]))
ROPE_W8 = gl.constexpr(gl.BlockedLayout([1, 4], [2, 16], [8, 1], [1, 0]))


@gluon.jit
def _pass_ids(p_idx, n0, n_end, PASS_ROWS: gl.constexpr, PASSES: gl.constexpr,
              GATHER: gl.constexpr):
    """A step's row ids as the producer copies them: ``[PASS_ROWS, PASSES]`` in GATHER,
    entry ``(r, j)`` the id of row ``j * PASS_ROWS + r`` of the tile, -1 past ``n_end``; each
    thread holds its row's ids of every pass."""
    o_r = gl.arange(0, PASS_ROWS, layout=gl.SliceLayout(1, GATHER))
    o_j = gl.arange(0, PASSES, layout=gl.SliceLayout(0, GATHER))
    o_n = n0 + o_j[None, :] * PASS_ROWS + o_r[:, None]
    return gl.load(p_idx + o_n, mask=o_n < n_end, other=-1)


@gluon.jit
def _pass_row(ids, j: gl.constexpr):
    """Pass ``j``'s row ids, ``[PASS_ROWS]`` in the row slice of ``ids``'s layout, from
    :func:`_pass_ids`'s ``[PASS_ROWS, PASSES]``: a register of each thread (no data crosses
    threads)."""
    o_j = gl.arange(0, ids.shape[1], layout=gl.SliceLayout(0, ids.type.layout))
    return gl.sum(gl.where(o_j[None, :] == j, ids, 0), axis=1)


@gluon.jit
def _ws_producer(kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2, k_s3,
                 kp_smem, ready, free, BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
                 NS: gl.constexpr, PW: gl.constexpr):
    """The ``PW`` producer warps: for each step, once the consumers freed its ring slot, the
    asynchronous copies of the tile, ``2 * PW`` rows per pass, and an arrival on the slot's
    ``ready`` barrier that lands when this thread's copies have; then the next step's ids."""
    GATHER: gl.constexpr = GATHER_W8 if PW == 8 else GATHER_W4
    ROPE: gl.constexpr = ROPE_W8 if PW == 8 else ROPE_W4
    PASS_ROWS: gl.constexpr = 2 * PW
    PASSES: gl.constexpr = BLOCK_N // PASS_ROWS
    ids = _pass_ids(p_idx, n_start, n_end, PASS_ROWS, PASSES, GATHER)
    for i in range(n_steps):
        slot = i % NS
        # the slot's previous tile (step i - NS) has been read; the first NS steps pass at once
        mbarrier.wait(free.index(slot), ((i // NS) & 1) ^ 1)
        for j in gl.static_range(PASSES):
            b_idx = _pass_row(ids, j)
            b_idx_pe = gl.convert_layout(b_idx, gl.SliceLayout(1, ROPE), assert_trivial=True)
            _copy_rows(k_s0, k_s1, k_s2, k_s3, kp_smem, kv_ptr, b_idx, b_idx_pe, n_rows, stride_kv,
                       slot, j * PASS_ROWS, GATHER, ROPE, LAT, D_PE)
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
        ids = _pass_ids(p_idx, n_start + (i + 1) * BLOCK_N, n_end, PASS_ROWS, PASSES, GATHER)


@gluon.jit
def _ws_consumer(q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_smem, p_smem, ready, free,
                 p_idx, n_start, n_end, n_steps, n_rows, qk_scale, BLOCK_H: gl.constexpr,
                 BLOCK_N: gl.constexpr, LAT: gl.constexpr, NS: gl.constexpr):
    """The two consumer warpgroups of the 64-head producer kernel (kernels/gluon_fp8_producer.py),
    in lockstep: each step waits for its slot's rows (``ready``), issues the five score dots
    and waits for them once, runs the online softmax (each warpgroup half of the score
    tile's rows; P through ``p_smem``) and the four PV dots, then frees the slot (``free``).
    Returns the four output accumulators, the running max and the per-entry denominators."""
    b_m, b_l2, acc0, acc1, acc2, acc3 = _init_state(BLOCK_H, BLOCK_N, LAT)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L)
    for i in range(n_steps):
        slot = i % NS
        s = _ws_scores(q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_smem, ready, i, s_zero, NS)
        s = warpgroup_mma_wait(0, deps=[s])  # one wait for the five score dots
        s, acc0, acc1, acc2, acc3, b_m, b_l2 = _rescale(s, acc0, acc1, acc2, acc3, b_m, b_l2, p_idx,
                                                        n_start + i * BLOCK_N, n_end, n_rows, qk_scale,
                                                        BLOCK_N)
        acc0, acc1, acc2, acc3, b_m, b_l2 = _probs_pv(s, acc0, acc1, acc2, acc3, b_m, b_l2,
                                                      k_s0.index(slot), k_s1.index(slot),
                                                      k_s2.index(slot), k_s3.index(slot), p_smem)
        # every consumer warp has waited for its PV dots (which read the slot) and loaded P
        # (which the next step overwrites): then one arrival frees the slot
        _arrive_all(free.index(slot))
    return acc0, acc1, acc2, acc3, b_m, b_l2


@gluon.jit
def _ws_scores(q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_smem, ready, i, s_zero,
               NS: gl.constexpr):
    """Step ``i``'s score dots, issued once its slot's rows have landed. (A function of its
    own: inlined into :func:`_ws_consumer` with the slot's views taken once, the compiled
    kernel differs from the one timed.)"""
    slot = i % NS
    mbarrier.wait(ready.index(slot), (i // NS) & 1)
    fence_async_shared()  # the copies (generic proxy) before the wgmma's reads (async proxy)
    return _scores(q_s0, q_s1, q_s2, q_s3, q_sp, k_s0.index(slot), k_s1.index(slot), k_s2.index(slot),
                   k_s3.index(slot), kp_smem.index(slot), s_zero)


def tile_variant(tile, fp8: bool):
    """``(kernel, constexprs, num_warps)`` that a ``TileConfig`` with ``gluon`` selects for a
    row format: over fp8_ds_mla rows the kernel whose producer warps dequantize
    (kernels/gluon_fp8_producer.py; its consumers for fewer than 64 heads are
    kernels/gluon_narrow.py's), over bf16/fp16 rows for fewer than 64 heads the few-head
    kernel (kernels/gluon_narrow_plain.py), for 64 the alternate-tile kernel
    (kernels/gluon_pingpong.py, ``pingpong``); the constexprs that depend on the tile's fields,
    and the warps it is launched with. The launcher and portability's compile check both take
    them from here."""
    pw = 8 if tile.wide_producer else 4
    if fp8 and tile.fp8_regs:
        from . import gluon_fp8_regs

        return (gluon_fp8_regs.sparse_mla_gluon_fp8_regs_kernel,
                dict(NS=gluon_fp8_regs.NS.value, PW=pw, BLOCK_H=tile.block_h), tile.num_warps)
    if fp8:
        from . import gluon_fp8_producer

        return (gluon_fp8_producer.sparse_mla_gluon_fp8_ws_kernel,
                dict(F16=tile.fp8_f16, NS=NS, PW=pw, BLOCK_H=tile.block_h), tile.num_warps)
    if tile.block_h < 64:
        from . import gluon_narrow_plain

        return (gluon_narrow_plain.sparse_mla_gluon_narrow_kernel, dict(NS=NS, PW=pw, BLOCK_H=tile.block_h),
                tile.num_warps)
    if not tile.pingpong:
        raise ValueError("pingpong: over bf16/fp16 rows the 64-head Gluon tile is the "
                         "alternate-tile kernel; set pingpong")
    from . import gluon_pingpong

    return (gluon_pingpong.sparse_mla_gluon_pp_kernel,
            dict(PW=gluon_pingpong.PW, CONSUMER_REGS=gluon_pingpong.CONSUMER_REGS),
            gluon_pingpong.PW)  # (the producer's warps)


def launch_options(tile, fp8: bool) -> dict:
    """Compile options beyond the warps that ``tile``'s Gluon kernel is launched with (the
    launcher and portability's compile check both take them from here)."""
    if fp8 and tile.fp8_regs:
        from . import gluon_fp8_regs

        return dict(maxnreg=gluon_fp8_regs.LAUNCH_MAXNREG)
    return {}


def _aligned16(x):
    """``x``, or a copy of it with standard strides where its start (bytes) or a stride other
    than the last (elements) is not a multiple of 16: Triton copies rows 16 bytes at a time
    only where its specialization of the arguments proves them 16-byte aligned, and does not
    compile narrower asynchronous copies of 2-byte elements. (A size-1 dimension can carry
    any stride.)"""
    if x.data_ptr() % 16 == 0 and all(s % 16 == 0 for s in x.stride()[:-1]):
        return x
    return torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)


def kernel_args(q_nope, q_pe, kv, indices, topk_length, attn_sink, sm_scale, split_size, fp8, tile):
    """``(kernel, arguments)`` of a launch of ``tile`` (a ``TileConfig`` with ``gluon``; see
    ``tile_variant``), less the output's pointers and strides (the launcher adds them for the
    final or the partial output). Shapes as ``kernels.attention.launch_sparse_mla_fwd``;
    ``q_pe`` is required."""
    kernel, constexprs, num_warps = tile_variant(tile, fp8)
    if tile.pingpong:  # (its producer copies q with 16-byte asynchronous copies)
        q_nope, q_pe = _aligned16(q_nope), _aligned16(q_pe)
    f16 = fp8 and (tile.fp8_f16 or tile.fp8_regs)  # (q scaled by Q_F16_SCALE)
    args = dict(
        q_nope_ptr=q_nope, q_pe_ptr=q_pe, kv_ptr=kv, idx_ptr=indices,
        len_ptr=topk_length, sink_ptr=attn_sink,
        qk_scale=float(sm_scale) * math.log2(math.e) / (Q_F16_SCALE.value if f16 else 1.0),
        n_rows=kv.shape[0], n_heads=q_nope.shape[1],
        topk=indices.shape[1], split_size=split_size,
        stride_qn_t=q_nope.stride(0), stride_qn_h=q_nope.stride(1),
        stride_qp_t=q_pe.stride(0), stride_qp_h=q_pe.stride(1),
        stride_kv=kv.stride(0), stride_idx_t=indices.stride(0),
        HAS_LEN=topk_length is not None, HAS_SINK=attn_sink is not None,
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, LAT=LAT, D_PE=D_PE, num_warps=num_warps)
    return kernel, dict(args, **constexprs, **launch_options(tile, fp8))

