"""EXPERIMENT (forty-sixth session, not yet run on a GPU; ``TSM_INDEXER_HEADS_ALONG_N=1``): the
prefill indexer (:mod:`.flat`'s call) with the heads along the product's N axis.

A program holds ``G`` query rows with all their heads as one ``[G * BLOCK_H, D]`` tile, loaded
once, and walks the union of the rows' key ranges ``BLOCK_N`` keys at a time, each key tile one
``[BLOCK_N, D] x [D, G * BLOCK_H]`` product (keys along M, (row, head) pairs along N) whose
``weights * relu(.)`` is summed over each row's heads along N: within a thread and across the
four lanes that share an accumulator row, no shared memory. Against :mod:`.flat`'s tile, which
reloads each head's q tile for every key tile (64 KB a 128-key tile at 64 heads) and runs one
product per head: q is read once, a key tile serves ``G * BLOCK_H`` columns, and one product
with one epilogue serves all heads. Counted for 8192 causal tokens at 64 heads with
``G * BLOCK_H = 256`` on an H100: 131K (4 rows, 64 keys) tiles of 2M multiply-adds (about 512
clocks at the fp8 rate) and a 64-value epilogue per thread; L2 reads 1.1 GB of keys (about
0.2 ms); about 0.35 ms in all if the epilogue hides under the next product, against 1.38 ms for
:mod:`.flat`'s tile (run 271) and DeepGEMM's 0.64 ms (run 262).
"""

import os

import triton
import triton.language as tl

from ..hostmath import cdiv, next_power_of_2
from ..kernels.common import LAUNCH_OPTIONS, e4m3_rows_operand, e4m3_unit, mma
from .rows import key_ranges, rows_by_heads

ON = os.environ.get("TSM_INDEXER_HEADS_ALONG_N", "0") == "1"
COLUMNS = 256  # G * BLOCK_H: the product's N (wgmma's largest)
BLOCK_N = 64
NUM_WARPS = 8
NUM_STAGES = 3
# A measurement knob: "COLUMNS,BLOCK_N,NUM_WARPS,NUM_STAGES" (device_run.sh indexer-heads).
_TILE = os.environ.get("TSM_INDEXER_HEADS_TILE")
if _TILE:
    try:
        COLUMNS, BLOCK_N, NUM_WARPS, NUM_STAGES = (int(x) for x in _TILE.split(","))
    except ValueError:
        raise ValueError("TSM_INDEXER_HEADS_TILE: expected 'COLUMNS,BLOCK_N,NUM_WARPS,NUM_STAGES' "
                         f"(four integers), got {_TILE!r}") from None


@triton.jit(do_not_specialize=["n_rows", "n_keys", "width", "stride_om", "starts_ptr", "ends_ptr"])
def mqa_logits_heads_kernel(
    q_ptr, k_ptr, k_scale_ptr, w_ptr, starts_ptr, ends_ptr, out_ptr,
    n_rows, n_keys, width,
    stride_qm, stride_qh, stride_kn, stride_wm, stride_wh, stride_om,
    H: tl.constexpr, BLOCK_H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_N: tl.constexpr, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr, FP8_DOT: tl.constexpr,
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
    for n0 in range(lo + i_n * BLOCK_N, hi, n_programs * BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        m_n = o_n < hi
        b_k = e4m3_rows_operand(k_ptr + o_n.to(tl.int64) * stride_kn, m_n, D, FP8_CVT, INTERPRET,
                                FP8_DOT)  # [BLOCK_N, D]
        b_s = tl.maximum(mma(b_k, tl.trans(b_q), INTERPRET), 0.0) * b_w[None, :]
        b_l = tl.sum(tl.reshape(b_s, [BLOCK_N, G, BLOCK_H]), axis=2)  # [BLOCK_N, G]
        b_scale = tl.load(k_scale_ptr + o_n, mask=m_n, other=0.0)
        b_l *= e4m3_unit(e4m3_unit(b_scale, FP8_CVT), FP8_CVT)[:, None]
        m_out = m_g[None, :] & (o_n[:, None] >= b_lo[None, :]) & (o_n[:, None] < b_hi[None, :])
        tl.store(p_out + (o_n[:, None] - b_lo[None, :]), b_l, mask=m_out)


def rows_per_program(n_heads: int) -> tuple[int, int]:
    """``(G, BLOCK_H)``: query rows per program and the head tile (a power of two >= 16)."""
    block_h = max(16, next_power_of_2(n_heads))
    return max(1, COLUMNS // block_h), block_h


def launch(q8, k8, k_scale, weights, row_starts, row_ends, out, *, sm_count, fp8_cvt, interpret,
           fp8_products):
    """Run :func:`mqa_logits_heads_kernel` (arguments as :func:`.flat.launch_mqa_logits`)."""
    n_rows, n_heads, d = q8.shape
    g, block_h = rows_per_program(n_heads)
    row_blocks = cdiv(n_rows, g)
    key_programs = max(1, min(cdiv(out.shape[1], BLOCK_N), cdiv(2 * sm_count, row_blocks)))
    mqa_logits_heads_kernel[(row_blocks, key_programs)](
        q8, k8, k_scale, weights, row_starts, row_ends, out,
        n_rows, k8.shape[0], out.shape[1],
        q8.stride(0), q8.stride(1), k8.stride(0), weights.stride(0), weights.stride(1),
        out.stride(0),
        H=n_heads, BLOCK_H=block_h, G=g, D=d, BLOCK_N=BLOCK_N, FP8_CVT=fp8_cvt,
        INTERPRET=interpret, FP8_DOT=fp8_products, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        **LAUNCH_OPTIONS,
    )
    return out
