"""Merge split-K partials by their log-sum-exp, then apply the attention sink.

Partial ``s`` holds a normalised output ``o_s`` and its base-2 lse ``L_s`` (-inf when its slice
had no valid entry). With ``L = log2(sum_s 2^L_s)`` the result is ``sum_s 2^(L_s - L) o_s``; an
all-empty row gives ``out = 0`` and ``lse = -inf``.
"""

import triton
import triton.language as tl

from .common import LN2, sink_factor


# Not specialized (they follow the split count, which varies from call to call of one kind;
# triton_sparse_mla.warmup relies on it): n_splits and the partial lse's strides.
@triton.jit(do_not_specialize=["n_splits", "stride_pl_t", "stride_pl_h"])
def combine_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, out_ptr, lse_ptr,
    n_splits,
    stride_po_t, stride_po_s, stride_po_h,
    stride_pl_t, stride_pl_h,
    stride_o_t, stride_o_h, stride_lse_t, stride_lse_h,
    HAS_SINK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, D_V: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_s = tl.arange(0, BLOCK_S)
    m_s = o_s < n_splits
    b_lse = tl.load(part_lse_ptr + i_t * stride_pl_t + i_h * stride_pl_h + o_s, mask=m_s,
                    other=float("-inf"))  # [BLOCK_S]
    b_max = tl.max(b_lse, axis=0)
    b_max = tl.where(b_max == float("-inf"), 0.0, b_max)
    b_w = tl.exp2(b_lse - b_max)
    b_sum = tl.sum(b_w, axis=0)
    m_nonempty = b_sum > 0.0
    b_lse2 = tl.where(m_nonempty, b_max + tl.log2(tl.where(m_nonempty, b_sum, 1.0)), float("-inf"))
    b_w = b_w / tl.where(m_nonempty, b_sum, 1.0)
    if HAS_SINK:
        b_w = b_w * sink_factor(b_lse2, tl.load(sink_ptr + i_h))
    for d0 in tl.static_range(0, D_V, BLOCK_D):
        o_d = d0 + tl.arange(0, BLOCK_D)
        p_po = part_o_ptr + i_t * stride_po_t + i_h * stride_po_h + o_s[:, None] * stride_po_s + o_d[None, :]
        b_po = tl.load(p_po, mask=m_s[:, None], other=0.0)  # [BLOCK_S, BLOCK_D]
        b_o = tl.sum(b_po * b_w[:, None], axis=0)
        tl.store(out_ptr + i_t * stride_o_t + i_h * stride_o_h + o_d, b_o.to(out_ptr.dtype.element_ty))
    if lse_ptr is not None:
        tl.store(lse_ptr + i_t * stride_lse_t + i_h * stride_lse_h, b_lse2 * LN2)


def combine_block(n_splits: int) -> int:
    """The combine kernel's BLOCK_S for a split count (a compiled variant per value)."""
    return max(2, triton.next_power_of_2(n_splits))


def launch_combine(part_o, part_lse, attn_sink, out, lse):
    """``part_o [T, S, H, 512]`` fp32, ``part_lse [T, H, S]`` fp32 -> ``out [T, H, 512]``, ``lse``."""
    t_count, n_splits, h_count, d_v = part_o.shape
    block_s = combine_block(n_splits)
    combine_kernel[(t_count, h_count)](
        part_o_ptr=part_o, part_lse_ptr=part_lse, sink_ptr=attn_sink, out_ptr=out, lse_ptr=lse,
        n_splits=n_splits,
        stride_po_t=part_o.stride(0), stride_po_s=part_o.stride(1), stride_po_h=part_o.stride(2),
        stride_pl_t=part_lse.stride(0), stride_pl_h=part_lse.stride(1),
        stride_o_t=out.stride(0), stride_o_h=out.stride(1),
        stride_lse_t=lse.stride(0) if lse is not None else 0,
        stride_lse_h=lse.stride(1) if lse is not None else 0,
        HAS_SINK=attn_sink is not None, BLOCK_S=block_s, BLOCK_D=128 if block_s <= 32 else 64,
        D_V=d_v, num_warps=4,
    )
