"""Launch configurations: named tables per architecture family, and the split-K rule.

Every choice here depends only on shapes (T, H, K), row format and the device, never on index
values or lengths, so a CUDA graph captured around a call stays valid when indices change.

Families and their shared-memory limit per block:

* ``sm90``: SM90 (H100/H200), 227 KB.
* ``sm100``: SM100/SM103 (B200/B300), 227 KB.
* ``sm80``: SM80 (A100), 163 KB.
* ``sm86``: SM86, SM87, SM89, SM120, SM121 (RTX 30xx/40xx/50xx, RTX PRO 6000, GB10), 99 KB.

Provenance is noted above each table.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from .hostmath import cdiv, next_power_of_2


@dataclass(frozen=True)
class TileConfig:
    """Tile shape of the main kernel: heads and rows per tile, warps, pipeline stages; and
    whether the probabilities reach the PV dots through a per-SM scratch slot in global memory
    (``exchange_p``: see kernels/attention.py; only for tiles that keep one program per SM)."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    exchange_p: bool = False
    # Load each tile's row ids a step ahead (kernels/attention.py). On by default: every 2-stage
    # tile timed with it won, 1.01-1.14x (sm90 tiles, and the sm86 tiles at SM120's residency,
    # H200, 2026-12-01, runs 32 and 34: sweep.py and residency.py --toggle prefetch_idx,
    # BENCHMARKS.md "Row ids a step ahead"), and it leaves each 2-stage tile's shared memory
    # unchanged on every family (compiled by Triton 3.6). Off where a tile measured slower.
    prefetch_idx: bool = True
    # fp8_ds_mla rows dequantized into fp16 operands (q, rows and probabilities in fp16, q
    # scaled by 2^-8), one packed multiply per two values: 705 instead of 929 instructions per
    # step in the loop of the sm90 16-head fp8 tile (SASS, Triton 3.6). Timed (H200,
    # 2026-12-01, runs 39-40, BENCHMARKS.md "fp8 rows into fp16 operands"): 1.01-1.02x on the
    # sm90 16- and 32-head tiles, 1.05-1.09x on the sm86 tiles at SM120's residency, 0.70x on
    # the 64-head exchange tile (it spills). No effect on bf16/fp16 rows. Where the Gluon
    # kernel runs a tile (``gluon``), its fp8 path likewise: 890 instead of 1142 instructions
    # per step, 1.03-1.05x (H200, 2026-12-01, run 73, BENCHMARKS.md "The Gluon tile: fp16
    # operands and a producer warpgroup"); the Triton tile such a tile falls back to runs
    # without it (``triton_fp8_f16``).
    fp8_f16: bool = False
    # fp8_ds_mla rows loaded into registers a step ahead instead of staged in shared memory by
    # the software pipeline (kernels/attention.py, ROWS_AHEAD): the raw bytes skip the round
    # trip through shared memory, and one tile is in flight while the program computes
    # another (num_stages then changes nothing: no pipelined load is left). It costs about 50
    # registers per thread (the 16x32 tile: 240-254 of 255, compiled by Triton 3.6 for sm86 to
    # sm120) and frees the stages' shared memory (16x32: 55 KB instead of 73-94). Where it is
    # on, see the tables below. No effect on bf16/fp16 rows.
    rows_ahead: bool = False
    # With rows_ahead: the next tile's loads issued before this tile's QK products instead of
    # after them. On sm90's 3-stage 16-head decode tile 0.99-1.00x against no rows_ahead where
    # the late placement is 0.91-0.93x, but 1.5% slower than the late one at T=4 (H200,
    # 2026-12-01, run 66, then a temporary switch). Not timed at SM120's residency.
    rows_early: bool = False
    # The scores and softmax computed inside a region of their own (kernels/attention.py,
    # SCORES_APART), so Triton lays the score dots out for themselves (the 64-head tile: each
    # warpgroup half of the rows, 36 QK wgmma per step instead of 72) and moves the
    # probabilities to the PV dots through shared memory. Replaces ``exchange_p``'s scratch
    # slot in global memory where set. Experimental: on in no table yet.
    scores_apart: bool = False
    # Run the Gluon kernels (kernels/gluon_sm90.py) where they apply: an SM90 device, Triton
    # 3.6 to 3.9 (kernels.attention.GLUON_TRITON), a 576-column q, bf16 (or fp16 with fp16
    # rows), a cache aligned to 16; see kernels.attention.gluon_applies. Elsewhere (other
    # GPUs, the interpreter, a NoPE q, an unaligned cache) the planner takes the tile's
    # ``without_gluon`` tile for the Triton kernel (``fallback``, else the same shape). Two
    # shapes: 64 heads x 64 rows with 8 warps, and 8, 16 or 32 heads x 64 rows with 4 warps
    # (kernels/gluon_narrow.py: heads along the wgmma's N; one program per SM, as
    # ``programs_per_sm`` counts every Gluon tile). Every Gluon kernel gathers its rows in
    # producer warps that hand the tiles over through mbarriers (over fp8_ds_mla rows they
    # also dequantize, in place in the operand slot: kernels/gluon_fp8_producer.py, 1.22x at
    # 64 and 1.25x at 128 heads on decode T=128 over the Gluon kernel without producer warps,
    # H200, 2026-12-02, run 98; over bf16 rows 1.05-1.07x, runs 75-76).
    gluon: bool = False
    # With ``gluon``: 8 producer warps instead of 4 (passes of 16 rows, half the passes per
    # warp; the consumers at 232 registers instead of 240, no spills, Triton 3.6 and 3.8).
    # bf16 rows, beside the 64-head lockstep consumers (a kernel since replaced by
    # ``pingpong``'s): 1.00-1.04x, 1.16x with random lengths (H200, 2026-12-02, run 87).
    # fp8_ds_mla rows: 0.95-0.96x with the whole-tile conversion (run 97: at 24
    # registers the dequantizing producer spills), not timed with the passes; off. On the
    # few-head fp8 tiles (producer at 128 registers, no spills, half the producer's
    # instructions per warp): 0.96-0.98x in decode, 1.03x in prefill over 32K rows (H200,
    # 2026-12-03, run 140); off.
    wide_producer: bool = False
    # With ``gluon`` and 64 heads: the two consumer warpgroups on alternate tiles, the output's
    # columns split between them (kernels/gluon_pingpong.py), so that one's score dots run
    # during the other's softmax; its producer has 4 warps (not with ``wide_producer``).
    # bf16/fp16 rows; fp8_ds_mla rows ignore it. 1.03-1.22x of the lockstep producer kernel
    # with 8 producer warps in decode T=32/128 and prefill T=4096, 64 and 128 heads (H200,
    # 2026-12-03, run 153; BENCHMARKS.md "The alternate-tile kernel shipped");
    # shipped (sm90's _G64).
    pingpong: bool = False
    # With ``gluon``, fp8_ds_mla rows and 8 or 16 heads: the consumer warpgroup (one per
    # program, two programs per SM) runs the score dots as e4m3 wgmmas on the rows' raw bytes
    # in shared memory and converts the bytes into the PV dots' register operands; the
    # producer only copies, into two 41 KB slots (kernels/gluon_fp8_regs.py).
    # Against the shipped few-head tile (H100, 2026-12-07, run 332): prefill T=4096 over 32K
    # rows 1.17-1.18x, over 1M rows 0.98x, decode T=128-512 0.96-0.99x. On in sm90's prefill
    # table up to 16 heads (_N8_REGS, _N16_REGS), where it also beats the bf16 workspace (runs
    # 335 and 343), and, since its later changes, in the decode table too (runs 387-388).
    fp8_regs: bool = False
    # With ``gluon``: the Triton tile a call runs where the Gluon kernel does not apply
    # (``without_gluon``; the planner decides it per call, kernels.attention.gluon_applies).
    # None: the same shape with the Gluon-only fields off.
    fallback: "TileConfig | None" = None

    def without_gluon(self) -> "TileConfig":
        """The tile for the Triton kernel: ``fallback`` where set, else the same shape with
        ``gluon`` off, and with it every field only the Gluon kernels read (each of which
        requires ``gluon``), ``fp8_f16`` as the Triton kernel ran it
        (``triton_fp8_f16``)."""
        if self.fallback is not None:
            return self.fallback
        return dataclasses.replace(self, gluon=False, wide_producer=False, pingpong=False,
                                   fp8_regs=False, fp8_f16=self.triton_fp8_f16)

    @property
    def triton_fp8_f16(self) -> bool:
        """``fp8_f16`` as the Triton kernel runs this tile: off where the tile names the Gluon
        kernel, whose fallback (the exchange tile) is 0.70x with it."""
        return self.fp8_f16 and not self.gluon

    def __post_init__(self):
        shape = (self.block_h, self.block_n, self.num_warps)
        narrow = shape in ((8, 64, 4), (16, 64, 4), (32, 64, 4))
        if self.gluon and shape != (64, 64, 8) and not narrow:
            raise ValueError(f"gluon: the Gluon kernels have two tiles, 64 heads x 64 rows with 8 "
                             f"warps, and 8, 16 or 32 heads x 64 rows with 4 warps, got "
                             f"{self.block_h} x {self.block_n} with {self.num_warps}")
        for name in ("wide_producer", "pingpong", "fp8_regs"):
            if getattr(self, name) and not self.gluon:
                raise ValueError(f"{name}: only the Gluon kernels read it; set gluon too")
        if self.pingpong and self.wide_producer:
            raise ValueError("pingpong: the alternate-tile Gluon kernel's producer has 4 warps; "
                             "unset wide_producer")
        if self.fp8_regs and self.block_h not in (8, 16):
            raise ValueError(f"fp8_regs: the kernel has tiles of 8 or 16 heads, got {self.block_h}")
        if self.fp8_regs and self.wide_producer:
            raise ValueError("fp8_regs: the kernel's producer has 4 warps; unset wide_producer")
        if self.fallback is not None and (self.fallback.gluon or not self.gluon):
            raise ValueError("fallback: a Triton tile (gluon off) for a tile with gluon")

    @property
    def scratch_exchange(self) -> bool:
        """Whether the probabilities go through the per-SM scratch slot (``exchange_p``, unless
        ``scores_apart`` does the same through the compiler's shared memory)."""
        return self.exchange_p and not self.scores_apart


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launcher needs beyond the tensors."""

    tile: TileConfig
    splits: int
    fp8_cvt: int  # see fp8_cvt_level
    pin_conversion: bool = True  # see pin_fp8_conversion


SMEM_LIMIT = {"sm90": 227 * 1024, "sm100": 227 * 1024, "sm80": 163 * 1024, "sm86": 99 * 1024}

# The compile targets checked for each family (capability as major*10 + minor).
FAMILY_TARGETS = {"sm90": (90,), "sm100": (100,), "sm80": (80,), "sm86": (86, 89, 120)}

# Phases: "latency" (T <= LATENCY_MAX_TOKENS and, where the family sets one, T x H <=
# LATENCY_MAX_TOKEN_HEADS: few tokens, so many small programs win),
# "decode" (T <= DECODE_MAX_TOKENS) and "prefill". Format kinds: "plain" (bf16/fp16 rows) and
# "fp8" (fp8_ds_mla). Each entry lists (largest head count, tile) pairs; the first whose head
# count covers H applies.
LATENCY_MAX_TOKENS = 8
# sm90: past 192 token-heads the 16-head latency tiles re-gather (and for fp8_ds_mla
# re-dequantize) every row once per 16 heads, and the 64-head exchange_p tile of the decode
# table wins: 1.07-1.30x (bf16) and 1.09-1.68x (fp8_ds_mla) at T=2-8 with 32-128 heads, within
# 2.5% where it loses (H200, 2026-12-01, sweep.py --latency, BENCHMARKS.md "Latency phase").
# Other families: not measured, no limit.
LATENCY_MAX_TOKEN_HEADS = {"sm90": 192}
DECODE_MAX_TOKENS = 512
_ANY = 1 << 30
C = TileConfig

# sm90: measured on an H200 (132 SMs, torch 2.11, Triton 3.6) on 2026-11-29 by
# benchmarks/sweep.py (BENCHMARKS.md, "tuning sweep"): per workload the fastest candidate.
# The fp8 rows were re-measured on 2026-12-01 after fp8 tiles were dequantized at load
# (BENCHMARKS.md, "fp8_ds_mla tiles after dequantizing at load"): 64x64 tiles for 64+ heads
# (1.17-1.32x over 64x32) and a third stage for 16-head decode tiles (2-4%).
# The 64-head tile with exchange_p: 1.07-1.18x over the same tile without, in every decode
# (T=32-512) and prefill (T=4096) workload of 64 and 128 heads, bf16 and fp8_ds_mla (H200,
# 2026-12-01, sweep.py --exchange, BENCHMARKS.md "exchange_p"). sm90 only: Triton 3.6 does not
# compile it for sm100. prefetch_idx (row ids loaded a step ahead; TileConfig): 1.02-1.07x on
# the 64-head tile, 1.13x on the 16-head fp8 decode tile, 1.05-1.14x on the 32-head and 16-head
# prefill tiles; the 3-stage 16-head bf16 decode tile is 3% slower with it (its shared memory
# grows from 93 to 164 KB, one program per SM), so it runs without.
# rows_ahead (fp8_ds_mla rows in registers a step ahead; TileConfig): 1.10-1.11x on the fp8
# latency tiles (T=4 H=16, T=1 H=128) and 1.06x on the 16-head fp8 prefill tile; 0.91-0.93x
# on the 3-stage 16-head decode tile (0.99-1.00x with the loads issued before the scores, run
# 66: never faster), 1.00x on the 32-head one and 0.82x on the exchange tile (spills), which
# run without (H200, 2026-12-01, runs 63-66, sweep.py --toggle rows_ahead, BENCHMARKS.md "fp8
# rows a step ahead").
# The Gluon tile (TileConfig.gluon; where it does not run, the exchange_p tile it names):
# 1.18-1.41x over the exchange_p tile on bf16 rows and 1.18-1.22x on fp8_ds_mla rows, decode
# T=32-512 and prefill T=4096, 64 and 128 heads (H200, 2026-12-01, run 67, its prototype;
# BENCHMARKS.md "The Gluon tile").
# Its bf16/fp16 rows gathered by a producer warpgroup: 1.05-1.07x on decode
# T=32 and T=128 and on prefill T=4096, 64 and 128 heads (H200, 2026-12-01, runs 75-76).
# racecheck's reports on it lie in Triton's hand-over to the partitions, and it reports the
# same on a kernel with no shared memory of its own (run 80; BENCHMARKS.md "The producer
# warpgroup shipped").
# With 8 producer warps (wide_producer): 1.02-1.04x on decode T=32 and T=128 (1.16x with random
# lengths), 1.00-1.02x on prefill T=4096, 64 and 128 heads (H200, 2026-12-02, run 87;
# BENCHMARKS.md "Eight producer warps").
# Its two consumer warpgroups on alternate tiles instead of in lockstep (pingpong, with a
# producer of 4 warps; kernels/gluon_pingpong.py): against the lockstep tile with 8 producer
# warps, 1.08x at T=128 H=64 (1.16x with random lengths), 1.17x at T=128 H=128, 1.08x at T=32
# H=128 (1.03x at T=32 H=64 with random lengths), 1.19x and 1.22x in prefill T=4096 over 32K
# rows with 64 and 128 heads, 1.12x over 1M rows (H200, 2026-12-03, run 153; BENCHMARKS.md "The
# alternate-tile kernel shipped").
_G64 = C(64, 64, 8, 2, exchange_p=True, gluon=True, pingpong=True)
# Its fp8_ds_mla rows into fp16 operands (fp8_f16): 1.03-1.05x on decode T=32-512, 64 and 128
# heads (H200, 2026-12-01, run 73). Gathered and dequantized by a producer warpgroup of 4 warps
# (kernels/gluon_fp8_producer.py), converting in passes of 16 rows: decode T=128
# 1.22x at 64 heads and 1.25x at 128 (H200, 2026-12-02, run 98; with the tile converted whole
# after its last copy, 1.02x and 1.06x, run 97). Its decode rows with 64 and 128 heads, T=4-512,
# against run 89's table (another run): 1.01-1.31x (BENCHMARKS.md "A producer that dequantizes").
_G64_F16 = C(64, 64, 8, 2, exchange_p=True, gluon=True, fp8_f16=True)
# fp8_ds_mla decode with 17-32 heads (with 8-16 until 2026-12-07, when _N8_REGS and _N16_REGS
# below, built on these, took over): the few-head Gluon tiles (kernels/gluon_narrow.py: rows
# along the wgmma's M, heads along N, one consumer warpgroup; the dequantizing producer of
# _G64_F16). Against the Triton tiles they replace (16x32 with 3 stages, 32x32), decode T=32-512:
# 1.25-1.46x at 8 and 16 heads, 1.89x at 32 (T=128); FlashMLA's fp8 kernel (heads padded to
# 64) 1.41x slower at T=128 H=16 (H200, 2026-12-02, runs 102-104; BENCHMARKS.md "Few heads
# along N"); since then its raw halves of odd rows swapped, conflict-free conversion stores:
# 1.06-1.11x more (run 110). At T <= 8 the latency tiles stay (13.1 against 13.9 us at T=4
# H=16). Where the Gluon kernel does not apply (kernels.attention.gluon_applies) the Triton
# tiles they replaced run instead (``fallback``). In prefill too (below workspace.MIN_TOKENS,
# and above it where the workspace does not pay: workspace.MIN_REUSE_GLUON): T=4096 H=16 over
# 32K rows 2053 us against the 16x32 Triton tile's 3103, 1.51x (H200, 2026-12-02, runs 117-118).
_N16 = C(16, 64, 4, 2, fp8_f16=True, gluon=True, fallback=C(16, 32, 4, 3, fp8_f16=True))
# Up to 8 heads the same tile with N = 8 (no padding heads: half the score and output
# operands' B reads, softmax work and accumulators of the 16-head tile): against _N16 on the
# same inputs 1.04x at T=32, 1.044x at T=128 (66.8 against 69.7 us), 1.054x at T=512, 1.05x
# with random lengths and in prefill over 1M rows (H200, 2026-12-04, run 184).
_N8 = dataclasses.replace(_N16, block_h=8)
# Prefill (T > 512) up to 8 heads (16: _N16_REGS below): the same tile with consumers that
# convert the raw e4m3 rows into register operands (kernels/gluon_fp8_regs.py), kept in the
# kernel at every reuse (workspace.MIN_REUSE_GLUON). Each against its baseline in one run, on
# an H100 (2026-12-07, runs 332, 335-336; BENCHMARKS.md "Raw e4m3 rows into register
# operands"): over 32K rows 1.18x over _N8 in the kernel (T=4096), and 1.13x, 1.10x, 1.18x over the bf16 workspace at
# T=4096, 16384, 1024 (1479 against 1667 us at T=4096; 1.90x of FlashMLA there, against
# 1.68-1.69x through the workspace in runs 315 and 317); over 1M rows as _N8 (1.63-1.64x of
# FlashMLA against 1.62-1.65x in runs 315 and 317). Its producer with the ids a step ahead
# (runs 337-339): 1.03-1.09x more, GLM-5 TP8's rows 1.98x (T=4096) and 2.01x (T=16384) of
# FlashMLA over 32K rows, 1.75-1.76x over 1M. With two rows per copy instruction
# (gluon_fp8_regs.COPY_ROWS, runs 341-344) 1.04-1.05x more at 8 heads (GLM-5 TP8's rows 2.07x
# and 2.11x over 32K rows, 1.84-1.87x over 1M) and 1.08x at 16, where it now beats the bf16
# workspace at every reuse measured: 1.045x at T=1024, 1.007x at T=4096 (1581 against 1592
# us), 1.07x at T=16384 over 32K rows, 1.35x in a 64K-row window, 1.87x over 1M rows (run
# 343), so it runs up to 16 heads too (_N16_REGS). Its score dots as e4m3 wgmmas on the raw
# tiles in shared memory: 1.012-1.014x more at 16 heads, 1.003x at 8 (runs 363-364). One
# consumer warpgroup per program, two programs per SM: 1.037x more at 16 heads, 1.051x at 8
# (T=4096 over 32K rows, run 366). The last PV dots issued a step later, 1.010x and 1.002x
# (run 377); the PV operand's K pairs by byte permutes, 1.017x and 1.036x (run 381); the last
# tile's raw words carried into the next step instead of its converted fragment, 1.006x and
# 1.017x (run 385). Not yet timed on an H200.
# In decode (T = 9-512) too, split for one program per SM (split_rule), against _N8 and _N16
# in one call each over 1M rows, two rounds (H100, 2026-12-07, runs 387-388; BENCHMARKS.md
# "fp8_regs in decode, split for one program per SM"): 8 heads 1.04x at T=32, 1.08x at
# T=128, 1.12x at T=512, 1.07-1.24x with random lengths; 16 heads 0.95x at T=32 (29.6
# against 28.0 us; 0.98x with random lengths), 1.06x at T=128, 1.11x at T=512, 1.12-1.19x
# with random lengths. Its output since stored 4 columns a thread (gluon_fp8_regs.
# regs_epilogue): T=32 with 16 heads 26.2 against 29.6 us (run 396), below run 388's 28.0 of
# _N16.
_N8_REGS = dataclasses.replace(_N8, fp8_regs=True)
_N16_REGS = dataclasses.replace(_N16, fp8_regs=True)
_N32 = C(32, 64, 4, 2, fp8_f16=True, gluon=True, fallback=C(32, 32, 4, 2, fp8_f16=True))
# bf16/fp16 rows with 17-32 heads: the 64-head alternate-tile kernel, the heads past H masked
# (q's zero-filled, their output and lse not stored: a Gluon tile keeps its 64 rows, the
# wgmma's smallest M), instead of the 32x64 Triton tile (mma.sync: Triton gives tiles of fewer
# than 64 heads no wgmma). Against that tile, on the same inputs through the public API (H200,
# 2026-12-03, run 168, benchmarks/mid_heads.py; BENCHMARKS.md "17-32 heads on the 64-head
# tile"): decode T=8-512 with 32 heads 1.16-1.33x (1.53x with random lengths), T=128 with 20
# heads 1.50x; prefill T=4096/16384 1.24-1.27x over 32K and 1M rows. Where the Gluon kernels do
# not apply, that Triton tile (``fallback``).
_G64_32 = dataclasses.replace(_G64, fallback=C(32, 64, 4, 2))
# bf16/fp16 rows with 1-16 heads: the few-head Gluon tile (kernels/gluon_narrow_plain.py: the
# consumers of _N8/_N16, the plain rows copied by the 64-head kernels' producer), N = 8 up to 8
# heads. Against the Triton tiles they replace, on the same inputs (H200, 2026-12-04, run 187):
# decode T=128 1.13x (8 heads, 84.5 -> 75.0 us) and 1.15x (16), T=32 1.23x, T=512 1.04x, random
# lengths 1.29x; prefill T=4096 over 32K rows 1.21x (8 heads) and 1.09x (16), over 1M rows 1.03x.
# Where the Gluon kernels do not apply, those Triton tiles (``fallback``).
_P8 = C(8, 64, 4, 2, gluon=True, fallback=C(16, 64, 4, 3, prefetch_idx=False))
_P16 = dataclasses.replace(_P8, block_h=16)
_P8_PREFILL = dataclasses.replace(_P8, fallback=C(16, 64, 4, 2))
_P16_PREFILL = dataclasses.replace(_P8_PREFILL, block_h=16)
_SM90 = {
    ("latency", "plain"): ((_ANY, C(16, 64, 4, 2)),),
    ("latency", "fp8"): ((16, C(16, 32, 4, 2, fp8_f16=True, rows_ahead=True)),
                        (_ANY, C(16, 64, 8, 2, rows_ahead=True))),
    ("decode", "plain"): ((8, _P8), (16, _P16), (32, _G64_32), (_ANY, _G64)),
    ("decode", "fp8"): ((8, _N8_REGS), (16, _N16_REGS), (32, _N32), (_ANY, _G64_F16)),
    ("prefill", "plain"): ((8, _P8_PREFILL), (16, _P16_PREFILL), (32, _G64_32), (_ANY, _G64)),
    ("prefill", "fp8"): ((8, _N8_REGS), (16, _N16_REGS), (32, _N32), (_ANY, _G64_F16)),
}
# sm80 (163 KB), sm86 (99 KB) and sm100: not measured on their GPUs (none is available here).
# They are the sm90 shapes, cut down where the compiled kernel overflows the family's shared
# memory (tests/test_portability.py compiles every entry for every target). sm100 compiles to a
# different matrix path whose buffers are larger, hence its smaller row tiles.
_SMALL_SMEM = {
    ("latency", "plain"): ((_ANY, C(16, 64, 4, 2)),),
    ("latency", "fp8"): ((_ANY, C(16, 32, 4, 2)),),
    ("decode", "plain"): ((16, C(16, 64, 4, 2)), (_ANY, C(32, 32, 4, 2))),
    ("decode", "fp8"): ((16, C(16, 32, 4, 2)), (_ANY, C(32, 32, 4, 2))),
    ("prefill", "plain"): ((16, C(16, 64, 4, 2)), (_ANY, C(32, 32, 4, 2))),
    ("prefill", "fp8"): ((16, C(16, 32, 4, 2)), (_ANY, C(32, 32, 4, 2))),
}
_SM80 = {
    **_SMALL_SMEM,
    ("decode", "plain"): ((16, C(16, 64, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 32, 8, 2))),
    ("decode", "fp8"): ((16, C(16, 32, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 32, 8, 2))),
    ("prefill", "plain"): ((16, C(16, 64, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 32, 8, 2))),
    ("prefill", "fp8"): ((16, C(16, 32, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 32, 8, 2))),
}
_SM100 = {
    **_SMALL_SMEM,
    ("decode", "plain"): ((16, C(16, 32, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 16, 8, 2))),
    ("decode", "fp8"): ((16, C(16, 32, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 16, 8, 2))),
    ("prefill", "plain"): ((16, C(16, 32, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 16, 8, 2))),
    ("prefill", "fp8"): ((16, C(16, 32, 4, 2)), (32, C(32, 32, 4, 2)), (_ANY, C(64, 16, 8, 2))),
    ("latency", "plain"): ((_ANY, C(16, 32, 4, 2)),),
}
# sm86 (SM86/89/120): fp16 operands for fp8_ds_mla rows (TileConfig.fp8_f16): 1.06-1.09x on
# the 16-head tile and 1.05x on the 32-head tile at SM120's residency, emulated on the H200
# (residency.py --toggle fp8_f16, runs 39-40, BENCHMARKS.md "fp8 rows into fp16 operands").
# sm80 decodes e4m3 with integer operations: there fp8_f16 saves 15% of the loop's instructions
# with the bit-moving decoder (1064 -> 904 per warp and step on the 16x32 tile, Triton 3.8,
# benchmarks/sass_count.py), and timed at integer decoding on an H100 (int_decode.py, runs
# 257-258, one round) 1.02x on the 16- and 32-head tiles and 0.99x on the 64-head one: within
# one round's noise, so sm80 keeps bf16 operands. sm100 is not timed.
# rows_ahead on the fp8 tiles, at SM120's residency emulated on the H200 (runs 63-64,
# residency.py, BENCHMARKS.md "fp8 rows a step ahead"): 16-head tile 1.38x at T=128 H=8/16,
# 1.29x at T=32, 1.23x in prefill; 32-head tile 1.24-1.25x at T=128 H=32/64, 1.14x in prefill.
# With one program per SM the 2-stage pipeline kept one tile in flight, as rows_ahead does, and
# added the shared-memory round trip of the raw bytes. Compiled by Triton 3.6: the 16-head tile
# without spills for sm86, sm89 and sm120 (240-254 registers), the 32-head one at 255 with up
# to 16 bytes of spills in some variants (sm86, sm89). SM86's integer e4m3 decoding, timed on an
# H100 (runs 257-258): within 1% of the hardware conversion on these tiles.
_F16_16, _F16_32 = (C(16, 32, 4, 2, fp8_f16=True, rows_ahead=True),
                    C(32, 32, 4, 2, fp8_f16=True, rows_ahead=True))
_SM86 = {
    **_SMALL_SMEM,
    ("latency", "fp8"): ((_ANY, _F16_16),),
    ("decode", "fp8"): ((16, _F16_16), (_ANY, _F16_32)),
    ("prefill", "fp8"): ((16, _F16_16), (_ANY, _F16_32)),
}
CONFIGS = {"sm90": _SM90, "sm100": _SM100, "sm80": _SM80, "sm86": _SM86}

# Split-K in the decode and prefill phases (the latency phase: below) fills one wave of the
# programs resident per SM (`programs_per_sm`), and keeps at least MIN_TILES_PER_SPLIT tiles per
# split. A partial extra wave costs more than it gains: on the
# H200 (sweep-splits, 2026-11-29) T=32 H=16 fp8 took 64 us with 1.2 programs per SM and 49 us
# with 2. Tiles of 4 warps count PROGRAMS_PER_SM of their family: sm90's keep two resident
# (registers); the sm86 family's 100 KB per SM holds one program of each of its tiles
# (tests/test_portability.py checks the compiled kernels), and with that residency emulated on
# the H200 splitting for one beat splitting for two by 4-10% (benchmarks/residency.py,
# 2026-12-01). sm80 and sm100: not measured, sm90's figure (two sm80 tiles, 16x64 bf16 and
# 32x32 fp8, fit only one per SM in 164 KB).
PROGRAMS_PER_SM = {"sm90": 2, "sm100": 2, "sm80": 2, "sm86": 1}
# Shared memory per SM (KB) by compute capability (major * 10 + minor), and what the driver keeps
# of it per resident block: for the residency checks in the tests and benchmarks.
SMEM_PER_SM_KB = {80: 164, 86: 100, 87: 164, 89: 100, 90: 228, 100: 228, 103: 228, 120: 100, 121: 100}
SMEM_RESERVED_PER_BLOCK = 1024
MIN_TILES_PER_SPLIT = 2
# In the latency phase a program runs one or two tiles, and what a split costs is its partial
# output (T x H x 2 KB written, then read by the combine kernel), not its start: there the
# top-k axis is split for one program per SM, down to one tile per split (:func:`split_rule`).
# H200, run 177 (benchmarks/split_count.py --latency, BENCHMARKS.md "Split counts in the
# latency phase"): T=1 bf16 at 8-64 heads 1.16-1.24x (32 splits against 16), T=4 at 8-16 heads
# 1.13-1.16x, fp8_ds_mla T=1 at 32-64 heads 1.23-1.32x; filling a second resident program
# instead lost (bf16 T=1 H=128, 32 splits: 0.93x; T=4 H=32: 0.91x).
LATENCY_MIN_TILES_PER_SPLIT = 1
# The interpreter has no SMs; a small count makes CPU tests exercise the split path.
INTERPRETER_SM_COUNT = 4


def all_tiles(family: str):
    """Every distinct (phase, kind, tile) of a family, for compile checks and tests."""
    seen = []
    for (phase, kind), entries in sorted(CONFIGS[family].items()):
        for _, tile in entries:
            if (phase, kind, tile) not in seen:
                seen.append((phase, kind, tile))
    return seen


def tile_key(phase: str, kind: str, tile: TileConfig) -> str:
    """A table entry's name in compile records, e.g. ``decode/plain/64x64``; with the shape of
    its ``fallback`` where it has one (``decode/plain/64x64+32x64``), which tells apart two
    entries of one Gluon shape that fall back to different Triton tiles."""
    key = f"{phase}/{kind}/{tile.block_h}x{tile.block_n}"
    fb = tile.fallback
    return key if fb is None else f"{key}+{fb.block_h}x{fb.block_n}"


def family_of(capability: tuple[int, int]) -> str:
    """Map a CUDA compute capability to its configuration family."""
    major, minor = capability
    if major == 9:
        return "sm90"
    if major in (10, 11):
        return "sm100"
    if (major, minor) == (8, 0):
        return "sm80"
    if major == 8 or major == 12:
        return "sm86"
    raise ValueError(
        f"device: compute capability {major}.{minor} is not supported (need 8.0 or newer)"
    )


def fp8_cvt_level(capability: tuple[int, int]) -> int:
    """How the kernels turn e4m3 bytes into fp32 on this architecture (kernels/common.py):
    0 integer decoding (below SM89), 1 the hardware conversion (SM89 and newer)."""
    return 1 if capability >= (8, 9) else 0


def pin_fp8_conversion(family: str, block_h: int) -> bool:
    """Whether fp8 tiles are converted where they are loaded (kernels/common.convert_here).

    Needed where the tensor-core instruction takes its operands from registers (mma.sync:
    before SM90, and tiles of fewer than 64 heads, which Triton gives mma.sync everywhere).
    Where operands come from shared memory (wgmma on SM90, tcgen05 on SM100, 64-head tiles)
    the conversion already happens once; there Triton 3.6's SM100 pipeliner rejects the pin.
    """
    return family in ("sm80", "sm86") or block_h < 64


@functools.lru_cache(maxsize=None)
def device_traits(device_index: int) -> tuple[str, int, int]:
    """``(family, sm_count, fp8_cvt level)`` of a CUDA device, queried once."""
    props = torch.cuda.get_device_properties(device_index)
    capability = (props.major, props.minor)
    return family_of(capability), props.multi_processor_count, fp8_cvt_level(capability)


def programs_per_sm(family: str, tile: TileConfig) -> int:
    """Programs of this tile resident per SM, as the split rule counts them.

    Tiles of 8 warps are the ones built to have an SM to themselves: those of 64 or more heads,
    whose ``BLOCK_H x 512`` fp32 accumulators alone (2 x 64 x 512 values for two programs) would
    fill an SM's 64K registers on any architecture, and sm90's 16x64 fp8 latency tile (125 KB
    of shared memory). Splitting for one program per SM there beat splitting for two by 8-29%
    on the H200 (sweep-regs, 2026-12-01). The Gluon tiles (``gluon``) are built for one
    program per SM too: the few-head ones have 4 consumer warps but 166-187 KB of shared
    memory; but the one with ``fp8_regs`` (kernels/gluon_fp8_regs.py) is built for two: one
    consumer warpgroup each, 108 KB at most, 128 registers a thread at launch. Other tiles of
    4 warps: ``PROGRAMS_PER_SM`` of the family.
    ``tests/test_portability.py`` checks the claim against each target's compiled shared memory,
    and ``tests/test_attention.py`` against the compiled kernel on the GPU at hand.
    """
    if tile.fp8_regs:
        return 2
    return 1 if tile.num_warps >= 8 or tile.gluon else PROGRAMS_PER_SM[family]


def fit_by_shared_memory(shared: int, capability: int) -> int:
    """How many programs using ``shared`` bytes of shared memory one SM of this compute
    capability (``major * 10 + minor``) holds."""
    return SMEM_PER_SM_KB[capability] * 1024 // (shared + SMEM_RESERVED_PER_BLOCK)


def choose_splits(t_count: int, h_tiles: int, topk: int, block_n: int, sm_count: int,
                  per_sm: int, min_tiles: int = MIN_TILES_PER_SPLIT) -> int:
    """Split the top-k axis when tokens x head tiles would leave SMs idle, never past one wave
    of ``per_sm`` programs per SM, nor below ``min_tiles`` tiles per split
    (:func:`split_rule`)."""
    programs = t_count * h_tiles
    wanted = (per_sm * sm_count) // programs
    most = max(1, topk // (block_n * min_tiles))
    return max(1, min(wanted, most))


def split_rule(family: str, phase: str, tile: TileConfig) -> tuple[int, int]:
    """``(programs per SM, least tiles per split)`` that :func:`choose_splits` fills with this
    tile in this phase: one program per SM down to one tile per split in the latency phase
    (``LATENCY_MIN_TILES_PER_SPLIT``), else :func:`programs_per_sm` and
    ``MIN_TILES_PER_SPLIT``, but one program per SM for a tile with ``fp8_regs``.

    That tile holds two programs per SM, but splitting for the second lost in decode, where
    only a split call fills it: over 1M rows at T=128, 2 splits against 1 ran 0.93x with 8
    heads and 0.87x with 16, 4 splits 0.85x and 0.74x (H100, 2026-12-07, run 387), the
    partials' combine costing more than the second program gains."""
    if phase == "latency":
        return 1, LATENCY_MIN_TILES_PER_SPLIT
    return (1 if tile.fp8_regs else programs_per_sm(family, tile)), MIN_TILES_PER_SPLIT


