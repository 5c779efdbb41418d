"""A candidate combine kernel for split decode calls (not shipped; benchmarks/combine_probe.py
times it against kernels/combine.py).

Run 173 (benchmarks/kernel_split_probe.py) put the shipped combine at 24.2 us of a 57.7-us
decode call (T=32 H=64 bf16, 4 splits), 6.2 us with 2 splits: 16.8 MB of fp32 partials read
at 0.7 TB/s. The shipped kernel runs one program per (token, head), reads each head's 512
columns in four chunks of 128, and stores each chunk before it loads the next (a store may
alias the next load, so the loads cannot move ahead of it). This one runs a program per
(token, 8 heads), loads every split's rows of those heads with no store between the loads (each
split's rows of the program's heads one contiguous run of 16 KB), sums them in registers (no
reduction across threads, no barrier: compiled for sm90 by Triton 3.8), then stores.
"""

import triton
import triton.language as tl

from triton_sparse_mla.kernels.common import LN2, sink_factor

ROW_VALUES = 4096  # fp32 values of the accumulator [BLOCK_HC, 512]: 16 per thread at 8 warps


@triton.jit(do_not_specialize=["n_splits", "n_heads", "stride_pl_t", "stride_pl_h"])
def combine_heads_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, out_ptr, lse_ptr,
    n_splits, n_heads,
    stride_po_t, stride_po_s, stride_po_h,
    stride_pl_t, stride_pl_h,
    stride_o_t, stride_o_h, stride_lse_t, stride_lse_h,
    HAS_SINK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_HC: tl.constexpr, D_V: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    # Per-head values as [BLOCK_HC, 1] columns, which broadcast over the accumulator's rows
    # with no layout conversion inside the loop over splits.
    o_h = tl.program_id(1) * BLOCK_HC + tl.arange(0, BLOCK_HC)[:, None]
    o_d = tl.arange(0, D_V)[None, :]
    m_h = o_h < n_heads
    p_lse = part_lse_ptr + i_t * stride_pl_t + o_h * stride_pl_h
    # The max and the sum over splits split by split (no reduction across threads, whose
    # layout Triton would impose on the accumulator); the lse loads repeat from L1.
    b_max = tl.full([BLOCK_HC, 1], float("-inf"), tl.float32)
    for s in tl.static_range(BLOCK_S):
        b_max = tl.maximum(b_max, tl.load(p_lse + s, mask=m_h & (s < n_splits), other=float("-inf")))
    b_max = tl.where(b_max == float("-inf"), 0.0, b_max)
    b_sum = tl.zeros([BLOCK_HC, 1], tl.float32)
    for s in tl.static_range(BLOCK_S):
        b_sum += tl.exp2(tl.load(p_lse + s, mask=m_h & (s < n_splits), other=float("-inf")) - b_max)
    m_nonempty = b_sum > 0.0
    b_lse2 = tl.where(m_nonempty, b_max + tl.log2(tl.where(m_nonempty, b_sum, 1.0)), float("-inf"))
    b_scale = 1.0 / tl.where(m_nonempty, b_sum, 1.0)
    if HAS_SINK:
        b_scale = b_scale * sink_factor(b_lse2, tl.load(sink_ptr + o_h, mask=m_h, other=0.0))
    # Every split's rows of these heads loaded with no store between them (one contiguous run
    # of BLOCK_HC x 2 KB per split), weighted and summed in registers.
    p_po = part_o_ptr + i_t * stride_po_t + o_h * stride_po_h + o_d
    acc = tl.zeros([BLOCK_HC, D_V], dtype=tl.float32)
    for s in tl.static_range(BLOCK_S):
        m_s = m_h & (s < n_splits)
        b_w = tl.exp2(tl.load(p_lse + s, mask=m_s, other=float("-inf")) - b_max) * b_scale
        acc += tl.load(p_po + s * stride_po_s, mask=m_s, other=0.0) * b_w
    tl.store(out_ptr + i_t * stride_o_t + o_h * stride_o_h + o_d, acc.to(out_ptr.dtype.element_ty),
             mask=m_h)
    if lse_ptr is not None:
        tl.store(lse_ptr + i_t * stride_lse_t + o_h * stride_lse_h, b_lse2 * LN2, mask=m_h)


def heads_blocks(n_splits: int, n_heads: int, d_v: int = 512) -> tuple[int, int]:
    """``(BLOCK_S, BLOCK_HC)`` for a split count and head count."""
    return (max(2, triton.next_power_of_2(n_splits)),
            max(1, min(triton.next_power_of_2(n_heads), ROW_VALUES // d_v)))


def launch_combine_heads(part_o, part_lse, attn_sink, out, lse, block_hc=None):
    """As kernels.combine.launch_combine: ``part_o [T, S, H, 512]`` fp32, ``part_lse [T, H, S]``
    fp32 -> ``out [T, H, 512]``, ``lse``; ``block_hc`` heads per program (default: 8, fewer
    with fewer heads)."""
    t_count, n_splits, h_count, d_v = part_o.shape
    block_s, block_hc_default = heads_blocks(n_splits, h_count, d_v)
    block_hc = block_hc or block_hc_default
    combine_heads_kernel[(t_count, triton.cdiv(h_count, block_hc))](
        part_o_ptr=part_o, part_lse_ptr=part_lse, sink_ptr=attn_sink, out_ptr=out, lse_ptr=lse,
        n_splits=n_splits, n_heads=h_count,
        stride_po_t=part_o.stride(0), stride_po_s=part_o.stride(1), stride_po_h=part_o.stride(2),
        stride_pl_t=part_lse.stride(0), stride_pl_h=part_lse.stride(1),
        stride_o_t=out.stride(0), stride_o_h=out.stride(1),
        stride_lse_t=lse.stride(0) if lse is not None else 0,
        stride_lse_h=lse.stride(1) if lse is not None else 0,
        HAS_SINK=attn_sink is not None, BLOCK_S=block_s, BLOCK_HC=block_hc, D_V=d_v, num_warps=8,
    )
