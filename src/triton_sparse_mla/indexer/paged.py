"""Indexer logits of decode rows over their request's paged K cache (vLLM's
``fp8_paged_mqa_logits``).

A request has ``NEXT_N`` query rows (its new token and its speculative drafts), each seeing the
request's first ``limit`` cache positions. A program holds ``G`` of those rows with all their
heads as one ``[G * BLOCK_H, D]`` tile, loaded once (as :mod:`.flat` loads q), and takes every
``n_programs``-th cache block of the request: it reads the block's ``block_size x D`` fp8 values
and fp32 scales (:mod:`.cache_layout`) once, runs one ``[block_size, D] x [D, G * BLOCK_H]``
product (positions along M, (row, head) pairs along N, as :mod:`.flat_heads`), and sums
``weights * relu(.)`` over each row's heads along N, inside a warp. ``G * BLOCK_H <= 128``
(vLLM's decode: 1 or 2 rows of 64 or 32 heads, one group). The grid depends on the batch size,
``NEXT_N``, the head count and the SM count only, so CUDA graphs stay valid; positions at or
past a row's limit are not written.

Heads along N against the heads along M of the kernel before (H200, run 272): 1.2-2.3x faster;
the block's 64 positions fill ``wgmma``'s M even for one row of 32 heads. Counted on sm89 (two
rows, 8 warps, Triton 3.8): 992 -> 696 instructions, 21 -> 13 barriers.
"""

import triton
import triton.language as tl

from ..hostmath import cdiv, next_power_of_2
from ..kernels.common import LAUNCH_OPTIONS, e4m3_rows_operand, e4m3_unit, mma
from ..kernels.launch import launch
from .flat import fp8_dot
from .knobs import int_knob
from .rows import rows_by_heads


# G * BLOCK_H at most: the query tile's columns (q and the accumulator in registers). A
# measurement knob, TSM_INDEXER_PAGED_COLUMNS (64: one row of 64 heads a program, so two
# programs read each block of a two-row request).
MAX_COLUMNS = int_knob("TSM_INDEXER_PAGED_COLUMNS", 128)
# Programs a launch aims at per SM: at most what one SM holds (``resident_programs``), rounded
# down, so that a launch is one wave at most, as the attention's split rule
# (configs.choose_splits). Before (runs 272-277) it aimed at 4 rounded up, over tiles of which
# 3 fit an sm90 SM: run 276's slowest rows against DeepGEMM are those that made a second,
# partial wave (32 x 8K two rows at 64 heads: 544 programs for 396 places, 22.1 us where one
# row, one wave, took 10.1; 32 x 8K two rows at 32 heads: 544 for 528; 8 x 128K two rows at 64
# heads: 528 for 396), and those that made one wave the fastest. Measured after the change
# (H100, run 278 against run 277): those rows 1.31-1.58x faster (32 x 8K two rows at 64
# heads: 16.1 us), 128 x 32K one row 0.94x (223 us: 512 programs, where 640 ran before); 5
# programs an SM, over-claimed, 1.27x slower at 32 x 8K two rows. A measurement knob,
# TSM_INDEXER_PAGED_PER_SM, replaces the count (0: the table).
PROGRAMS_PER_SM = int_knob("TSM_INDEXER_PAGED_PER_SM", 0)
# The software pipeline's depth, by family. sm90: 5, measured on an H100 against 2-6 (run 280,
# each in its own process): 1.09-1.20x faster than 3 (Triton's default, which runs 272-279 ran)
# on the rows past one wave's worth of blocks (128 x 32K one row: 202 against 223 us; 8 x 128K
# two rows: 60 against 72), 4 no different from 3, 6 from 5; one request of 32K 0.2 us slower
# (a block a program: the deeper prologue). Run 279 (Nsight Compute, 3 stages): 46% of the
# stall samples on the wait for the block's copy. Elsewhere 3 (not measured): 5 costs 8 KB of
# shared memory a program more, which on sm89/120's 100 KB leaves fewer programs than
# :data:`RESIDENT` counts (and on sm100, under Triton 3.8, registers for two of the 128-column
# tiles, not three). A measurement knob, TSM_INDEXER_PAGED_STAGES, sets every family's.
NUM_STAGES = {"sm90": 5, "sm100": 3, "sm80": 3, "sm86": 3}
if _stages := int_knob("TSM_INDEXER_PAGED_STAGES", 0):
    NUM_STAGES = dict.fromkeys(NUM_STAGES, _stages)