def phase_of(family: str, t_count: int, h_count: int) -> str:
    """The table phase of a call's shapes: "latency", "decode" or "prefill"."""
    if t_count <= LATENCY_MAX_TOKENS and t_count * h_count <= LATENCY_MAX_TOKEN_HEADS.get(family, _ANY):
        return "latency"
    return "decode" if t_count <= DECODE_MAX_TOKENS else "prefill"


def pick_tile(family: str, *, t_count: int, h_count: int, fp8: bool) -> TileConfig:
    """The table entry for these shapes (before trimming BLOCK_H to the head count)."""
    phase = phase_of(family, t_count, h_count)
    for max_heads, tile in CONFIGS[family][(phase, "fp8" if fp8 else "plain")]:
        if h_count <= max_heads:
            return tile
    raise AssertionError("every table ends with an entry for any head count")


@functools.lru_cache(maxsize=4096)
def plan_launch(family: str, sm_count: int, fp8_cvt: int, *, t_count: int, h_count: int,
                topk: int, fp8: bool, gluon: bool = True) -> LaunchPlan:
    """Pick the tile, split count and fp8 decode path for one call. ``gluon``: whether the
    Gluon kernels apply to the call (kernels.attention.gluon_applies: fixed per cache, dtypes
    and device, so a CUDA graph's plan holds); where not, a Gluon tile gives way to its
    ``without_gluon`` tile.

    A function of its arguments and this module's tables and limits only, so each plan is
    made once (about 10 us of a call's host time on a CPU): code that changes a table or limit
    (benchmarks/sweep.py) calls ``plan_launch.cache_clear()`` after."""
    tile = pick_tile(family, t_count=t_count, h_count=h_count, fp8=fp8)
    if tile.gluon and not gluon:
        tile = tile.without_gluon()
    # A Triton tile never tiles more heads than exist (beyond the 16 rows tl.dot needs). A Gluon
    # tile keeps its heads, those past H masked: the table puts it there on purpose (the 64-head
    # tile for 17-32 heads), and its wgmma has no smaller M.
    block_h = min(tile.block_h, max(16, next_power_of_2(h_count)))
    if block_h != tile.block_h and not tile.gluon:
        tile = dataclasses.replace(tile, block_h=block_h)
    per_sm, min_tiles = split_rule(family, phase_of(family, t_count, h_count), tile)
    splits = choose_splits(t_count, cdiv(h_count, tile.block_h), topk, tile.block_n, sm_count,
                           per_sm, min_tiles)
    return LaunchPlan(tile=tile, splits=splits, fp8_cvt=fp8_cvt,
                      pin_conversion=pin_fp8_conversion(family, tile.block_h))
