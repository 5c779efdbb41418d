"""Indexer logits of prefill rows over a contiguous key range (vLLM's ``fp8_mqa_logits``).

Query row ``i`` sees keys ``[row_starts[i], row_ends[i])`` of one gathered ``k [N, D]``; its
logits are stored from column 0 (``out[i, n - row_starts[i]]``). In a prefill chunk neighbouring
rows belong to the same sequence, so their ranges nearly coincide: a program takes ``BLOCK_M``
rows, walks the union of their ranges ``BLOCK_N`` keys at a time, and for each key tile runs one
``[BLOCK_M, D] x [D, BLOCK_N]`` product per head, summing ``weights * relu(.)`` over the heads
before one masked store. That per-head kernel serves the families whose tensor cores take their
operands from registers (``mma.sync``: SM80/86/89/120); SM90/100 run :mod:`.flat_heads`'s
(:data:`HEADS_ALONG_N`).

q and k are read as float8_e4m3fn bytes. On SM89 and newer the products take them as they are, on
the fp8 tensor cores (:data:`FP8_DOT`); on SM80/86 they are read in 32-bit words and converted
to fp16 by moving bits (kernels/common.e4m3_words_to_f16; every e4m3 value is an fp16 value, so
the products are exact and accumulate in fp32), a key tile once for all heads and a query tile
once per key tile. No workspace: vLLM's memory profile does not count one. q's and k's rows
must start at 4-byte aligned addresses.
"""

import os
from typing import NamedTuple

import triton
import triton.language as tl

from ..hostmath import cdiv
from ..kernels.common import LAUNCH_OPTIONS, e4m3_rows_operand, e4m3_unit, mma
from ..kernels.launch import launch
from . import flat_heads
from .knobs import tile_knob
from .rows import key_programs, key_ranges

# The products run on the fp8 tensor cores where the hardware has them (SM89 and newer): q and k
# as loaded, half the MMA instructions of fp16 operands (QMMA.16832 against HMMA.16816 on sm89).
# The products are exact either way; the fp8 tensor cores accumulate with fewer bits than fp32
# (as DeepGEMM's kernels, which vLLM runs on SM90/100, do). Measured on an H200 (run 267,
# BENCHMARKS.md "The indexer on the fp8 tensor cores"): prefill 1.4-1.8x and decode up to 1.3x
# faster, relative error (norm) at most 1.7e-4 against float64 (1.3e-7 with fp16 operands).
# TSM_INDEXER_FP8_DOT=0 keeps fp16 operands everywhere.
FP8_DOT = os.environ.get("TSM_INDEXER_FP8_DOT", "1") != "0"


def fp8_dot(fp8_cvt: int, interpret: bool) -> bool:
    """Whether the indexer's products run on the fp8 tensor cores: with :data:`FP8_DOT`, where
    the hardware converts e4m3 (SM89 and newer), not under the interpreter."""
    return FP8_DOT and fp8_cvt == 1 and not interpret


# Which prefill kernel a family runs. SM90/100: :mod:`.flat_heads` (all heads along the
# product's N), measured 1.3-1.6x faster than the per-head kernel on sm90 with its first tile
# (H200, run 272) and 1.04-1.3x faster again with the shipped one (H100, run 275).
# SM80/86/89/120 (mma.sync; not measured, no such GPU here): the per-head kernel, which counted
# fewer instructions per multiply-add in the SASS (Triton 3.8): sm89 1520 against 2284 a
# million, sm80 2368 against 3120; the heads-along-N tile's head sum there takes a shuffle and
# an add per value, where the per-head kernel's accumulates with one FFMA. Both carry the same
# tensor-core work, which likely bounds either on those GPUs. TSM_INDEXER_HEADS_ALONG_N=1 or 0
# (a measurement knob) sets every family's.
HEADS_ALONG_N = {"sm90": True, "sm100": True, "sm80": False, "sm86": False}
if os.environ.get("TSM_INDEXER_HEADS_ALONG_N") in ("0", "1"):
    HEADS_ALONG_N = dict.fromkeys(HEADS_ALONG_N, os.environ["TSM_INDEXER_HEADS_ALONG_N"] == "1")


