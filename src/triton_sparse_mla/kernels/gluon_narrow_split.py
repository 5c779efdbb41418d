"""EXPERIMENT (forty-fifth session): sm90's few-head tile over bf16/fp16 rows with two
consumer warpgroups, each owning half of the latent columns (selected by the environment
variable ``TSM_SPLIT_COLS=1``; kernels/gluon_sm90.tile_variant).

kernels/gluon_narrow_plain.py's one consumer warpgroup walks each 64-row step as a chain:
36 score dots, the softmax, P^T, 32 PV dots, all of N = BLOCK_H. At 16 heads that chain (about
1.50 us a step in prefill over 32K rows) is longer than the producer's floor (one tile's fill,
about 1.38 us; performance-plan, thirty-fifth session), and removing half of the score dots
brought the step down to the floor. Here warpgroup A computes the score dots over latent
columns 0-255 and warpgroup B those over 256-511 and the rope; each stores its partial scores
(fp32, [BLOCK_N, BLOCK_H]) into shared memory, reads the other's and adds them (the same sum in
both: fp32 addition commutes), runs the same softmax, stores its own P^T and computes the PV
dots of its own 256 output columns. Each warpgroup's chain holds half the dots plus one
exchange of 4 KB each way (at 16 heads). The step's shared-memory traffic grows by the
exchange and the second P^T (about 20 KB over 246). Warpgroup B writes its own columns of the
output; warpgroup A the lse.

Shared memory at 16 heads: q 18 KB, two 72 KB slots, two P^T of 2 KB, the exchange 16 KB
(double-buffered, one per warpgroup): about 183 KB.
"""

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from . import gluon_narrow
from .gluon_sm90 import (FLAT, GATHER_W4, ROPE_W4, _NOT_SPECIALIZED, _arrive_all, _barrier,
                         _latent_ring, _lse_and_scale, _q_part, _row_ids, _split_range, _tile_origin,
                         _ws_producer)

# Read by gluon_sm90.tile_variant: the experiment replaces the few-head bf16/fp16 kernel.
ENABLED = os.environ.get("TSM_SPLIT_COLS", "0") == "1"
PRODUCER_REGS = gl.constexpr(128)
CONSUMER_REGS = gl.constexpr(192)


@gluon.jit
def _half_q(q_nope_ptr, q_pe_ptr, q_sa, q_sb, q_sp, i_t, h0, n_heads, stride_qn_t, stride_qn_h,
            stride_qp_t, stride_qp_h, COL0: gl.constexpr, HAS_ROPE: gl.constexpr,
            BLOCK_H: gl.constexpr, LAT: gl.constexpr):
    """This warpgroup's q: latent columns COL0 .. COL0 + 2 LAT into ``q_sa``, ``q_sb``, and
    with HAS_ROPE the rope into ``q_sp``."""
    o_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, GATHER_W4))
    p_q = q_nope_ptr + i_t * stride_qn_t + o_h * stride_qn_h + COL0
    m_h = o_h < n_heads
    q_sa.store(_q_part(p_q, m_h, GATHER_W4, LAT, False))
    q_sb.store(_q_part(p_q + LAT, m_h, GATHER_W4, LAT, False))
    if HAS_ROPE:
        o_h2 = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ROPE_W4))
        p_qp = q_pe_ptr + i_t * stride_qp_t + o_h2 * stride_qp_h
        q_sp.store(_q_part(p_qp, o_h2 < n_heads, ROPE_W4, q_sp.shape[1], False))
    fence_async_shared()  # q's stores (generic proxy) before the wgmma's reads
    _barrier()  # every thread's part


