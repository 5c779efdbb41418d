"""sm90's few-head Gluon tile over bf16/fp16 rows: gluon_narrow's consumer warpgroup (rows
along the wgmma's M, heads along N: 8 or 16 heads with no padding to 64) fed by the plain
rows' producer warps of gluon_sm90 (``_ws_producer``: asynchronous copies straight into the
operand ring, no conversion).

Per 64-row step: 74 KB of rows copied per SM, then 36 score and 32 PV wgmma of N = BLOCK_H
reading them (as the fp8_ds_mla few-head tile, whose producer also converts). Shared memory:
q 9 KB (8 heads) or 18 KB (16), two 72 KB slots, P^T 1-2 KB: 156-165 KB, one program per SM.

Import only where Gluon is available and not under the interpreter (as gluon_sm90).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from . import gluon_narrow
from .gluon_sm90 import _NOT_SPECIALIZED, _barrier, _latent_ring, _split_range, _tile_origin, _ws_producer

# The producer warps copy only (their ids and addresses): 128 registers leave the consumer
# warpgroup the rest of the register file, as in the fp8_ds_mla few-head kernel.
PRODUCER_REGS = gl.constexpr(128)


@gluon.jit(do_not_specialize=_NOT_SPECIALIZED)
def sparse_mla_gluon_narrow_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
    qk_scale, n_rows, n_heads, topk, split_size,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_kv, stride_idx_t,
    stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
    HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
    NS: gl.constexpr, PW: gl.constexpr,
):
    """One program per (token, head tile, split), as gluon_sm90's kernels: ``PW`` producer warps
    copy each step's rows into an NS-slot ring and complete its ``ready`` barrier when their
    copies land; the consumer warpgroup (gluon_narrow.narrow_consumer) loads q, then computes
    each step and frees its slot. Arguments as gluon_sm90.kernel_args gives them."""
    i_t, h0 = _tile_origin(n_heads, BLOCK_H)
    dt: gl.constexpr = kv_ptr.dtype.element_ty  # bf16 or fp16, as q (kernels.attention)
    # q is stored by the consumers inside their partition
    q_s0, q_s1, q_s2, q_s3, q_sp = gluon_narrow.narrow_q_tiles(dt, dt, BLOCK_H, LAT, D_PE)
    k_s0, k_s1, k_s2, k_s3, kp_smem = _latent_ring(dt, dt, BLOCK_N, LAT, D_PE, NS)
    p_smem = gluon_narrow.narrow_p_tile(dt, BLOCK_N, BLOCK_H)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS):
        mbarrier.init(ready.index(j), count=32 * PW)  # one copy-completion per producer thread
        mbarrier.init(free.index(j), count=1)
    fence_async_shared()  # the barriers' initialisation, before the partitions
    _barrier()

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    acc0, acc1, acc2, acc3, b_m, b_l2 = gl.warp_specialize(
        [(gluon_narrow.narrow_consumer, (q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_smem,
                                         p_smem, ready, free, p_idx, n_start, n_end, n_steps, n_rows,
                                         qk_scale, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                                         stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H, BLOCK_N, LAT,
                                         NS, False)),
         (_ws_producer, (kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2,
                         k_s3, kp_smem, ready, free, BLOCK_N, LAT, D_PE, NS, PW))],
        [PW], [PRODUCER_REGS])
    gluon_narrow.narrow_epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s,
                                 h0, n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t,
                                 stride_lse_h, HAS_SINK, PARTIAL, BLOCK_H, LAT)
