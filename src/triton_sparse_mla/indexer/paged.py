"""Indexer logits of decode rows over their request's paged K cache (vLLM's
``fp8_paged_mqa_logits``).

A request has ``NEXT_N`` query rows (its new token and its speculative drafts), each seeing the
request's first ``limit`` cache positions. A program takes one request and every
``n_programs``-th cache block of it: it reads the block's ``block_size x D`` fp8 values and fp32
scales (:mod:`.cache_layout`) once, converts them to fp16 (exactly, as :mod:`.flat` does), and
for each of the request's rows runs one ``[H, D] x [D, block_size]`` product, summing
``weights * relu(.)`` over the heads. The grid depends on the batch size and the SM count only, so CUDA graphs stay valid;
positions at or past a row's limit are not written.
"""

import triton
import triton.language as tl

from ..hostmath import cdiv, next_power_of_2
from ..kernels.common import LAUNCH_OPTIONS, e4m3_to_f16, mma

NUM_WARPS = 4


# Not specialized, so that indexer.warmup's call compiles what serving runs: the sizes and the
# block table's and output's row strides. The cache block's stride (block_size (D + 4) bytes)
# and q's and the weights' stay specialized, so blocks and q rows load as 16-byte vectors.
@triton.jit(do_not_specialize=["n_blocks_max", "width", "stride_tb", "stride_om"])
def paged_mqa_logits_kernel(
    q_ptr, cache_ptr, w_ptr, limits_ptr, table_ptr, out_ptr,
    n_blocks_max, width, stride_cb, stride_tb, stride_qb, stride_qn, stride_qh, stride_wr,
    stride_wh, stride_om,
    NEXT_N: tl.constexpr, NEXT_N_P2: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr,
    D: tl.constexpr, BLOCK_SIZE: tl.constexpr, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_s = tl.program_id(1)
    n_programs = tl.num_programs(1)
    o_j = tl.arange(0, NEXT_N_P2)
    b_limits = tl.load(limits_ptr + i_b * NEXT_N + o_j, mask=o_j < NEXT_N, other=0)
    n_used = tl.minimum(tl.cdiv(tl.max(b_limits, axis=0), BLOCK_SIZE), n_blocks_max)
    o_t = tl.arange(0, BLOCK_SIZE)
    o_d = tl.arange(0, D)
    o_h = tl.arange(0, BLOCK_H)
    m_h = o_h < H
    for i_blk in range(i_s, n_used, n_programs):
        blk = tl.load(table_ptr + i_b.to(tl.int64) * stride_tb + i_blk).to(tl.int64)
        p_blk = cache_ptr + blk * stride_cb
        b_k = e4m3_to_f16(tl.load(p_blk + o_t[:, None] * D + o_d[None, :]), FP8_CVT)  # [BLOCK_SIZE, D]
        p_scale = (p_blk + BLOCK_SIZE * D).to(tl.pointer_type(tl.float32), bitcast=True)
        b_scale = tl.load(p_scale + o_t)  # [BLOCK_SIZE]
        o_p = i_blk * BLOCK_SIZE + o_t
        for j in tl.static_range(NEXT_N):
            r = i_b.to(tl.int64) * NEXT_N + j
            p_q = q_ptr + i_b.to(tl.int64) * stride_qb + j * stride_qn
            b_q = e4m3_to_f16(tl.load(p_q + o_h[:, None] * stride_qh + o_d[None, :],
                                      mask=m_h[:, None], other=0), FP8_CVT)  # [BLOCK_H, D]
            b_w = tl.load(w_ptr + r * stride_wr + o_h * stride_wh, mask=m_h, other=0.0)
            b_s = mma(b_q, tl.trans(b_k), INTERPRET)  # [BLOCK_H, BLOCK_SIZE]
            b_l = tl.sum(tl.maximum(b_s, 0.0) * b_w[:, None], axis=0) * b_scale
            limit = tl.minimum(tl.load(limits_ptr + r), width)
            tl.store(out_ptr + r * stride_om + o_p, b_l, mask=o_p < limit)


def launch_paged_mqa_logits(q8, kv_cache, weights, limits, block_tables, out, *, sm_count,
                            fp8_cvt, interpret):
    """Run :func:`paged_mqa_logits_kernel`: ``q8 [B, NEXT_N, H, D]`` float8_e4m3fn bytes (uint8),
    ``kv_cache`` uint8
    ``[num_blocks, block_size, 1, D + 4]``, ``weights [B * NEXT_N, H]`` fp32, ``limits
    [B * NEXT_N]`` int32, ``block_tables [B, max_blocks]`` int32, into ``out [B * NEXT_N, W]``
    fp32. Each request's blocks are spread over enough programs to give each SM about two."""
    batch, next_n, n_heads, d = q8.shape
    block_size = kv_cache.shape[1]
    n_blocks_max = min(block_tables.shape[1], cdiv(out.shape[1], block_size))
    if batch == 0 or n_blocks_max == 0:
        return out
    programs = max(1, min(n_blocks_max, cdiv(2 * sm_count, batch)))
    paged_mqa_logits_kernel[(batch, programs)](
        q8, kv_cache, weights, limits, block_tables, out,
        n_blocks_max, out.shape[1], kv_cache.stride(0), block_tables.stride(0), q8.stride(0),
        q8.stride(1), q8.stride(2), weights.stride(0), weights.stride(1), out.stride(0),
        NEXT_N=next_n, NEXT_N_P2=next_power_of_2(next_n), H=n_heads, BLOCK_H=max(16, next_power_of_2(n_heads)), D=d,
        BLOCK_SIZE=block_size, FP8_CVT=fp8_cvt, INTERPRET=interpret,
        num_warps=NUM_WARPS, **LAUNCH_OPTIONS,
    )
    return out