@gluon.jit
def _half_consumer(q_sa, q_sb, q_sp, k_sa, k_sb, kp_smem, p_smem, x_smem, xbar, ready, free,
                   p_idx, n_start, n_end, n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t, h0,
                   n_heads, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, WG: gl.constexpr,
                   BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr,
                   NS: gl.constexpr):
    """Consumer warpgroup ``WG`` (0: latent columns 0-255; 1: 256-511 and the rope). Returns
    its two output accumulators [LAT, BLOCK_H] (fp32), the running max [BLOCK_H] (base 2) and
    the per-entry denominators [BLOCK_N, BLOCK_H], equal in both warpgroups."""
    _half_q(q_nope_ptr, q_pe_ptr, q_sa, q_sb, q_sp, i_t, h0, n_heads, stride_qn_t, stride_qn_h,
            stride_qp_t, stride_qp_h, WG * 2 * LAT, WG == 1, BLOCK_H, LAT)
    T_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    b_m = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(0, T_L))
    b_l2 = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    acc_a = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    acc_b = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    for i in range(n_steps):
        slot = i % NS
        buf = i % 2
        b_idx = _row_ids(p_idx, n_start + i * BLOCK_N, n_end, gl.SliceLayout(1, T_L), BLOCK_N)
        mbarrier.wait(ready.index(slot), (i // NS) & 1)
        fence_async_shared()  # the producer's copies before the wgmma's reads
        ka = k_sa.index(slot)
        kb = k_sb.index(slot)
        s = warpgroup_mma(ka, q_sa.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(kb, q_sb.permute((1, 0)), s, is_async=True)
        if WG == 1:
            s = warpgroup_mma(kp_smem.index(slot), q_sp.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        # the partial scores to the other warpgroup, and its partial added
        x_smem.index(2 * WG + buf).store(s)
        _arrive_all(xbar.index(2 * WG + buf))
        mbarrier.wait(xbar.index(2 * (1 - WG) + buf), (i // 2) & 1)
        s = s + x_smem.index(2 * (1 - WG) + buf).load(T_L)
        m_n = (b_idx >= 0) & (b_idx < n_rows)
        s = gl.where(m_n[:, None], s * qk_scale, float("-inf"))
        b_m_new = gl.maximum(b_m, gl.max(s, axis=0))
        alpha = gl.exp2(b_m - b_m_new)[None, :]
        b_m = b_m_new
        p = gl.exp2(s - b_m[None, :])
        b_l2 = b_l2 * alpha + p
        acc_a = acc_a * alpha
        acc_b = acc_b * alpha
        p_smem.store(p.to(p_smem.dtype))
        fence_async_shared()  # this thread's part of P^T, for the wgmma
        _barrier()  # every thread's part
        acc_a = warpgroup_mma(ka.permute((1, 0)), p_smem, acc_a, is_async=True)
        acc_b = warpgroup_mma(kb.permute((1, 0)), p_smem, acc_b, is_async=True)
        acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b])
        _arrive_all(free.index(slot))  # (the free barrier counts both warpgroups)
    return acc_a, acc_b, b_m, b_l2


@gluon.jit
def _half_epilogue(acc_a, acc_b, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                   stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                   COL0: gl.constexpr, WRITES_LSE: gl.constexpr, HAS_SINK: gl.constexpr,
                   PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr, LAT: gl.constexpr):
    """gluon_narrow.narrow_epilogue for one warpgroup's two accumulators (output columns COL0
    .. COL0 + 2 LAT), the lse written where WRITES_LSE."""
    T_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    b_inv_l = _lse_and_scale(b_m, gl.sum(b_l2, axis=0), sink_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                             stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL, WRITES_LSE, BLOCK_H)
    inv_l = b_inv_l[None, :]
    o_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, T_L))
    o_c = gl.arange(0, LAT, layout=gl.SliceLayout(1, T_L))
    p_o = out_ptr + i_t * stride_o_t + i_s * stride_o_s + o_h[None, :] * stride_o_h + o_c[:, None] + COL0
    m_o = (o_h < n_heads)[None, :]
    gl.store(p_o, (acc_a * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + LAT, (acc_b * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)


@gluon.jit
def _consumer_b(q_sa, q_sb, q_sp, k_sa, k_sb, kp_smem, p_smem, x_smem, xbar, ready, free, p_idx,
                n_start, n_end, n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t, i_s, h0, n_heads,
                stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, sink_ptr, out_ptr, lse_ptr,
                stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr,
                BLOCK_N: gl.constexpr, LAT: gl.constexpr, NS: gl.constexpr):
    """Warpgroup B (a worker partition): its steps, then its columns of the output."""
    acc_a, acc_b, b_m, b_l2 = _half_consumer(
        q_sa, q_sb, q_sp, k_sa, k_sb, kp_smem, p_smem, x_smem, xbar, ready, free, p_idx, n_start,
        n_end, n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
        stride_qn_h, stride_qp_t, stride_qp_h, 1, BLOCK_H, BLOCK_N, LAT, NS)
    _half_epilogue(acc_a, acc_b, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                   stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, 2 * LAT, False,
                   HAS_SINK, PARTIAL, BLOCK_H, LAT)


@gluon.jit(do_not_specialize=_NOT_SPECIALIZED)
def sparse_mla_gluon_narrow_split_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
    qk_scale, n_rows, n_heads, topk, split_size,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_kv, stride_idx_t,
    stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
    HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
    NS: gl.constexpr, PW: gl.constexpr,
):
    """gluon_narrow_plain.sparse_mla_gluon_narrow_kernel with two consumer warpgroups, each over
    half of the latent columns (the module's docstring); the same arguments."""
    i_t, h0 = _tile_origin(n_heads, BLOCK_H)
    dt: gl.constexpr = kv_ptr.dtype.element_ty
    q_s0, q_s1, q_s2, q_s3, q_sp = gluon_narrow.narrow_q_tiles(dt, dt, BLOCK_H, LAT, D_PE)
    k_s0, k_s1, k_s2, k_s3, kp_smem = _latent_ring(dt, dt, BLOCK_N, LAT, D_PE, NS)
    p_a = gluon_narrow.narrow_p_tile(dt, BLOCK_N, BLOCK_H)
    p_b = gluon_narrow.narrow_p_tile(dt, BLOCK_N, BLOCK_H)
    x_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_N, BLOCK_H], FLAT)
    xbar = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS):
        mbarrier.init(ready.index(j), count=32 * PW)
        mbarrier.init(free.index(j), count=2)
    for j in gl.static_range(4):
        mbarrier.init(xbar.index(j), count=1)
    fence_async_shared()
    _barrier()

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    acc_a, acc_b, b_m, b_l2 = gl.warp_specialize(
        [(_half_consumer, (q_s0, q_s1, q_sp, k_s0, k_s1, kp_smem, p_a, x_smem, xbar, ready, free,
                           p_idx, n_start, n_end, n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr,
                           i_t, h0, n_heads, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, 0,
                           BLOCK_H, BLOCK_N, LAT, NS)),
         (_ws_producer, (kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2,
                         k_s3, kp_smem, ready, free, BLOCK_N, LAT, D_PE, NS, PW)),
         (_consumer_b, (q_s2, q_s3, q_sp, k_s2, k_s3, kp_smem, p_b, x_smem, xbar, ready, free, p_idx,
                        n_start, n_end, n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t, i_s, h0,
                        n_heads, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, sink_ptr,
                        out_ptr, lse_ptr, stride_o_t, stride_o_h, stride_o_s, stride_lse_t,
                        stride_lse_h, HAS_SINK, PARTIAL, BLOCK_H, BLOCK_N, LAT, NS))],
        [PW, 4], [PRODUCER_REGS, CONSUMER_REGS])
    _half_epilogue(acc_a, acc_b, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                   stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, 0, True,
                   HAS_SINK, PARTIAL, BLOCK_H, LAT)
