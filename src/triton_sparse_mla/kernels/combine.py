"""Merge split-K partials by their log-sum-exp, then apply the attention sink.

Partial ``s`` holds a normalised output ``o_s`` and its base-2 lse ``L_s`` (-inf when its slice
had no valid entry). With ``L = log2(sum_s 2^L_s)`` the result is ``sum_s 2^(L_s - L) o_s``; an
all-empty row gives ``out = 0`` and ``lse = -inf``.

A program merges ``BLOCK_HC`` heads of one token. It loads every split's rows of its heads
before its one store (a store between loads could alias the next load and would hold it back),
and sums them in registers: no reduction across threads, so no barrier. Measured on the H200
(run 174, BENCHMARKS.md "The combine kernel rewritten"): 2 heads per program beat 8 alone at
every shape timed, and beat the earlier kernel (a program per head, a store between its four
column chunks, the sum over splits across warps) 1.8-6.7x alone, which made the whole decode
call 1.10-1.54x faster at T=4-64 with 16-128 heads.
"""

import triton
import triton.language as tl

from ..hostmath import cdiv, next_power_of_2
from .common import LAUNCH_OPTIONS, LN2, scalar_mask, sink_factor
from .launch import launch

BLOCK_HC = 2  # heads per program (run 174: 2 beat 8 alone at every T, H and split count timed)
NUM_WARPS = 8


# Not specialized (they follow the split count and the head count, which vary from call to
# call of one kind; triton_sparse_mla.warmup relies on it): n_splits, n_heads and the partial
# lse's strides.
@triton.jit(do_not_specialize=["n_splits", "n_heads", "stride_pl_t", "stride_pl_h"])
def combine_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, out_ptr, lse_ptr,
    n_splits, n_heads,
    stride_po_t, stride_po_s, stride_po_h,
    stride_pl_t, stride_pl_h,
    stride_o_t, stride_o_h, stride_lse_t, stride_lse_h,
    HAS_SINK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_HC: tl.constexpr, D_V: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    # Per-head values as [BLOCK_HC, 1] columns, which broadcast over the accumulator's rows
    # with no layout conversion inside the loops over splits.
    o_h = tl.program_id(1) * BLOCK_HC + tl.arange(0, BLOCK_HC)[:, None]
    o_d = tl.arange(0, D_V)[None, :]
    m_h = o_h < n_heads
    p_lse = part_lse_ptr + i_t * stride_pl_t + o_h * stride_pl_h
    # The max and the sum over splits, split by split (a reduction across threads would impose
    # its layout on the accumulator); the repeated lse loads hit L1.
    b_max = tl.full([BLOCK_HC, 1], float("-inf"), tl.float32)
    for s in tl.static_range(BLOCK_S):
        b_max = tl.maximum(b_max, tl.load(p_lse + s, mask=m_h & scalar_mask(o_h, s < n_splits),
                                            other=float("-inf")))
    b_max = tl.where(b_max == float("-inf"), 0.0, b_max)
    b_sum = tl.zeros([BLOCK_HC, 1], tl.float32)
    for s in tl.static_range(BLOCK_S):
        b_sum += tl.exp2(tl.load(p_lse + s, mask=m_h & scalar_mask(o_h, s < n_splits),
                                 other=float("-inf")) - b_max)
    m_empty = b_sum == 0.0  # (a NaN split lse gives a NaN sum: NaN, not -inf)
    b_lse2 = tl.where(m_empty, float("-inf"), b_max + tl.log2(tl.where(m_empty, 1.0, b_sum)))
    b_scale = 1.0 / tl.where(m_empty, 1.0, b_sum)
    if HAS_SINK:
        b_scale = b_scale * sink_factor(b_lse2, tl.load(sink_ptr + o_h, mask=m_h, other=0.0))
    # Every split's rows of these heads (one contiguous run of BLOCK_HC x 2 KB per split),
    # weighted and summed in registers, then one store.
    p_po = part_o_ptr + i_t * stride_po_t + o_h * stride_po_h + o_d
    acc = tl.zeros([BLOCK_HC, D_V], dtype=tl.float32)
    for s in tl.static_range(BLOCK_S):
        m_s = m_h & scalar_mask(o_h, s < n_splits)
        b_w = tl.exp2(tl.load(p_lse + s, mask=m_s, other=float("-inf")) - b_max) * b_scale
        acc += tl.load(p_po + s * stride_po_s, mask=m_s, other=0.0) * b_w
    tl.store(out_ptr + i_t * stride_o_t + o_h * stride_o_h + o_d, acc.to(out_ptr.dtype.element_ty),
             mask=m_h)
    if lse_ptr is not None:
        tl.store(lse_ptr + i_t * stride_lse_t + o_h * stride_lse_h, b_lse2 * LN2, mask=m_h)


def combine_block(n_splits: int) -> int:
    """The combine kernel's BLOCK_S for a split count (a compiled variant per value)."""
    return max(2, next_power_of_2(n_splits))


def launch_combine(part_o, part_lse, attn_sink, out, lse):
    """``part_o [T, S, H, 512]`` fp32, ``part_lse [T, H, S]`` fp32, ``attn_sink [H]`` fp32 or
    None -> ``out [T, H, 512]`` (its dtype; any strides with a unit last one) and ``lse [T, H]``
    fp32 natural-log or None."""
    t_count, n_splits, h_count, d_v = part_o.shape
    launch(
        combine_kernel, (t_count, cdiv(h_count, BLOCK_HC)),
        part_o_ptr=part_o, part_lse_ptr=part_lse, sink_ptr=attn_sink, out_ptr=out, lse_ptr=lse,
        n_splits=n_splits, n_heads=h_count,
        stride_po_t=part_o.stride(0), stride_po_s=part_o.stride(1), stride_po_h=part_o.stride(2),
        stride_pl_t=part_lse.stride(0), stride_pl_h=part_lse.stride(1),
        stride_o_t=out.stride(0), stride_o_h=out.stride(1),
        stride_lse_t=lse.stride(0) if lse is not None else 0,
        stride_lse_h=lse.stride(1) if lse is not None else 0,
        HAS_SINK=attn_sink is not None, BLOCK_S=combine_block(n_splits), BLOCK_HC=BLOCK_HC,
        D_V=d_v, num_warps=NUM_WARPS, **LAUNCH_OPTIONS,
    )