# Programs of this kernel one SM holds, by product path and the tile's columns (fewer than 64
# count as 64): the least over the path's targets, each at its family's NUM_STAGES, from the
# compiled kernels' shared memory (fp16 products, sm80/86: 41 and 57 KB) and registers (fp8
# products: 79-128 a thread at 64 columns, 128-176 at 128; 4 warps) under Triton 3.6 and 3.8.
# The launch caps the registers to fit the count (:func:`register_cap`); tests/test_portability.py
# checks each count against the compiled kernels.
RESIDENT = {"fp8": {64: 4, 128: 3}, "fp16": {64: 2, 128: 1}}
# One warpgroup a program: the two-row 64-head tile (128 columns) took 22.1 us with 4 warps
# against 27.4 with 8 at 32 x 8K (H100, run 276), whose two warpgroups split N and ran in
# step (as flat_heads' 8-warp tile); every other row within 3%.
NUM_WARPS = 4


# Not specialized, so that indexer.warmup's call compiles what serving runs: the sizes and the
# block table's and output's row strides. The cache block's stride (block_size (D + 4) bytes)
# and q's and the weights' stay specialized, so blocks and q rows load as 16-byte vectors.
@triton.jit(do_not_specialize=["n_blocks_max", "width", "stride_tb", "stride_om"])
def paged_mqa_logits_kernel(
    q_ptr, cache_ptr, w_ptr, limits_ptr, table_ptr, out_ptr,
    n_blocks_max, width, stride_cb, stride_tb, stride_qb, stride_qn, stride_qh, stride_wr,
    stride_wh, stride_om,
    NEXT_N: tl.constexpr, G: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr,
    D: tl.constexpr, BLOCK_SIZE: tl.constexpr, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr,
    LOOP_STAGES: tl.constexpr, FP8_DOT: tl.constexpr = False,
):
    i_b = tl.program_id(0)
    i_g = tl.program_id(1)
    i_s = tl.program_id(2)
    n_programs = tl.num_programs(2)
    # the query tile: its row c (the product's column c) holds head c % BLOCK_H of the request's
    # row i_g * G + c // BLOCK_H
    o_j, o_h, m_r = rows_by_heads(i_g * G, NEXT_N, G, BLOCK_H, H)
    p_q = q_ptr + i_b.to(tl.int64) * stride_qb + o_j * stride_qn + o_h * stride_qh
    # [G * BLOCK_H, D], without the decoders' unit (folded into the keys' scales, with k's)
    b_q = e4m3_rows_operand(p_q, m_r, D, FP8_CVT, INTERPRET, FP8_DOT)
    b_w = tl.load(w_ptr + (i_b.to(tl.int64) * NEXT_N + o_j) * stride_wr + o_h * stride_wh,
                  mask=m_r, other=0.0)  # [G * BLOCK_H]
    # the group's rows: their limits, and where their logits go
    o_gj = i_g * G + tl.arange(0, G)
    m_gj = o_gj < NEXT_N
    b_limit = tl.minimum(tl.load(limits_ptr + i_b * NEXT_N + o_gj, mask=m_gj, other=0), width)
    n_used = tl.minimum(tl.cdiv(tl.max(b_limit, axis=0), BLOCK_SIZE), n_blocks_max)
    p_out = out_ptr + (i_b.to(tl.int64) * NEXT_N + o_gj)[None, :] * stride_om  # [1, G]
    o_t = tl.arange(0, BLOCK_SIZE)
    p_table = table_ptr + i_b.to(tl.int64) * stride_tb
    # The loop is given the launch's pipeline depth itself: Triton's pipeline then copies every
    # load of the step ahead (cp.async into shared memory), the blocks' scales too, where by
    # default it takes only the loads that feed the product (the values, and the table entries
    # their addresses come from) and leaves the scales a load waited for in the step (run 281:
    # the largest stall). SASS, every target, Triton 3.8 and 3.9: no plain global load left in
    # the loop (Triton 3.3 still leaves the scales a load in the step: slower, not wrong).
    # Against the scales loaded a block ahead into registers (shipped before; its register copy
    # at the step's end still waited for the load: run 289's profile) 1.00-1.06x at 8K-128K
    # contexts, within 0.1 us on the shortest (H100, run 293).
    for i_blk in tl.range(i_s, n_used, n_programs, num_stages=LOOP_STAGES):
        blk = tl.load(p_table + i_blk).to(tl.int64)
        p_blk = cache_ptr + blk * stride_cb
        # [BLOCK_SIZE, D]: every position of a block is read (the mask is all true)
        b_k = e4m3_rows_operand(p_blk + o_t * D, o_t < BLOCK_SIZE, D, FP8_CVT, INTERPRET, FP8_DOT)
        b_scale = tl.load(_scales_at(cache_ptr, blk, stride_cb, o_t, BLOCK_SIZE * D))
        b_scale = e4m3_unit(e4m3_unit(b_scale, FP8_CVT), FP8_CVT)  # [BLOCK_SIZE]
        o_p = i_blk * BLOCK_SIZE + o_t
        b_s = tl.maximum(mma(b_k, tl.trans(b_q), INTERPRET), 0.0) * b_w[None, :]
        b_l = tl.sum(tl.reshape(b_s, [BLOCK_SIZE, G, BLOCK_H]), axis=2) * b_scale[:, None]
        tl.store(p_out + o_p[:, None], b_l, mask=o_p[:, None] < b_limit[None, :])


