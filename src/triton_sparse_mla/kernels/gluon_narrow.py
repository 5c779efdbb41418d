"""The consumers of sm90's Gluon tile for few heads (8, 16 or 32) over fp8_ds_mla rows (and,
in kernels/gluon_narrow_plain.py, 8 or 16 over bf16/fp16 rows): the products computed
transposed, rows along the wgmma's M and heads along its N.

A wgmma's M is 64 rows of one warpgroup; 16 heads would fill a quarter of it. Transposed,
the 64 gathered rows of a step fill M and the heads are N (8 to 256 in steps of 8):

* scores: ``S^T [BLOCK_N, BLOCK_H] = K [BLOCK_N, 576] . q^T``: A is the row tile as the
  producer leaves it (K-major), B is q's tile, resident (K-major);
* output: ``O^T [512, BLOCK_H] += V^T [512, BLOCK_N] . P^T``: A is the same row tile read
  transposed (M-major, which wgmma allows for 16-bit operands), B is P^T, stored by the
  consumers into 2 KB of shared memory each step.

The softmax runs along M: a head's max and sum over a step's rows cross the warpgroup's four
warps (the compiler's reduction through shared memory). The denominator is kept per score
entry and summed once at the end, as in the 64-head kernel.

Tensor work per 64-row step at 16 heads: 36 + 32 wgmma of N=16 (about 2.2 MFLOP), whose A
operands (138 KB) are the step's shared-memory traffic with the producer's conversion (74 KB
written, 37 KB read). Per SM the step's rows are 42 KB of fp8_ds_mla from memory. The
producer (kernels/gluon_fp8_producer.py's) gathers and dequantizes; the consumers are one
warpgroup. Shared memory: q 18 KB (16 heads; 36 KB at 32), two 72 KB slots, P^T, scales:
166 KB (187 KB), one program per SM.

On the H200 (2026-12-02, runs 101-110; BENCHMARKS.md "Few heads along N"): decode T=128 over
a 1M-row cache 79-80 us at 8 and 16 heads (52-53% of copy) against 113-117 us for the Triton
tiles before and 112 us for FlashMLA's fp8 kernel; 87 us at 32 heads against 165. Probes put
the step at 2.5 us where the copies alone take 1.95 us and the consumers alone 1.4 us: the
consumers and the conversion slow each other while they overlap, shared memory the busiest
unit (71%). With the conversion's stores made conflict-free (gluon_fp8_producer.RAW_SWAP,
run 110): 71.5-72.3 us at T=128, 1.06-1.11x, about 58-59% of copy. With q loaded by the
consumers (run 181) 69.9 us at 8 heads; with N = 8 for up to 8 heads (configs._N8: no padding
heads in the B operands, the softmax and the accumulators) 66.8 us (run 184).

Import only where Gluon is available and not under the interpreter (as gluon_sm90).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_sm90 import GATHER_W4, ROPE_W4, SMEM, _arrive_all, _barrier, _lse_and_scale, _q_values, _row_ids


@gluon.jit
def narrow_p_tile(dtype: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr):
    """P^T's shared memory: [BLOCK_N, BLOCK_H] of ``dtype`` (16-bit), heads contiguous."""
    return gl.allocate_shared_memory(
        dtype, [BLOCK_N, BLOCK_H],
        gl.NVMMASharedLayout(swizzle_byte_width=2 * BLOCK_H if BLOCK_H >= 16 else 0, element_bitwidth=16,
                             rank=2))


@gluon.jit
def narrow_q_tiles(dtype: gl.constexpr, rope_dtype: gl.constexpr, BLOCK_H: gl.constexpr,
                   LAT: gl.constexpr, D_PE: gl.constexpr):
    """q's shared memory, empty (:func:`narrow_consumer` stores q into it): four latent tiles
    [BLOCK_H, LAT] of ``dtype`` and the rope [BLOCK_H, D_PE] of ``rope_dtype``."""
    return (gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM),
            gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM),
            gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM),
            gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM),
            gl.allocate_shared_memory(rope_dtype, [BLOCK_H, D_PE], SMEM))


