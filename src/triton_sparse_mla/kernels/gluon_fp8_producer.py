"""sm90's Gluon kernel over fp8_ds_mla rows (``TileConfig.gluon`` with fp8_ds_mla rows): a
producer warpgroup gathers and dequantizes the rows for consumer warps that only compute.

(The first Gluon kernel over these rows had no producer: its 8 warps waited for the raw
bytes, dequantized them into the operand tile, issued the next copies, then computed, one
after the other. This kernel ran 1.22x faster than it at 64 heads and 1.25x at 128 on decode
T=128, run 98; it was removed after commit 44043de.)
With 64 heads the consumers are gluon_sm90's lockstep pair (``_ws_consumer``: wait for a
slot, score dots, softmax, PV dots, free the slot) over a 2-slot ring of 16-bit operand tiles,
and ``PW`` producer warps fill the ring: for each step, once its slot is free, they copy the
tile's raw bytes, scales and rope asynchronously, wait until the copies have landed (an
mbarrier per pass of rows), dequantize, and hand the slot over (another mbarrier).

Shared memory has no room for a raw buffer beside q (72 KB), two operand slots (144 KB) and
P (8 KB): the raw bytes land inside the operand slot they become. A latent tile of 64 rows x
128 columns of 16-bit values is two 8 KB halves in the 128-byte-swizzled layout, columns 0-63
of every row, then columns 64-127 (offset bit 12 of the layout: ``gl.to_linear_layout`` of
SMEM for [64, 128], Triton 3.8), each row's half 128 contiguous bytes. A row's 128 e4m3 bytes
are copied into the second half at the place of that row's columns 64-127, so converting row
``r`` overwrites only row ``r``'s raw bytes. Each row is loaded by 8 threads of one warp, in one
load instruction per thread, before any of them stores the row's values (a warp's shared
memory accesses are performed in its program order): the conversion needs no barrier beyond
those the compiler places between the reads and the writes of a tile. The scales (4 fp32 per
row) go through 1 KB per slot, the rope straight into the slot's bf16 rope tile.

The producer works in passes of ``4 * PW`` rows, one 16-byte copy per thread, tile and pass,
each pass with a ``landed`` mbarrier of its own: the first passes are converted while the last
still land. (Converting the tile only after its last copy landed put the whole conversion
on the step's critical path: with two slots the producer starts a tile's copies only when
the consumers free its slot, one step before they need it, and the copies' latency already
fills most of that step. It was 1.02x at 64 heads and 1.06x at 128 over the kernel without a
producer; in passes, 1.22x and 1.25x. Decode T=128, H200, 2026-12-02, runs 97-98.)

Shared memory: q 72 KB + 2 x (64 + 8) KB + P 8 KB + scales 2 KB: 226.6 KB (232,036 bytes of
232,448), one program per SM. Registers (``PRODUCER_REGS_W4``): the producer gets 56 with 4
warps and the consumers 224, none spilling in their loops (sm90, Triton 3.6 and 3.8; with 40
and the consumers at 232, as until run 238, the producer's loop reloaded 15 spilled values per
step under Triton 3.6 and 20 under 3.8); 24 with 8 (48 local loads per step; timed only with
the whole-tile conversion, where it spilled too: 0.95x of 4 warps, run 97; not shipped).

On the H200 (run 98) decode T=128 over a 1M-row cache: 111.2 us at 64 heads against FlashMLA's
fp8 kernel 115.2 us, 210.9 against 185.1 at 128 heads. Its GPU tests and the suite passed
(232), memcheck 0 errors; racecheck reports only at Triton's warp-specialization hand-over,
the same sites as the bf16 producer kernel's (run 100; BENCHMARKS.md "A producer that
dequantizes").

The same kernel runs the few-head consumers of kernels/gluon_narrow.py (one warpgroup, heads
along the wgmma's N) where ``BLOCK_H`` is below 64: q loaded by 4 warps, P^T in a tile of its
own, and the producer at 128 registers (no local memory) instead of 40, since those consumers
need far fewer than the 64-head ones. There the raw halves of odd rows are swapped
(``RAW_SWAP``) and each row is converted by 4 threads (``_cvt_layout``):
conflict-free stores, 1.06-1.11x (run 110); the in-place argument above holds as it is, a
row's bytes still within its own 128 and loaded by its warp before any store over them.

Import only where Gluon is available and not under the interpreter (as gluon_sm90).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from . import gluon_narrow
from .gluon_sm90 import (FLAT, SMEM, _NOT_SPECIALIZED, _arrive_all, _async_load, _barrier, _epilogue,
                         _latent_ring, _load_q, _pass_ids, _pass_row, _reinterpret, _split_range,
                         _tile_origin, _ws_consumer)

# Producer registers per thread, by producer warp count: 4 x 32 x 56 (7168; the consumers' two
# warpgroups keep 224 each, without spills in their loop) or 8 x 32 x 24 (6144; consumers at 232);
# beside the few-head consumers (one warpgroup) 128. With 4 warps, 56 against 40 (consumers at
# 232) gave decode T=32-128 at 64-128 heads 1.01-1.03x under Triton 3.6 and 1.11-1.17x under
# 3.8, where at 40 the producer's loop reloads 20 spilled values per step (15 under 3.6) and
# the kernel ran at 0.89-0.92x of its 3.6 speed; 48 and 64 were 1-4% slower than 56 (T=1
# unchanged; H200, 2026-12-04, run 238).
PRODUCER_REGS_W4 = gl.constexpr(56)
PRODUCER_REGS_W8 = gl.constexpr(24)
PRODUCER_REGS_NARROW = gl.constexpr(128)


# A 64-row latent tile's 16 KB as [128, LAT] uint8 (rows 64-127: the raw half), with the two
# 64-byte halves of every odd row swapped (offset bit 7, the row's parity, also
# flips column 64). Copies and conversion both go through this view, so a row's bytes stay in
# its own 128 bytes (the in-place conversion is unchanged) and only their order moves.
RAW_SWAP = gl.constexpr(gl.SharedLinearLayout(offset_bases=[
    [0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [0, 32], [0, 64], [1, 64],
    [2, 0], [4, 0], [8, 0], [16, 0], [32, 0], [64, 0]]))


@gluon.constexpr_function
def _cvt_layout(PW):
    """The conversion's layout with RAW_SWAP, ``PW`` warps, [32, 128] raw bytes (two copy
    passes with 4 warps, one with 8): 4 threads per row; with 4 warps each thread holds 16
    bytes of each half, with 8 the row's halves go to two warps. A quarter-warp (8 threads,
    rows r and r + 1) then loads row r's first half and row r + 1's (swapped) second half (or
    the same logical half of both rows, which the swap puts in different banks), distinct
    banks, and stores 16 bytes into even swizzled chunks of one row and odd chunks of the
    other, distinct banks again. (RAWP, 8 threads per row, stores a row's two halves, 8 KB
    apart, into the same chunk positions in one phase: 2-way conflicts, run 109's profile.)"""
    return gl.BlockedLayout([1, 16], [8, 4], [4, PW // 4], [1, 0])


@gluon.constexpr_function
def _cvt_scales(PW):
    """The rows' 4 scales [32, 4] in :func:`_cvt_layout`'s row slice (replicated)."""
    return gl.BlockedLayout([1, 4], [8, 4], [4, PW // 4], [1, 0])


@gluon.jit
def _raw_half(k_s, slot, SWAP: gl.constexpr = False):
    """The bytes of ring slot ``slot``'s columns 64-127 of a latent tile ring ``k_s`` ([NS,
    BLOCK_N, LAT] 16-bit), as [BLOCK_N, LAT] uint8, row ``r`` at byte ``r * LAT`` of the
    second half: where the slot's rows' raw e4m3 bytes land (with SWAP through RAW_SWAP)."""
    NS: gl.constexpr = k_s.shape[0]
    BLOCK_N: gl.constexpr = k_s.shape[1]
    LAT: gl.constexpr = k_s.shape[2]
    if SWAP:
        half = _reinterpret(k_s.index(slot), gl.uint8, [2 * BLOCK_N, LAT], RAW_SWAP).slice(BLOCK_N, BLOCK_N)
    else:
        half = _reinterpret(k_s, gl.uint8, [2 * NS, BLOCK_N, LAT], FLAT).index(2 * slot + 1)
    return half


@gluon.jit
def _copy_pass(k_s0, k_s1, k_s2, k_s3, kp_smem, sc_smem, kv_ptr, ids, n_rows, stride_kv, slot,
               row0: gl.constexpr, RAWP: gl.constexpr, ROPEP: gl.constexpr, SC4: gl.constexpr,
               SWAP: gl.constexpr = False):
    """The asynchronous copies of one pass of fp8_ds_mla rows ``ids`` ([ROWS] in RAWP's row
    slice) into rows ``row0 : row0 + ROWS`` of ring slot ``slot``: each latent tile's e4m3
    bytes into its second half, each row's 4 fp32 scales into ``sc_smem`` ([NS, BLOCK_N, 4]),
    the bf16 rope into the rope tile; one 16-byte copy per thread and tile. Invalid ids (-1
    past the end) are zero-filled."""
    ROWS: gl.constexpr = ids.shape[0]
    LAT: gl.constexpr = k_s0.shape[2]
    D_PE: gl.constexpr = kp_smem.shape[2]
    m_r = ((ids >= 0) & (ids < n_rows))[:, None]
    p_row = kv_ptr + ids.to(gl.int64) * stride_kv
    ptrs = p_row[:, None] + gl.arange(0, LAT, layout=gl.SliceLayout(0, RAWP))[None, :]
    _async_load(_raw_half(k_s0, slot, SWAP).slice(row0, ROWS), ptrs, mask=m_r)
    _async_load(_raw_half(k_s1, slot, SWAP).slice(row0, ROWS), ptrs + LAT, mask=m_r)
    _async_load(_raw_half(k_s2, slot, SWAP).slice(row0, ROWS), ptrs + 2 * LAT, mask=m_r)
    _async_load(_raw_half(k_s3, slot, SWAP).slice(row0, ROWS), ptrs + 3 * LAT, mask=m_r)
    ids_s = gl.convert_layout(ids, gl.SliceLayout(1, SC4), assert_trivial=True)
    p_sc = (kv_ptr + ids_s.to(gl.int64) * stride_kv + 4 * LAT).to(gl.pointer_type(gl.float32))
    o_s = gl.arange(0, 4, layout=gl.SliceLayout(0, SC4))
    _async_load(sc_smem.index(slot).slice(row0, ROWS),
                p_sc[:, None] + o_s[None, :],
                mask=((ids_s >= 0) & (ids_s < n_rows))[:, None])
    ids_p = gl.convert_layout(ids, gl.SliceLayout(1, ROPEP), assert_trivial=True)
    # formats.FP8_ROPE_BYTE: the rope after 512 e4m3 bytes and 16 bytes of scales
    p_pe = (kv_ptr + ids_p.to(gl.int64) * stride_kv + 4 * LAT + 16).to(gl.pointer_type(gl.bfloat16))
    o_p = gl.arange(0, D_PE, layout=gl.SliceLayout(0, ROPEP))
    _async_load(kp_smem.index(slot).slice(row0, ROWS),
                p_pe[:, None] + o_p[None, :],
                mask=((ids_p >= 0) & (ids_p < n_rows))[:, None])


@gluon.jit
def _scaled(b_raw, b_sc4, c: gl.constexpr, F16: gl.constexpr):
    """e4m3 bytes ``b_raw`` [ROWS, LAT] times column ``c`` of their rows' scales ``b_sc4``
    [ROWS, 4]: in fp16 with F16 (the scale rounded to fp16, one packed multiply per two
    values), else in fp32 rounded once to bf16."""
    o_c = gl.arange(0, 4, layout=gl.SliceLayout(0, b_sc4.type.layout))
    b_sc = gl.sum(gl.where(o_c[None, :] == c, b_sc4, 0.0), axis=1)  # (in-thread)
    b_sc = gl.convert_layout(b_sc, gl.SliceLayout(1, b_raw.type.layout), assert_trivial=True)
    if F16:
        b_v = b_raw.to(gl.float8e4nv, bitcast=True).to(gl.float16) * b_sc.to(gl.float16)[:, None]
    else:
        b_v = (b_raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * b_sc[:, None]).to(gl.bfloat16)
    return b_v


@gluon.jit
def _dequant_pass(k_s0, k_s1, k_s2, k_s3, sc_smem, slot, row0: gl.constexpr, RAWP: gl.constexpr,
                  SC4: gl.constexpr, ROWS: gl.constexpr, F16: gl.constexpr, SWAP: gl.constexpr = False):
    """Rows ``row0 : row0 + ROWS`` of ring slot ``slot``: the four latent tiles' raw bytes
    (their second halves) times the rows' scales into their 16-bit values, in place. Every
    row's bytes of a tile are loaded (one instruction of its warp) before any of its values is
    stored over them; the four tiles' loads come first."""
    b_r0 = _raw_half(k_s0, slot, SWAP).slice(row0, ROWS).load(RAWP)  # [ROWS, LAT] uint8
    b_r1 = _raw_half(k_s1, slot, SWAP).slice(row0, ROWS).load(RAWP)
    b_r2 = _raw_half(k_s2, slot, SWAP).slice(row0, ROWS).load(RAWP)
    b_r3 = _raw_half(k_s3, slot, SWAP).slice(row0, ROWS).load(RAWP)
    b_sc4 = sc_smem.index(slot).slice(row0, ROWS).load(SC4)  # [ROWS, 4] fp32
    k_s0.index(slot).slice(row0, ROWS).store(_scaled(b_r0, b_sc4, 0, F16))
    k_s1.index(slot).slice(row0, ROWS).store(_scaled(b_r1, b_sc4, 1, F16))
    k_s2.index(slot).slice(row0, ROWS).store(_scaled(b_r2, b_sc4, 2, F16))
    k_s3.index(slot).slice(row0, ROWS).store(_scaled(b_r3, b_sc4, 3, F16))


@gluon.jit
def _issue_tile(k_s0, k_s1, k_s2, k_s3, kp_smem, sc_smem, kv_ptr, ids, n_rows, stride_kv, landed, free, i,
                NS: gl.constexpr, RAWP: gl.constexpr, ROPEP: gl.constexpr, SC4: gl.constexpr,
                SWAP: gl.constexpr = False):
    """Step ``i``'s copies, once the consumers freed its slot (the tile NS steps before it has
    been read; the first NS steps pass at once): pass by pass (``ids`` [ROWS, PASSES], a
    thread's row of every pass), each pass with an arrival on its own ``landed`` barrier when
    this thread's copies have landed."""
    ROWS: gl.constexpr = ids.shape[0]
    PASSES: gl.constexpr = ids.shape[1]
    slot = i % NS
    mbarrier.wait(free.index(slot), ((i // NS) & 1) ^ 1)
    for j in gl.static_range(PASSES):
        b_idx = _pass_row(ids, j)
        _copy_pass(k_s0, k_s1, k_s2, k_s3, kp_smem, sc_smem, kv_ptr, b_idx, n_rows, stride_kv, slot,
                   j * ROWS, RAWP, ROPEP, SC4, SWAP)
        async_copy.mbarrier_arrive(landed.index(slot * PASSES + j), increment_count=False)


@gluon.jit
def _convert_tile(k_s0, k_s1, k_s2, k_s3, sc_smem, landed, ready, i, NS: gl.constexpr, PW: gl.constexpr,
                  F16: gl.constexpr, SWAP: gl.constexpr = False):
    """Step ``i``'s tile, pass by pass once every copying thread's copies of the pass have
    landed, dequantized in place by ``PW`` warps (so the first passes convert while the last
    still land); then, fenced for the consumers' wgmma, the slot's ``ready`` barrier completed
    once every producer thread's stores are done (``_arrive_all``).
    With SWAP through RAW_SWAP in ``_cvt_layout``, 32 rows at a time."""
    ROWS: gl.constexpr = 4 * PW
    PASSES: gl.constexpr = k_s0.shape[1] // ROWS
    slot = i % NS
    if SWAP:
        PER: gl.constexpr = 32 // ROWS  # copy passes per 32-row block: 2 with 4 warps, 1 with 8
        for j in gl.static_range(PASSES // PER):
            for jj in gl.static_range(PER):
                mbarrier.wait(landed.index(slot * PASSES + PER * j + jj), (i // NS) & 1)
            _dequant_pass(k_s0, k_s1, k_s2, k_s3, sc_smem, slot, j * 32, _cvt_layout(PW), _cvt_scales(PW), 32,
                          F16, True)
    else:
        RAWP: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [PW, 1], [1, 0])
        SC4: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [PW, 1], [1, 0])
        for j in gl.static_range(PASSES):
            mbarrier.wait(landed.index(slot * PASSES + j), (i // NS) & 1)
            _dequant_pass(k_s0, k_s1, k_s2, k_s3, sc_smem, slot, j * ROWS, RAWP, SC4, ROWS, F16)
    # this thread's stores (generic proxy) before the wgmma's reads
    fence_async_shared()
    _arrive_all(ready.index(slot))


@gluon.jit
def _fp8_producer(kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2, k_s3,
                  kp_smem, sc_smem, landed, ready, free, BLOCK_N: gl.constexpr, NS: gl.constexpr,
                  PW: gl.constexpr, F16: gl.constexpr, SWAP: gl.constexpr = False):
    """The ``PW`` producer warps (of the 64-head and the few-head kernel): for each step, once
    the consumers freed its slot, the tile's copies (:func:`_issue_tile`), then its conversion
    (:func:`_convert_tile`). The next step's ids are loaded while the copies fly. (Timed and
    dropped, H200 2026-12-02: the next tile's copies issued before this tile's conversion,
    0.74-0.86x, run 103, since the producer then waits for the consumers to free a slot before
    it converts; the copies and the conversion in two partitions of 4 warps, 0.98-1.03x on the
    few-head kernel, run 104; the few-head kernel's rows loaded into registers a tile ahead as
    32-bit words and converted into the slot once it is free, no raw bytes in shared memory,
    0.84-0.90x and 0.97x over an L2-resident cache, run 124, commit ecc2f65: with one set of
    registers the next tile's loads wait for this tile's conversion, as the copies wait for
    the slot; with L2-only loads 0.61x. The few-head kernel's copies into a staging ring of
    16-row passes 1.5 tiles ahead, dequantized from there into the slots, commit eba9fd1:
    correct, 0.90-0.92x in decode, 0.86-0.91x in prefill, run 132; Nsight Compute, run 133:
    14% more instructions, for the rope moved through registers, a row-id load per pass and
    the ring's addresses, at the same cycles per instruction, the conversion now waiting on
    its shared-memory loads. The copies' lead buys nothing while the producer's own work sets
    the step, although the bare gather with two tiles in flight reaches 87% of copy, run
    131. Nor does halving that work per warp: 8 producer warps, 0.96-0.98x in decode, run 140;
    the staging ring rebuilt in 32-row units with 8 producer warps, commit 5805310, 0.89-0.92x
    of 8 in place, run 141.)"""
    # 16 bytes per thread and copy, a row in 8 threads of one warp (RAWP: 128 e4m3 bytes of a
    # latent tile, ROPEP: the rope's 64 bf16, SC4: the row's 4 scales, replicated), 4 rows per
    # warp and pass
    RAWP: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [PW, 1], [1, 0])
    ROPEP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
    SC4: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [PW, 1], [1, 0])
    ROWS: gl.constexpr = 4 * PW
    ids = _pass_ids(p_idx, n_start, n_end, ROWS, BLOCK_N // ROWS, RAWP)
    for i in range(n_steps):
        _issue_tile(k_s0, k_s1, k_s2, k_s3, kp_smem, sc_smem, kv_ptr, ids, n_rows, stride_kv, landed, free,
                    i, NS, RAWP, ROPEP, SC4, SWAP)
        ids = _pass_ids(p_idx, n_start + (i + 1) * BLOCK_N, n_end, ROWS, BLOCK_N // ROWS, RAWP)
        _convert_tile(k_s0, k_s1, k_s2, k_s3, sc_smem, landed, ready, i, NS, PW, F16, SWAP)


@gluon.jit(do_not_specialize=_NOT_SPECIALIZED)
def sparse_mla_gluon_fp8_ws_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
    qk_scale, n_rows, n_heads, topk, split_size,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_kv, stride_idx_t,
    stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
    HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
    NS: gl.constexpr, PW: gl.constexpr, F16: gl.constexpr,
):
    """One program per (token, head tile, split), as kernels/attention.py's, over fp8_ds_mla
    rows gathered and dequantized by ``PW`` producer warps (this module's docstring). With F16
    (``TileConfig.fp8_f16``) the latent operands are fp16 (q scaled by 2^-8, which the launcher divides out of
    ``qk_scale``), the rope dot bf16."""
    NARROW: gl.constexpr = BLOCK_H < 64  # (kernels/gluon_narrow.py's consumers)
    # The raw halves of odd rows swapped, and the conversion's conflict-free layout (RAW_SWAP,
    # _cvt_layout): with the few-head consumers 1.06-1.11x (run 110). Not timed on the 64-head
    # kernel, whose producer spilled more with it at 40 registers (it has 56 since run 238).
    SWAP: gl.constexpr = NARROW
    i_t, h0 = _tile_origin(n_heads, BLOCK_H)
    op_t: gl.constexpr = gl.float16 if F16 else gl.bfloat16  # the latent operands' type
    if NARROW:
        # q is loaded by the consumers inside their partition, while the producer's first
        # copies fly (gluon_narrow.narrow_consumer): 1.008-1.019x in decode at 8-32 heads,
        # 1.014x in prefill over 32K rows, against every warp loading it before the partitions
        # (H200, 2026-12-03, run 181)
        q_s0, q_s1, q_s2, q_s3, q_sp = gluon_narrow.narrow_q_tiles(op_t, gl.bfloat16, BLOCK_H, LAT, D_PE)
    else:
        q_s0, q_s1, q_s2, q_s3, q_sp = _load_q(q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                                               stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H, LAT,
                                               D_PE, F16)
    k_s0, k_s1, k_s2, k_s3, kp_smem = _latent_ring(op_t, gl.bfloat16, BLOCK_N, LAT, D_PE, NS)
    if NARROW:
        p_smem = gluon_narrow.narrow_p_tile(op_t, BLOCK_N, BLOCK_H)
    else:
        p_smem = gl.allocate_shared_memory(op_t, [BLOCK_H, BLOCK_N], SMEM)
    sc_smem = gl.allocate_shared_memory(gl.float32, [NS, BLOCK_N, 4], FLAT)
    PASSES: gl.constexpr = BLOCK_N // (4 * PW)  # (the producer's passes per tile)
    landed = gl.allocate_shared_memory(gl.int64, [NS * PASSES, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS * PASSES):
        mbarrier.init(landed.index(j), count=32 * PW)  # one copy-completion per producer thread
    for j in gl.static_range(NS):
        # one arrival, once the whole partition is there (_arrive_all)
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(free.index(j), count=1)
    fence_async_shared()  # q's stores and the barriers' initialisation, before the partitions
    _barrier()

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    # (with the few-head consumers, one warpgroup that needs far less, the producer takes more)
    REGS: gl.constexpr = (PRODUCER_REGS_NARROW if NARROW else
                          (PRODUCER_REGS_W8 if PW == 8 else PRODUCER_REGS_W4))
    # (Gluon takes no function inside a tuple built in the kernel: one call per consumer)
    if NARROW:
        acc0, acc1, acc2, acc3, b_m, b_l2 = gl.warp_specialize(
            [(gluon_narrow.narrow_consumer, (q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_smem,
                                             p_smem, ready, free, p_idx, n_start, n_end, n_steps, n_rows,
                                             qk_scale, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                                             stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H, BLOCK_N,
                                             LAT, NS, F16)),
             (_fp8_producer, (kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2,
                              k_s3, kp_smem, sc_smem, landed, ready, free, BLOCK_N, NS, PW, F16, SWAP))],
            [PW], [REGS])
        gluon_narrow.narrow_epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t,
                                     i_s, h0, n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t,
                                     stride_lse_h, HAS_SINK, PARTIAL, BLOCK_H, LAT)
    else:
        acc0, acc1, acc2, acc3, b_m, b_l2 = gl.warp_specialize(
            [(_ws_consumer, (q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_smem, p_smem, ready,
                             free, p_idx, n_start, n_end, n_steps, n_rows, qk_scale, BLOCK_H, BLOCK_N,
                             LAT, NS)),
             (_fp8_producer, (kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2,
                              k_s3, kp_smem, sc_smem, landed, ready, free, BLOCK_N, NS, PW, F16, SWAP))],
            [PW], [REGS])
        _epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                  stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL,
                  BLOCK_H, LAT)