class Tile(NamedTuple):
    """A prefill program's shape: ``block_m`` query rows, keys ``block_n`` at a time."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# The prefill tile by product path. A program reloads its q tile (block_m rows, 8 KB a head) for
# every key tile and head, so each q byte serves block_n multiply-adds; wider key tiles and more
# stages (q loads in flight across the head loop) were the levers. Measured on an H100
# (runs 270-271, BENCHMARKS.md "The prefill indexer's tile"), against (64, 64, 4, 2): fp8
# products 1.26-1.93x faster, fp16 products (with the hardware's conversion) 1.20-1.46x. All
# fit the 99 KB of SM86/89/120 (at most 64 KB, sm80/86).
TILES = {
    "fp8": Tile(block_m=64, block_n=128, num_warps=8, num_stages=4),
    "fp16": Tile(block_m=64, block_n=128, num_warps=8, num_stages=3),
}


# A measurement knob (benchmarks/device_run.sh indexer-tiles): TSM_INDEXER_TILE="BLOCK_M,
# BLOCK_N,NUM_WARPS,NUM_STAGES" replaces both tiles.
if os.environ.get("TSM_INDEXER_TILE"):
    TILES = dict.fromkeys(TILES, tile_knob("TSM_INDEXER_TILE", TILES["fp8"]))


def tile(fp8_products: bool) -> Tile:
    """The prefill tile for fp8 (``fp8_products``) or fp16 products."""
    return TILES["fp8" if fp8_products else "fp16"]


# Not specialized, so that indexer.warmup's call compiles what serving runs: the sizes, the
# output's row stride (the width) and the row ranges' addresses (vLLM 0.34 passes slices of them
# at any offset). q's and the weights' row strides (H D, H) stay specialized: q's rows are then
# known 16-byte aligned and load as vectors.
@triton.jit(do_not_specialize=["n_rows", "n_keys", "width", "stride_om", "starts_ptr", "ends_ptr"])
def mqa_logits_kernel(
    q_ptr, k_ptr, k_scale_ptr, w_ptr, starts_ptr, ends_ptr, out_ptr,
    n_rows, n_keys, width,
    stride_qm, stride_qh, stride_kn, stride_wm, stride_wh, stride_om,
    H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr, FP8_DOT: tl.constexpr = False,
):
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    n_programs = tl.num_programs(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_m = o_m < n_rows
    b_lo, b_hi, lo, hi = key_ranges(starts_ptr, ends_ptr, o_m, m_m, n_keys, width)
    p_q = q_ptr + o_m.to(tl.int64) * stride_qm  # [BLOCK_M] row byte pointers
    p_w = w_ptr + o_m.to(tl.int64) * stride_wm
    p_out = out_ptr + o_m.to(tl.int64)[:, None] * stride_om
    for n0 in range(lo + i_n * BLOCK_N, hi, n_programs * BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        m_n = o_n < hi
        # [BLOCK_N, D], without the decoders' unit (folded into the keys' scales below, twice:
        # q's and k's)
        b_k = e4m3_rows_operand(k_ptr + o_n.to(tl.int64) * stride_kn, m_n, D, FP8_CVT, INTERPRET,
                                FP8_DOT)
        b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for h in range(H):
            b_q = e4m3_rows_operand(p_q + h * stride_qh, m_m, D, FP8_CVT, INTERPRET,
                                    FP8_DOT)  # [BLOCK_M, D]
            b_w = tl.load(p_w + h * stride_wh, mask=m_m, other=0.0)
            b_s = mma(b_q, tl.trans(b_k), INTERPRET)  # [BLOCK_M, BLOCK_N]
            b_acc += tl.maximum(b_s, 0.0) * b_w[:, None]
        b_scale = tl.load(k_scale_ptr + o_n, mask=m_n, other=0.0)
        b_acc *= e4m3_unit(e4m3_unit(b_scale, FP8_CVT), FP8_CVT)[None, :]
        m_out = (m_m[:, None] & (o_n[None, :] >= b_lo[:, None]) & (o_n[None, :] < b_hi[:, None]))
        tl.store(p_out + (o_n[None, :] - b_lo[:, None]), b_acc, mask=m_out)


def launch_mqa_logits(q8, k8, k_scale, weights, row_starts, row_ends, out, *, family, sm_count,
                      fp8_cvt, interpret):
    """Run the prefill kernel of ``family`` (:data:`HEADS_ALONG_N`): ``q8 [M, H, D]`` and
    ``k8 [N, D]`` float8_e4m3fn bytes (uint8), ``k_scale [N]`` and ``weights [M, H]`` fp32,
    ``row_starts``/``row_ends`` ``[M]`` int32, into ``out [M, W]`` fp32. The key axis is split
    over enough programs to give each SM about two."""
    n_rows, n_heads, d = q8.shape
    if n_rows == 0 or out.shape[1] == 0:
        return out
    products_fp8 = fp8_dot(fp8_cvt, interpret)
    if HEADS_ALONG_N[family]:
        return flat_heads.launch(q8, k8, k_scale, weights, row_starts, row_ends, out,
                                 sm_count=sm_count, fp8_cvt=fp8_cvt, interpret=interpret,
                                 fp8_products=products_fp8)
    t = tile(products_fp8)
    row_blocks = cdiv(n_rows, t.block_m)
    launch(
        mqa_logits_kernel, (row_blocks, key_programs(out.shape[1], t.block_n, row_blocks, sm_count)),
        q8, k8, k_scale, weights, row_starts, row_ends, out,
        n_rows, k8.shape[0], out.shape[1],
        q8.stride(0), q8.stride(1), k8.stride(0), weights.stride(0), weights.stride(1),
        out.stride(0),
        H=n_heads, D=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, FP8_CVT=fp8_cvt, INTERPRET=interpret,
        FP8_DOT=products_fp8, num_warps=t.num_warps, num_stages=t.num_stages, **LAUNCH_OPTIONS,
    )
    return out
