"""The prefill indexer (:mod:`.flat`'s call) with the heads along the product's N axis: the
kernel of the families whose tensor cores take both operands from shared memory (``wgmma`` on
SM90, ``tcgen05`` on SM100; :data:`.flat.HEADS_ALONG_N`).

A program holds ``G`` query rows with all their heads as one ``[G * BLOCK_H, D]`` tile, loaded
once, and walks the union of the rows' key ranges ``BLOCK_N`` keys at a time, each key tile one
``[BLOCK_N, D] x [D, G * BLOCK_H]`` product (keys along M, (row, head) pairs along N) whose
``weights * relu(.)`` is summed over each row's heads along N: within a thread and across the
four lanes that share an accumulator row, no shared memory. Against :mod:`.flat`'s per-head
tile, which reloads each head's q tile for every key tile and runs one product per head: q is
read once, a key tile serves ``G * BLOCK_H`` columns, one product and one epilogue serve all
heads, and the accumulator is a quarter of the per-head tile's (154 registers on sm90, no
spills, against 255 and spills).

Measured on sm90 (BENCHMARKS.md "The indexer with the heads along N"): with the first tile
tried (256 columns, 8 warps) 1.3-1.6x faster than the per-head kernel (H200, run 272); the tile
below 1.04-1.3x faster again (H100, run 275). The 8-warp tile's two warpgroups split N and so
ran their products and epilogues in step (ncu, run 274: 28% of its stall samples wait for its
own product); one warpgroup a program lets two or three programs share an SM, one's epilogue
beside another's product.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from ..hostmath import cdiv, next_power_of_2
from ..kernels.common import LAUNCH_OPTIONS, e4m3_rows_operand, e4m3_unit, mma
from ..kernels.launch import launch as launch_kernel
from .knobs import tile_knob
from .rows import key_programs, key_ranges, rows_by_heads


class HeadsTile(NamedTuple):
    """A program's shape: ``columns`` (row, head) pairs (``G * BLOCK_H``, the product's N) and
    keys ``block_n`` at a time."""

    columns: int
    block_n: int
    num_warps: int
    num_stages: int


# Measured on an H100 (run 275, 8 tiles, fp8 products): (128, 64, 4, 4) 1.17-1.22x faster than
# (256, 64, 8, 3) at 64 heads and 1.04-1.31x at 32; 3 stages within 4%; a 128-register cap on
# the 8-warp tile (two programs an SM) and 128 keys a tile did not help. Shared memory: 41 KB
# (fp8 products), 72 KB (sm80/86's fp16 products), within every target's 99 KB.
# A measurement knob: TSM_INDEXER_HEADS_TILE="COLUMNS,BLOCK_N,NUM_WARPS,NUM_STAGES"
# (benchmarks/device_run.sh indexer-heads-tiles).
TILE = tile_knob("TSM_INDEXER_HEADS_TILE", HeadsTile(columns=128, block_n=64, num_warps=4,
                                                      num_stages=4))


@triton.jit(do_not_specialize=["n_rows", "n_keys", "width", "stride_om", "starts_ptr", "ends_ptr"])
def mqa_logits_heads_kernel(
    q_ptr, k_ptr, k_scale_ptr, w_ptr, starts_ptr, ends_ptr, out_ptr,
    n_rows, n_keys, width,
    stride_qm, stride_qh, stride_kn, stride_wm, stride_wh, stride_om,
    H: tl.constexpr, BLOCK_H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_N: tl.constexpr, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr, FP8_DOT: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
):
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    n_programs = tl.num_programs(1)
    o_cr, o_ch, m_c = rows_by_heads(i_m * G, n_rows, G, BLOCK_H, H)  # the query tile's columns
    # [G * BLOCK_H, D], without the decoders' unit (folded into the keys' scales below)
    b_q = e4m3_rows_operand(q_ptr + o_cr.to(tl.int64) * stride_qm + o_ch * stride_qh, m_c, D,
                            FP8_CVT, INTERPRET, FP8_DOT)
    b_w = tl.load(w_ptr + o_cr.to(tl.int64) * stride_wm + o_ch * stride_wh, mask=m_c, other=0.0)
    o_g = i_m * G + tl.arange(0, G)
    m_g = o_g < n_rows
    b_lo, b_hi, lo, hi = key_ranges(starts_ptr, ends_ptr, o_g, m_g, n_keys, width)  # [G], [G]
    p_out = out_ptr + o_g.to(tl.int64)[None, :] * stride_om  # [1, G]
    step = n_programs * BLOCK_N
    # (the loop's own pipeline depth, the launch's: every load of the step is copied ahead, the
    # keys' scales too, as in paged_mqa_logits_kernel; against the scales loaded in the step,
    # 0.95-1.04x over the bench's prefill rows, 1.01x summed: H100, run 293)
    for n0 in tl.range(lo + i_n * BLOCK_N, hi, step, num_stages=LOOP_STAGES):
        o_n = n0 + tl.arange(0, BLOCK_N)
        m_n = o_n < hi
        b_k = e4m3_rows_operand(k_ptr + o_n.to(tl.int64) * stride_kn, m_n, D, FP8_CVT, INTERPRET,
                                FP8_DOT)  # [BLOCK_N, D]
        b_scale = tl.load(k_scale_ptr + o_n, mask=m_n, other=0.0)
        b_s = tl.maximum(mma(b_k, tl.trans(b_q), INTERPRET), 0.0) * b_w[None, :]
        b_l = tl.sum(tl.reshape(b_s, [BLOCK_N, G, BLOCK_H]), axis=2)  # [BLOCK_N, G]
        b_l *= e4m3_unit(e4m3_unit(b_scale, FP8_CVT), FP8_CVT)[:, None]
        m_out = m_g[None, :] & (o_n[:, None] >= b_lo[None, :]) & (o_n[:, None] < b_hi[None, :])
        tl.store(p_out + (o_n[:, None] - b_lo[None, :]), b_l, mask=m_out)


def rows_per_program(n_heads: int) -> tuple[int, int]:
    """``(G, BLOCK_H)``: query rows per program and the head tile (a power of two >= 16)."""
    block_h = max(16, next_power_of_2(n_heads))
    return max(1, TILE.columns // block_h), block_h


def launch(q8, k8, k_scale, weights, row_starts, row_ends, out, *, sm_count, fp8_cvt, interpret,
           fp8_products):
    """Run :func:`mqa_logits_heads_kernel` (arguments as :func:`.flat.launch_mqa_logits`)."""
    n_rows, n_heads, d = q8.shape
    g, block_h = rows_per_program(n_heads)
    row_blocks = cdiv(n_rows, g)
    n_split = key_programs(out.shape[1], TILE.block_n, row_blocks, sm_count)
    launch_kernel(
        mqa_logits_heads_kernel, (row_blocks, n_split),
        q8, k8, k_scale, weights, row_starts, row_ends, out,
        n_rows, k8.shape[0], out.shape[1],
        q8.stride(0), q8.stride(1), k8.stride(0), weights.stride(0), weights.stride(1),
        out.stride(0),
        H=n_heads, BLOCK_H=block_h, G=g, D=d, BLOCK_N=TILE.block_n, FP8_CVT=fp8_cvt,
        INTERPRET=interpret, FP8_DOT=fp8_products, LOOP_STAGES=TILE.num_stages,
        num_warps=TILE.num_warps,
        num_stages=TILE.num_stages, **LAUNCH_OPTIONS,
    )
    return out