@triton.jit
def _scales_at(cache_ptr, blk, stride_cb, o_t, VALUES: tl.constexpr):
    """Pointers to the fp32 scales ``o_t`` of cache block ``blk`` (``stride_cb`` bytes apart),
    which follow the block's ``VALUES`` bytes of values."""
    p_scales = (cache_ptr + blk * stride_cb + VALUES).to(tl.pointer_type(tl.float32), bitcast=True)
    return p_scales + o_t


def tile(next_n: int, n_heads: int) -> tuple[int, int, int]:
    """``(G, BLOCK_H, num_warps)``: rows per program, the head tile, warps."""
    block_h = max(16, next_power_of_2(n_heads))
    g = max(1, min(next_power_of_2(next_n), MAX_COLUMNS // block_h))
    return g, block_h, NUM_WARPS


def resident_programs(fp8_products: bool, columns: int) -> int:
    """Programs of a tile of ``columns`` (``G * BLOCK_H``) one SM holds (:data:`RESIDENT`)."""
    return RESIDENT["fp8" if fp8_products else "fp16"][min(max(columns, 64), 128)]


def register_cap(per_sm: int, num_warps: int) -> int:
    """Registers a thread may use so that ``per_sm`` programs of ``num_warps`` warps fit one SM's
    64K (allocated 8 a thread at a time; at most 255): the launch's ``maxnreg``, which makes a
    count of :data:`RESIDENT` hold whatever a target's compiler would have chosen (sm100 under
    Triton 3.6 chose 176 for the 128-column tile, where 3 programs fit at 168)."""
    return min(255, 65536 // (per_sm * 32 * num_warps) // 8 * 8)


def launch_paged_mqa_logits(q8, kv_cache, weights, limits, block_tables, out, *, family,
                            sm_count, fp8_cvt, interpret):
    """Run :func:`paged_mqa_logits_kernel`: ``q8 [B, NEXT_N, H, D]`` float8_e4m3fn bytes (uint8),
    ``kv_cache`` uint8 ``[num_blocks, block_size, 1, D + 4]``, ``weights [B * NEXT_N, H]`` fp32,
    ``limits [B * NEXT_N]`` int32, ``block_tables [B, max_blocks]`` int32, into
    ``out [B * NEXT_N, W]`` fp32, with ``family``'s pipeline depth (:data:`NUM_STAGES`). Each
    request's blocks are spread over as many programs as fill the SMs once
    (:func:`resident_programs`), not more."""
    batch, next_n, n_heads, d = q8.shape
    block_size = kv_cache.shape[1]
    n_blocks_max = min(block_tables.shape[1], cdiv(out.shape[1], block_size))
    if batch == 0 or n_blocks_max == 0:
        return out
    g, block_h, num_warps = tile(next_n, n_heads)
    groups = cdiv(next_n, g)
    products_fp8 = fp8_dot(fp8_cvt, interpret)
    per_sm = PROGRAMS_PER_SM or resident_programs(products_fp8, g * block_h)
    programs = max(1, min(n_blocks_max, per_sm * sm_count // (batch * groups)))
    stages = NUM_STAGES[family]
    launch(
        paged_mqa_logits_kernel, (batch, groups, programs),
        q8, kv_cache, weights, limits, block_tables, out,
        n_blocks_max, out.shape[1], kv_cache.stride(0), block_tables.stride(0),
        q8.stride(0), q8.stride(1), q8.stride(2), weights.stride(0), weights.stride(1),
        out.stride(0),
        NEXT_N=next_n, G=g, H=n_heads, BLOCK_H=block_h, D=d, BLOCK_SIZE=block_size,
        FP8_CVT=fp8_cvt, INTERPRET=interpret, FP8_DOT=products_fp8, LOOP_STAGES=stages,
        num_warps=num_warps,
        num_stages=stages, maxnreg=register_cap(per_sm, num_warps),
        **LAUNCH_OPTIONS,
    )
    return out