@gluon.jit
def narrow_consumer(q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_smem, p_smem, ready,
                    free, p_idx, n_start, n_end, n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t,
                    h0, n_heads, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
                    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, NS: gl.constexpr,
                    F16: gl.constexpr):
    """The consumer warpgroup: first q into ``q_s*`` (from ``q_nope_ptr`` to ``stride_qp_h``:
    :func:`gluon_sm90._q_values`'s arguments), loaded here while the producer's first copies
    fly. Then each step waits for its slot's rows (``ready``),
    computes the transposed scores, the online softmax along the rows, P^T into ``p_smem`` and
    the transposed PV dots, then frees the slot (``free``). Returns the four output
    accumulators [LAT, BLOCK_H] (fp32), the running max [BLOCK_H] (base 2) and the per-entry
    denominators [BLOCK_N, BLOCK_H]."""
    b_q0, b_q1, b_q2, b_q3, b_qp = _q_values(q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                                             stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H, LAT,
                                             q_sp.shape[1], F16, GATHER_W4, ROPE_W4)
    q_s0.store(b_q0)
    q_s1.store(b_q1)
    q_s2.store(b_q2)
    q_s3.store(b_q3)
    q_sp.store(b_qp)
    fence_async_shared()  # q's stores (generic proxy) before the wgmma's reads
    _barrier()  # every consumer thread's part
    # the accumulators' layout: one warpgroup, heads along N
    T_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    b_m = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(0, T_L))
    b_l2 = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    acc0 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    acc1 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    acc2 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    acc3 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    for i in range(n_steps):
        slot = i % NS
        # the rows' ids (the softmax's mask) loaded before the score dots, which hide their
        # latency: loaded after the dots' wait, they stalled 9-10% of the consumers' samples in
        # prefill over 32K rows (run 219); loaded here, 1.02-1.035x there (run 220)
        b_idx = _row_ids(p_idx, n_start + i * BLOCK_N, n_end, gl.SliceLayout(1, T_L), BLOCK_N)
        mbarrier.wait(ready.index(slot), (i // NS) & 1)
        fence_async_shared()  # the producer's stores (generic proxy) before the wgmma's reads
        k0 = k_s0.index(slot)
        k1 = k_s1.index(slot)
        k2 = k_s2.index(slot)
        k3 = k_s3.index(slot)
        s = warpgroup_mma(k0, q_s0.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(k1, q_s1.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(k2, q_s2.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(k3, q_s3.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(kp_smem.index(slot), q_sp.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        b_m, b_l2, acc0, acc1, acc2, acc3 = narrow_softmax(s, b_idx, n_rows, qk_scale, b_m, b_l2, acc0, acc1,
                                                           acc2, acc3, p_smem)
        fence_async_shared()  # this thread's part of P^T, for the wgmma
        _barrier()  # every consumer thread's part
        acc0, acc1, acc2, acc3 = narrow_pv(k0, k1, k2, k3, p_smem, acc0, acc1, acc2, acc3)
        # every consumer warp's PV dots (which read the slot and P^T) are done: free the slot
        _arrive_all(free.index(slot))
    return acc0, acc1, acc2, acc3, b_m, b_l2


@gluon.jit
def narrow_softmax(s, b_idx, n_rows, qk_scale, b_m, b_l2, acc0, acc1, acc2, acc3, p_smem):
    """One step's online softmax along the rows of the transposed scores ``s`` [BLOCK_N,
    BLOCK_H] (:func:`narrow_probs`), the probabilities stored into ``p_smem`` (P^T). Returns
    ``b_m, b_l2, acc0..acc3``."""
    p, b_m, b_l2, acc0, acc1, acc2, acc3 = narrow_probs(s, b_idx, n_rows, qk_scale, b_m, b_l2, acc0, acc1, acc2,
                                                        acc3)
    p_smem.store(p.to(p_smem.dtype))
    return b_m, b_l2, acc0, acc1, acc2, acc3


@gluon.jit
def narrow_probs(s, b_idx, n_rows, qk_scale, b_m, b_l2, acc0, acc1, acc2, acc3):
    """One step's online softmax along the rows of the transposed scores ``s`` [BLOCK_N,
    BLOCK_H] (rows ``b_idx``, masked where invalid): the running max ``b_m`` and per-entry
    denominators ``b_l2`` updated, the four output accumulators rescaled. Returns the
    probabilities P^T (fp32) and ``b_m, b_l2, acc0..acc3``."""
    m_n = (b_idx >= 0) & (b_idx < n_rows)
    s = gl.where(m_n[:, None], s * qk_scale, float("-inf"))
    b_m_new = gl.maximum(b_m, gl.max(s, axis=0))
    alpha = gl.exp2(b_m - b_m_new)[None, :]
    b_m = b_m_new
    p = gl.exp2(s - b_m[None, :])
    b_l2 = b_l2 * alpha + p
    # every accumulator rescaled before a PV dot is issued (gluon_sm90's docstring: C7515)
    acc0 = acc0 * alpha
    acc1 = acc1 * alpha
    acc2 = acc2 * alpha
    acc3 = acc3 * alpha
    return p, b_m, b_l2, acc0, acc1, acc2, acc3


@gluon.jit
def narrow_pv(k0, k1, k2, k3, p_smem, acc0, acc1, acc2, acc3):
    """The transposed PV dots of one step (the latent tiles ``k0..k3`` [BLOCK_N, LAT] read
    transposed, P^T from ``p_smem``) into the four accumulators, waited for."""
    acc0 = warpgroup_mma(k0.permute((1, 0)), p_smem, acc0, is_async=True)
    acc1 = warpgroup_mma(k1.permute((1, 0)), p_smem, acc1, is_async=True)
    acc2 = warpgroup_mma(k2.permute((1, 0)), p_smem, acc2, is_async=True)
    acc3 = warpgroup_mma(k3.permute((1, 0)), p_smem, acc3, is_async=True)
    return warpgroup_mma_wait(0, deps=[acc0, acc1, acc2, acc3])


@gluon.jit
def narrow_epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0,
                    n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                    HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr,
                    LAT: gl.constexpr):
    """gluon_sm90._epilogue for the transposed accumulators: the final output, lse and sink,
    or with PARTIAL the partial output and base-2 lse."""
    # the accumulators' layout: one warpgroup, heads along N
    T_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    b_inv_l = _lse_and_scale(b_m, gl.sum(b_l2, axis=0), sink_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                             stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL, True, BLOCK_H)
    inv_l = b_inv_l[None, :]
    o_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, T_L))
    o_c = gl.arange(0, LAT, layout=gl.SliceLayout(1, T_L))
    p_o = out_ptr + i_t * stride_o_t + i_s * stride_o_s + o_h[None, :] * stride_o_h + o_c[:, None]
    m_o = (o_h < n_heads)[None, :]
    gl.store(p_o, (acc0 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + LAT, (acc1 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + 2 * LAT, (acc2 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + 3 * LAT, (acc3 * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
