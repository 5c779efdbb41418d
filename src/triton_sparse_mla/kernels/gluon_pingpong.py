"""sm90's 64-head Gluon tile with its two consumer warpgroups on alternate tiles
(``TileConfig.pingpong``; bf16/fp16 rows).

In kernels/gluon_sm90.py's tiles both warpgroups work on the same 64 gathered rows in lockstep:
each computes the scores of 32 of them, the two exchange the row max, and both wait while the
other's softmax runs, so the tensor cores idle through every softmax. Here each warpgroup
computes the scores of whole tiles, warpgroup 0 the even tiles of the program's top-k range and
warpgroup 1 the odd ones, and the output's 512 latent columns are split instead: warpgroup 0
accumulates columns 0-255 and warpgroup 1 columns 256-511, over every tile. Per pair of tiles
(an even slot holds the even tile, an odd slot the odd one):

* warpgroup 0: scores of the even tile; its row max ``m0`` (with the running max) to
  warpgroup 1; probabilities ``P0`` against ``m0``; PV of ``P0`` (registers) into its
  columns; once warpgroup 1 sent the pair's joint max ``M``, ``P0`` in ``M``'s terms into
  shared memory for warpgroup 1, its accumulators rescaled by ``2^(m0 - M)``, then PV of
  warpgroup 1's ``P1`` (shared memory) over the odd tile's rows into its columns;
* warpgroup 1: scores of the odd tile (issued while warpgroup 0 is on its softmax); ``M``,
  the max of ``m0`` and its own; ``P1`` against ``M``; PV of ``P1`` into its columns, ``P1``
  into shared memory; then PV of ``P0`` over the even tile's rows into its columns.

So one warpgroup's score dots run while the other's softmax does, and each tile's scores are
computed once, by one warpgroup. Warpgroup 0 issues the next even tile's score dots behind
its last PV dots of a pair. The four exchanges of a pair (``m0``, ``M``, ``P0``, ``P1``) go
through hardware barriers of the two warpgroups (``bar.arrive`` by the writer, ``bar.sync``
by the reader: ``_nb_arrive``, ``_nb_sync``), as does the denominators' exchange at the end
(both wait). Each probability tile goes into the rope tile of its own slot, which its score
dots have finished reading. The two slots (one pair of 64-row tiles) are filled by a producer
of 4 warps (the default partition) in halves, each with a ``ready`` and a ``free`` mbarrier:
a slot's latent columns 0-255 and 256-511 are read by different warpgroups' PV dots and are
refilled as soon as their reader is done. A pair always has both tiles (past the range's end
the rows are zero-filled and masked), so no wgmma is in flight across a branch. The producer
loads both tiles' row ids once per pair, a pair ahead, and copies each tile's ids into a ring
with its first half, where the consumer that computes the tile's softmax reads which of its
rows are valid.

The producer also copies q into shared memory, first, while the first tiles' ids load
(``_copy_q``; the consumers wait for it on a barrier of its own): the partitions start at
once instead of after a load of q through registers by the kernel's warps (1.01-1.02x in
prefill, 1.00x in decode, run 163; a q whose start or head stride is not a multiple of 16
is first copied by the launcher: gluon_sm90._aligned16).

Shared memory: q 72 KB, two slots of 64 rows 144 KB, the row max and denominator exchange
1 KB, the slots' row ids 0.5 KB: 218 KB. Registers: the consumers at ``CONSUMER_REGS``.

Shipped in sm90's tables for bf16/fp16 rows with 64 or more heads (configs._G64). Measured
(H200, BENCHMARKS.md "Consumers on alternate tiles", its second form, "The 64-head bf16 tile
beside FlashMLA's kernel" and "The alternate-tile kernel shipped"): from 0.69-0.84x of the
lockstep kernel with producer warps (removed after; commit 44043de has it) in its first form
(runs 91-95), by the hardware-barrier exchanges and the next tile's score dots behind the PV
dots (runs 135-136), 8 producer threads per row (1.11-1.14x, run 137), the row ids loaded once
per pair a pair ahead (1.06x in decode, run 143), each tile's ids in a shared-memory ring (5%
in prefill, run 147), warpgroup 1's early hand-over of P1 (3.5-5%, run 149), and q's wgmma
descriptors kept from being hoisted and spilled (``_q_fresh``: with Triton 3.6 for sm90 no
spill instruction in the kernel, 87 before), to 1.03-1.22x of the lockstep kernel in decode
T=32/128 and prefill T=4096, 64 and 128 heads (run 153; 0.92-1.03x before ``_q_fresh``, run
151). A form with 32-row tiles in two sets of two slots was 1.01-1.09x of the lockstep kernel
in runs 152-153 (removed; commit 3d2f316 has it).

Import only where Gluon is available and not under the interpreter (as gluon_sm90).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_sm90 import (FLAT1, SMEM, _NOT_SPECIALIZED, _arrive_all, _async_load, _barrier,
                         _lse_and_scale, _pass_ids, _pass_row, _reinterpret, _ring_rows,
                         _split_range, _tile_origin)

# The kernel's own warps are the producer's (``PW``, the default partition); the two consumer
# warpgroups are worker partitions. (With warpgroup 0 as the default partition it spilled
# inside its loop; as a worker, a consumer spills only around its loop.)
# Each warpgroup: a score tile of 64 heads x 64 rows, two output tiles of 64 heads x 128
# columns.
S_L64 = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                               instr_shape=[16, 64, 16]))
O_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                             instr_shape=[16, 128, 16]))
P_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2))
# The producer's threads per cache row, each copying 16 bytes per instruction (the rope:
# D_PE / ROW_THREADS elements): 8, so that a copy instruction covers a 128-byte line of 4 rows
# per warp and each thread's 64-bit row address serves both copies of a 128-column tile; with
# 16 (a line of 2 rows, gluon_sm90's GATHER_W*), a half tile takes twice the rows per thread,
# each with its own address. 8 was 1.11-1.14x over 16 here (run 137); in the lockstep kernel's
# producer, which copies all four latent tiles of a row per address, 0.96-0.97x (run 138).
ROW_THREADS = gl.constexpr(8)
# The producer's warps: 4 (8 measured the same within 1.5% before ``_q_fresh``, run 145; with
# the consumers at 224 registers an 8-warp producer would have 32).
PW = 4
# The consumers' registers (the kernel's CONSUMER_REGS, which kernels/gluon_sm90.tile_variant
# passes from here): two warpgroups at 224; the 4-warp producer (the default partition) gets
# the rest, 56 (2 x 128 x 224 + 128 x 56 = 64512; Triton launches the 12 warps at 168). At 224
# no partition spills (Triton 3.6, sm90); 232 measured the same (0.98-1.02x, run 152).
CONSUMER_REGS = 224


@gluon.jit
def _copy_half(ka, kb, kp, kv_ptr, ids, n_rows, stride_kv, slot, col0, ROPE_TOO: gl.constexpr,
               GATHER: gl.constexpr, ROPE: gl.constexpr, PASS_ROWS: gl.constexpr,
               PASSES: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr):
    """The asynchronous copies of one half of a tile into ring slot ``slot``: latent columns
    ``col0 : col0 + 2 * LAT`` into ``ka`` and ``kb``, and with ROPE_TOO the rope into ``kp``;
    ``ids`` as ``gluon_sm90._pass_ids`` gives them; invalid ids are zero-filled."""
    o_c = gl.arange(0, LAT, layout=gl.SliceLayout(0, GATHER))
    for j in gl.static_range(PASSES):
        b_idx = _pass_row(ids, j)
        m_n = (b_idx >= 0) & (b_idx < n_rows)
        ptrs = (kv_ptr + b_idx.to(gl.int64) * stride_kv + col0)[:, None] + o_c[None, :]
        _async_load(_ring_rows(ka, slot, j * PASS_ROWS, PASS_ROWS), ptrs, mask=m_n[:, None])
        _async_load(_ring_rows(kb, slot, j * PASS_ROWS, PASS_ROWS), ptrs + LAT, mask=m_n[:, None])
        if ROPE_TOO:
            b_idx_pe = gl.convert_layout(b_idx, gl.SliceLayout(1, ROPE), assert_trivial=True)
            m_p = (b_idx_pe >= 0) & (b_idx_pe < n_rows)
            o_p = gl.arange(0, D_PE, layout=gl.SliceLayout(0, ROPE))
            p_pe = (kv_ptr + b_idx_pe.to(gl.int64) * stride_kv + 4 * LAT)[:, None] + o_p[None, :]
            _async_load(_ring_rows(kp, slot, j * PASS_ROWS, PASS_ROWS), p_pe, mask=m_p[:, None])


@gluon.jit
def _copy_q(q_s0, q_s1, q_s2, q_s3, q_sp, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
            stride_qn_h, stride_qp_t, stride_qp_h, GATHER: gl.constexpr, ROPE: gl.constexpr,
            PASS_ROWS: gl.constexpr, BLOCK_H: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr):
    """The asynchronous copies of this program's q (heads ``h0 : h0 + BLOCK_H``, those past
    ``n_heads`` zero-filled) into its four latent tiles and its rope tile, in passes of
    PASS_ROWS heads as the rows are copied."""
    o_c = gl.arange(0, LAT, layout=gl.SliceLayout(0, GATHER))
    o_p = gl.arange(0, D_PE, layout=gl.SliceLayout(0, ROPE))
    for j in gl.static_range(BLOCK_H // PASS_ROWS):
        o_h = h0 + j * PASS_ROWS + gl.arange(0, PASS_ROWS, layout=gl.SliceLayout(1, GATHER))
        p_q = (q_nope_ptr + i_t * stride_qn_t + o_h * stride_qn_h)[:, None] + o_c[None, :]
        m_q = (o_h < n_heads)[:, None]
        _async_load(q_s0.slice(j * PASS_ROWS, PASS_ROWS), p_q, mask=m_q)
        _async_load(q_s1.slice(j * PASS_ROWS, PASS_ROWS), p_q + LAT, mask=m_q)
        _async_load(q_s2.slice(j * PASS_ROWS, PASS_ROWS), p_q + 2 * LAT, mask=m_q)
        _async_load(q_s3.slice(j * PASS_ROWS, PASS_ROWS), p_q + 3 * LAT, mask=m_q)
        o_h2 = h0 + j * PASS_ROWS + gl.arange(0, PASS_ROWS, layout=gl.SliceLayout(1, ROPE))
        p_p = (q_pe_ptr + i_t * stride_qp_t + o_h2 * stride_qp_h)[:, None] + o_p[None, :]
        _async_load(q_sp.slice(j * PASS_ROWS, PASS_ROWS), p_p, mask=(o_h2 < n_heads)[:, None])


@gluon.jit
def _copy_ids(ids_s, slot, p_idx, n0, n_end, BLOCK_N: gl.constexpr, PW: gl.constexpr):
    """The asynchronous copy of entries ``idx[n0:n0 + BLOCK_N]`` into ``ids_s[slot]`` (those
    past ``n_end`` zero-filled), with a tile's first half: the consumer that computes the
    tile's softmax reads its rows' validity there once that half has landed, instead of
    loading the ids from global memory and holding them in registers."""
    o_n = n0 + gl.arange(0, BLOCK_N, layout=gl.BlockedLayout([1], [32], [PW], [0]))
    _async_load(ids_s.index(slot), p_idx + o_n, mask=o_n < n_end)


@gluon.jit
def _prefetch_ids(p_idx, n0, n_end, COUNT: gl.constexpr, PW: gl.constexpr):
    """Bring entries ``idx[n0:n0 + COUNT]`` (those before ``n_end``) into L1 ahead of their
    loads, holding no register. Without it a tile's ids were first loaded just before its
    first half's copies, and their latency (a DRAM miss) held up the producer."""
    o_n = n0 + gl.arange(0, COUNT, layout=gl.BlockedLayout([1], [32], [PW], [0]))
    o_n = gl.minimum(o_n, gl.maximum(n_end - 1, 0))
    gl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p_idx + o_n],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pp_producer(kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2, k_s3,
                 kp_s, ids_s, bars, q_s0, q_s1, q_s2, q_s3, q_sp, q_nope_ptr, q_pe_ptr, i_t, h0,
                 n_heads, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H: gl.constexpr,
                 BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr, PW: gl.constexpr):
    """The producer: q (``_copy_q``, arriving on ``_Q_READY``), then per pair of tiles, into the
    two slots, the halves in the order they free: the even slot's columns 0-255 (warpgroup
    0's), the odd slot's 256-511 (warpgroup 1's), then the even slot's 256-511 with its rope
    and the odd slot's 0-255 with its rope (each read by the other warpgroup's PV dots too).
    Each half waits for its ``free`` barrier (the previous pair) and ends with an arrival on
    its ``ready`` barrier that lands when this thread's copies have."""
    GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [32 // ROW_THREADS, ROW_THREADS], [PW, 1], [1, 0])
    ROPE: gl.constexpr = gl.BlockedLayout([1, D_PE // ROW_THREADS], [32 // ROW_THREADS, ROW_THREADS],
                                          [PW, 1], [1, 0])
    PASS_ROWS: gl.constexpr = PW * 32 // ROW_THREADS
    PASSES: gl.constexpr = BLOCK_N // PASS_ROWS
    # Both tiles' row ids, loaded once per pair and a pair ahead: their loads' latency hides
    # behind a whole pair's copies and waits. (Each half's ids loaded a half ahead, twice per
    # tile, left the producer stalled on them: 22-30% of its stall samples, run 142; a pair
    # ahead, 1.06x in decode with 4 or 8 producer warps, run 143.)
    ids_e = _pass_ids(p_idx, n_start, n_end, PASS_ROWS, PASSES, GATHER)
    ids_o = _pass_ids(p_idx, n_start + BLOCK_N, n_end, PASS_ROWS, PASSES, GATHER)
    if n_steps > 0:  # (with no rows the consumers read no q)
        # q, while the first ids load: the consumers wait for it before their first score dots
        _copy_q(q_s0, q_s1, q_s2, q_s3, q_sp, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                stride_qn_h, stride_qp_t, stride_qp_h, GATHER, ROPE, PASS_ROWS, BLOCK_H, LAT, D_PE)
        async_copy.mbarrier_arrive(bars.index(_Q_READY), increment_count=False)
    for j in range(gl.cdiv(n_steps, 2)):
        ph = (j & 1) ^ 1  # the previous pair's phase; the first pair passes
        n0 = n_start + 2 * j * BLOCK_N
        # (this prefetch names the ids loaded just below, as measured in run 143; one pair
        # further, n0 + 4 * BLOCK_N, measured 0.995-1.005x, and none 0.986-1.002x: run 166)
        _prefetch_ids(p_idx, n0 + 2 * BLOCK_N, n_end, 2 * BLOCK_N, PW)
        nxt_e = _pass_ids(p_idx, n0 + 2 * BLOCK_N, n_end, PASS_ROWS, PASSES, GATHER)
        nxt_o = _pass_ids(p_idx, n0 + 3 * BLOCK_N, n_end, PASS_ROWS, PASSES, GATHER)
        t, e, o = _slots(j, n_steps)
        mbarrier.wait(bars.index(_free(t, _A0)), ph)
        _copy_ids(ids_s, e, p_idx, n0, n_end, BLOCK_N, PW)
        _copy_half(k_s0, k_s1, kp_s, kv_ptr, ids_e, n_rows, stride_kv, e, 0, False, GATHER, ROPE,
                   PASS_ROWS, PASSES, LAT, D_PE)
        async_copy.mbarrier_arrive(bars.index(_ready(t, _A0)), increment_count=False)
        mbarrier.wait(bars.index(_free(t, _B1)), ph)
        _copy_ids(ids_s, o, p_idx, n0 + BLOCK_N, n_end, BLOCK_N, PW)
        _copy_half(k_s2, k_s3, kp_s, kv_ptr, ids_o, n_rows, stride_kv, o, 2 * LAT, False, GATHER,
                   ROPE, PASS_ROWS, PASSES, LAT, D_PE)
        async_copy.mbarrier_arrive(bars.index(_ready(t, _B1)), increment_count=False)
        mbarrier.wait(bars.index(_free(t, _B0)), ph)
        _copy_half(k_s2, k_s3, kp_s, kv_ptr, ids_e, n_rows, stride_kv, e, 2 * LAT, True, GATHER,
                   ROPE, PASS_ROWS, PASSES, LAT, D_PE)
        async_copy.mbarrier_arrive(bars.index(_ready(t, _B0)), increment_count=False)
        mbarrier.wait(bars.index(_free(t, _A1)), ph)
        _copy_half(k_s0, k_s1, kp_s, kv_ptr, ids_o, n_rows, stride_kv, o, 0, True, GATHER, ROPE,
                   PASS_ROWS, PASSES, LAT, D_PE)
        async_copy.mbarrier_arrive(bars.index(_ready(t, _A1)), increment_count=False)
        ids_e = nxt_e
        ids_o = nxt_o


# The mbarriers, one allocation: each slot's halves' ready (count: the producer's threads),
# then their free (count 1), each as A0, B0, A1, B1 (the even slot's columns 0-255, 256-511,
# the odd slot's). (The two consumer warpgroups' exchanges use hardware barriers: _NB_*.)
_A0, _B0, _A1, _B1 = (gl.constexpr(i) for i in range(4))
# ... and after them q's ready barrier (count: the producer's threads).
_Q_READY = gl.constexpr(8)


@gluon.jit
def _ready(t, half):
    """Index of the ready barrier of ``half`` (_A0 .. _B1); ``t`` is ``_slots``' opaque zero."""
    return 4 * t + half


@gluon.jit
def _free(t, half):
    """Index of the free barrier of ``half``; ``t`` as in ``_ready``."""
    return 4 + 4 * t + half


@gluon.jit
def _opaque_zero(j, n_steps):
    """Zero, computed from the loop index ``j`` and ``n_steps`` (``n_steps < 2^30``) so that
    the compiler cannot fold it: an index that keeps shared-memory addresses and wgmma
    descriptors from being hoisted out of the loops, where they stay live and spill."""
    return (j + n_steps) >> 30


@gluon.jit
def _q_fresh(q_s, z):
    """q tile ``q_s`` seen through ``z`` (``_opaque_zero``): its wgmma descriptor is then
    computed where it is used instead of hoisted out of the loop."""
    return _reinterpret(q_s, q_s.dtype, [1] + q_s.shape, q_s.layout).index(z)


@gluon.jit
def _slots(j, n_steps):
    """``(t, e, o)``: ``t`` an opaque zero (``_opaque_zero``) and the ring slots of pair
    ``j``'s even and odd tile, ``2t`` and ``2t + 1`` (0 and 1), so that the compiler cannot
    hoist the slots' addresses and wgmma descriptors out of the loops (hoisted, the
    partitions spilled: Triton 3.6, sm90: 79 spill instructions in warpgroup 0, 50 in the
    producer)."""
    t = _opaque_zero(j, n_steps)
    return t, 2 * t, 2 * t + 1


@gluon.jit
def _arrive(bars, which):
    """One arrival on ``bars[which]`` for the warpgroup, once all its threads got here. (One
    arrival per thread on a barrier that counts 128 instead: 0.98-1.02x, run 147.)"""
    _arrive_all(bars.index(which))


@gluon.jit
def _scores_by_halves(qa, qb, ka, kb, qc, qd, kc, kd, q_sp, kp, bars, first, second, ph, s_zero):
    """A tile's score dots over its two halves as they land: the latent tiles ``ka``, ``kb``
    once ``bars[first]`` completes phase ``ph``, then ``kc``, ``kd`` and the rope ``kp``
    once ``bars[second]`` does (each against its q tile); one wait for all of them."""
    mbarrier.wait(bars.index(first), ph)
    fence_async_shared()  # the copies (generic proxy) before the wgmma's reads (async proxy)
    s = warpgroup_mma(qa, ka.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(qb, kb.permute((1, 0)), s, is_async=True)
    mbarrier.wait(bars.index(second), ph)
    fence_async_shared()
    s = warpgroup_mma(qc, kc.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(qd, kd.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma(q_sp, kp.permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(0, deps=[s])


@gluon.jit
def _valid_rows(ids_s, slot, n0, n_end, n_rows, BLOCK_N: gl.constexpr):
    """Which of entries ``idx[n0:n0 + BLOCK_N]`` name a cache row, in the score tile's column
    layout, from the copy of them in ``ids_s[slot]`` (``_copy_ids``; read once the tile's first
    half has landed, and before that half is freed)."""
    b_idx = ids_s.index(slot).load(gl.SliceLayout(0, S_L64))
    o_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L64))
    return (b_idx >= 0) & (b_idx < n_rows) & (o_n < n_end)


@gluon.jit
def _nb_arrive(bar_id: gl.constexpr):
    """Arrive, without waiting, at hardware barrier ``bar_id`` of the two consumer warpgroups
    (256 threads): this warpgroup's shared-memory writes before it are visible to the other
    warpgroup once its ``_nb_sync`` on the same barrier returns."""
    gl.inline_asm_elementwise("bar.arrive $1, 256;\n\tmov.u32 $0, 0;", "=r,r",
                              [gl.program_id(0) * 0 + bar_id], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _nb_sync(bar_id: gl.constexpr):
    """Wait at hardware barrier ``bar_id`` until the other consumer warpgroup arrived."""
    gl.inline_asm_elementwise("bar.sync $1, 256;\n\tmov.u32 $0, 0;", "=r,r",
                              [gl.program_id(0) * 0 + bar_id], dtype=gl.int32, is_pure=False, pack=1)


# The two consumer warpgroups' hardware barriers (ids 0-3 are the compiler's own: the
# program's, the hand-over to the partitions, and one per consumer partition). Per pair, each
# arrived at by one warpgroup and waited at by the other: warpgroup 0's tile max ready, the
# pair's joint max ready, P0 ready, P1 ready; at the end, waited at by both: the two
# denominators stored.
_NB_MAX0, _NB_MAX_JOINT, _NB_P0, _NB_P1, _NB_L = (gl.constexpr(8 + i) for i in range(5))


@gluon.jit
def _rows_to_o(v):
    """A per-head vector (the score tile's row layout) as a column to scale the output tiles
    by."""
    return gl.convert_layout(v, gl.SliceLayout(1, O_L))[:, None]


@gluon.jit
def _wg_state(BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr):
    """A consumer warpgroup's starting state: running max (base 2, scaled scores) and
    denominator (the score tile's row layout), its two output tiles, and a zero score tile
    (the score dots' first accumulator, not read)."""
    b_m = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(1, S_L64))
    b_l = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, S_L64))
    acc_x = gl.zeros([BLOCK_H, LAT], gl.float32, layout=O_L)
    acc_y = gl.zeros([BLOCK_H, LAT], gl.float32, layout=O_L)
    return b_m, b_l, acc_x, acc_y, gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L64)


@gluon.jit
def _softmax_step(s, b_m, b_l, m_new, qk_scale):
    """Probabilities of the raw score tile ``s`` (invalid entries -inf) against the new running
    max ``m_new`` (scaled, base 2); returns them, the denominator in ``m_new``'s terms and the
    factor ``2^(b_m - m_new)`` the output tiles are rescaled by."""
    alpha = gl.exp2(b_m - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    return p, b_l * alpha + gl.sum(p, axis=1), alpha


@gluon.jit
def _wg0_pair(s, b_m, b_l, acc_a, acc_b, s_zero, j, q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1,
              k_s2, k_s3, kp_s, ids_s, m_smem, bars, n_start, n_end, n_steps, n_rows, qk_scale,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, NEXT: gl.constexpr):
    """Warpgroup 0's part of pair ``j``, from its even tile's raw scores ``s``; with NEXT, the
    next pair's even tile's score dots are issued behind this pair's last PV dots, and
    returned."""
    t, e, o = _slots(j, n_steps)
    valid = _valid_rows(ids_s, e, n_start + 2 * j * BLOCK_N, n_end, n_rows, BLOCK_N)
    s = gl.where(valid[None, :], s, float("-inf"))
    m_0 = gl.maximum(b_m, gl.max(s, axis=1) * qk_scale)
    m_smem.index(0).store(m_0)
    _nb_arrive(_NB_MAX0)
    p, b_l, alpha = _softmax_step(s, b_m, b_l, m_0, qk_scale)
    a_o = _rows_to_o(alpha)
    acc_a = acc_a * a_o
    acc_b = acc_b * a_o
    p_op = gl.convert_layout(p.to(k_s0.dtype), P_OP)
    acc_a = warpgroup_mma(p_op, k_s0.index(e), acc_a, is_async=True)
    acc_b = warpgroup_mma(p_op, k_s1.index(e), acc_b, is_async=True)
    acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b])
    _arrive(bars, _free(t, _A0))
    # the pair's joint max, from warpgroup 1; P0 in its terms for warpgroup 1's PV dots, into
    # the even slot's rope tile (this tile's score dots, its only reader, are done)
    _nb_sync(_NB_MAX_JOINT)
    m_new = m_smem.index(1).load(b_m.type.layout)
    beta = gl.exp2(m_0 - m_new)
    kp_s.index(e).store((p * beta[:, None]).to(kp_s.dtype))
    fence_async_shared()
    _nb_arrive(_NB_P0)
    b_o = _rows_to_o(beta)
    acc_a = acc_a * b_o
    acc_b = acc_b * b_o
    # the odd tile's rows, with warpgroup 1's probabilities (shared memory)
    _nb_sync(_NB_P1)
    p1 = kp_s.index(o)
    acc_a = warpgroup_mma(p1, k_s0.index(o), acc_a, is_async=True)
    acc_b = warpgroup_mma(p1, k_s1.index(o), acc_b, is_async=True)
    if NEXT:
        # the next even tile's scores behind those PV dots: its columns 0-255 first, then,
        # once the PV dots are done and their half is freed, 256-511 and the rope
        t2, e2, o2 = _slots(j + 1, n_steps)
        ph2 = (j + 1) & 1
        mbarrier.wait(bars.index(_ready(t2, _A0)), ph2)
        fence_async_shared()
        z = _opaque_zero(j, n_steps)
        s = warpgroup_mma(_q_fresh(q_s0, z), k_s0.index(e2).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        s = warpgroup_mma(_q_fresh(q_s1, z), k_s1.index(e2).permute((1, 0)), s, is_async=True)
        acc_a, acc_b = warpgroup_mma_wait(2, deps=[acc_a, acc_b])
        _arrive(bars, _free(t, _A1))
        mbarrier.wait(bars.index(_ready(t2, _B0)), ph2)
        fence_async_shared()
        s = warpgroup_mma(_q_fresh(q_s2, z), k_s2.index(e2).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(_q_fresh(q_s3, z), k_s3.index(e2).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(_q_fresh(q_sp, z), kp_s.index(e2).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
    else:
        acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b])
        _arrive(bars, _free(t, _A1))
    return s, m_new, b_l * beta, acc_a, acc_b


@gluon.jit
def _pp_wg0(q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_s, ids_s, m_smem, l_smem, bars,
            n_start, n_end, n_steps, n_rows, qk_scale, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0,
            n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
            HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr,
            BLOCK_N: gl.constexpr, LAT: gl.constexpr):
    """Warpgroup 0: the even tiles' scores and output columns 0-255 (module docstring), which
    it writes, with the lse. Each next even tile's score dots run behind a pair's last PV dots
    (``_wg0_pair``), so the last pair is peeled off the loop."""
    b_m, b_l, acc_a, acc_b, s_zero = _wg_state(BLOCK_H, BLOCK_N, LAT)
    n_pairs = gl.cdiv(n_steps, 2)
    s = s_zero
    if n_pairs > 0:
        t, e, o = _slots(0, n_steps)
        mbarrier.wait(bars.index(_Q_READY), 0)
        s = _scores_by_halves(q_s0, q_s1, k_s0.index(e), k_s1.index(e), q_s2, q_s3, k_s2.index(e),
                              k_s3.index(e), q_sp, kp_s.index(e), bars, _ready(t, _A0),
                              _ready(t, _B0), 0, s_zero)
    for j in range(n_pairs - 1):
        s, b_m, b_l, acc_a, acc_b = _wg0_pair(
            s, b_m, b_l, acc_a, acc_b, s_zero, j, q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3,
            kp_s, ids_s, m_smem, bars, n_start, n_end, n_steps, n_rows, qk_scale, BLOCK_H, BLOCK_N,
            True)
    if n_pairs > 0:
        s, b_m, b_l, acc_a, acc_b = _wg0_pair(
            s, b_m, b_l, acc_a, acc_b, s_zero, n_pairs - 1, q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1,
            k_s2, k_s3, kp_s, ids_s, m_smem, bars, n_start, n_end, n_steps, n_rows, qk_scale, BLOCK_H,
            BLOCK_N, False)
    b_l = _whole_denominator(b_l, l_smem, 0)
    _pp_epilogue(acc_a, acc_b, 0, b_m, b_l, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                 stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL,
                 True, BLOCK_H, LAT)


@gluon.jit
def _pp_wg1(q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_s, ids_s, m_smem, l_smem, bars,
            n_start, n_end, n_steps, n_rows, qk_scale, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0,
            n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
            HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr,
            BLOCK_N: gl.constexpr, LAT: gl.constexpr):
    """Warpgroup 1: the odd tiles' scores and output columns 256-511 (module docstring),
    which it writes."""
    b_m, b_l, acc_c, acc_d, s_zero = _wg_state(BLOCK_H, BLOCK_N, LAT)
    if n_steps > 0:
        mbarrier.wait(bars.index(_Q_READY), 0)
    for j in range(gl.cdiv(n_steps, 2)):
        ph = j & 1
        t, e, o = _slots(j, n_steps)
        # the odd tile's scores: its columns 256-511 first (the half refilled first, with the
        # tile's ids); past the end of the range its rows are zero-filled and every entry is
        # masked
        z = _opaque_zero(j, n_steps)
        s = _scores_by_halves(_q_fresh(q_s2, z), _q_fresh(q_s3, z), k_s2.index(o), k_s3.index(o),
                              _q_fresh(q_s0, z), _q_fresh(q_s1, z), k_s0.index(o), k_s1.index(o),
                              _q_fresh(q_sp, z), kp_s.index(o), bars, _ready(t, _B1),
                              _ready(t, _A1), ph, s_zero)
        valid = _valid_rows(ids_s, o, n_start + (2 * j + 1) * BLOCK_N, n_end, n_rows, BLOCK_N)
        s = gl.where(valid[None, :], s, float("-inf"))
        s_max = gl.max(s, axis=1) * qk_scale
        _nb_sync(_NB_MAX0)
        m_new = gl.maximum(m_smem.index(0).load(b_m.type.layout), s_max)
        m_smem.index(1).store(m_new)
        _nb_arrive(_NB_MAX_JOINT)
        p, b_l, alpha = _softmax_step(s, b_m, b_l, m_new, qk_scale)
        a_o = _rows_to_o(alpha)
        acc_c = acc_c * a_o
        acc_d = acc_d * a_o
        b_m = m_new
        p_bf = p.to(k_s2.dtype)
        p_op = gl.convert_layout(p_bf, P_OP)
        acc_c = warpgroup_mma(p_op, k_s2.index(o), acc_c, is_async=True)
        acc_d = warpgroup_mma(p_op, k_s3.index(o), acc_d, is_async=True)
        # P1 for warpgroup 0's PV dots, into the odd slot's rope tile (read by the score dots
        # above, which are done), while these PV dots run
        kp_s.index(o).store(p_bf)
        # P1 handed over and the odd slot's columns 256-511 freed before waiting for P0, so that
        # warpgroup 0 need not wait for this warpgroup's wait and the half this warpgroup needs
        # first in the next pair is refilled sooner (FlashMLA's kernel does both after its PV
        # dots over P0; this order: 1.04-1.05x with 64-row tiles, 1.00-1.04x with 32, run 149)
        fence_async_shared()
        _nb_arrive(_NB_P1)
        acc_c, acc_d = warpgroup_mma_wait(0, deps=[acc_c, acc_d])
        _arrive(bars, _free(t, _B1))
        # the even tile's rows, with warpgroup 0's probabilities (shared memory)
        _nb_sync(_NB_P0)
        p0 = kp_s.index(e)
        acc_c = warpgroup_mma(p0, k_s2.index(e), acc_c, is_async=True)
        acc_d = warpgroup_mma(p0, k_s3.index(e), acc_d, is_async=True)
        acc_c, acc_d = warpgroup_mma_wait(0, deps=[acc_c, acc_d])
        _arrive(bars, _free(t, _B0))
    b_l = _whole_denominator(b_l, l_smem, 1)
    _pp_epilogue(acc_c, acc_d, 2 * LAT, b_m, b_l, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                 stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL,
                 False, BLOCK_H, LAT)


@gluon.jit
def _whole_denominator(b_l, l_smem, wg: gl.constexpr):
    """Warpgroup ``wg``'s denominator (its tiles', in the final max's terms) plus the other's,
    exchanged through shared memory; the same sum, in the same order, in both."""
    l_smem.index(wg).store(b_l)
    _nb_sync(_NB_L)
    return l_smem.index(0).load(b_l.type.layout) + l_smem.index(1).load(b_l.type.layout)


@gluon.jit
def _pp_epilogue(acc_x, acc_y, col0, b_m, b_l, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                 stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK: gl.constexpr,
                 PARTIAL: gl.constexpr, WRITES_LSE: gl.constexpr, BLOCK_H: gl.constexpr,
                 LAT: gl.constexpr):
    """A warpgroup's output columns ``col0 : col0 + 2 * LAT`` (final, with lse and sink, or
    with PARTIAL the partial output and base-2 lse: gluon_sm90._epilogue's conventions); the
    lse written where WRITES_LSE."""
    inv_l = _rows_to_o(_lse_and_scale(b_m, b_l, sink_ptr, lse_ptr, i_t, i_s, h0, n_heads, stride_lse_t,
                                      stride_lse_h, HAS_SINK, PARTIAL, WRITES_LSE, BLOCK_H))
    o_ho = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_L))
    o_co = col0 + gl.arange(0, LAT, layout=gl.SliceLayout(0, O_L))
    p_o = out_ptr + i_t * stride_o_t + i_s * stride_o_s + o_ho[:, None] * stride_o_h + o_co[None, :]
    m_o = (o_ho < n_heads)[:, None]
    gl.store(p_o, (acc_x * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)
    gl.store(p_o + LAT, (acc_y * inv_l).to(out_ptr.dtype.element_ty), mask=m_o)


@gluon.jit(do_not_specialize=_NOT_SPECIALIZED)
def sparse_mla_gluon_pp_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
    qk_scale, n_rows, n_heads, topk, split_size,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_kv, stride_idx_t,
    stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
    HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
    PW: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):
    """One program (one token x 64 heads x one split of its top-k) over rows of q's dtype, as
    gluon_sm90's kernels, with the two consumer warpgroups on alternate tiles (module
    docstring), ``PW`` (4) producer warps and ``CONSUMER_REGS`` registers per consumer thread."""
    gl.static_assert(PW == 4)
    i_t, h0 = _tile_origin(n_heads, BLOCK_H)
    gl.static_assert((BLOCK_H == 64) & (D_PE == 64) & (BLOCK_N == 64))
    NSLOT: gl.constexpr = 2  # one pair of 64-row tiles
    dtype: gl.constexpr = kv_ptr.dtype.element_ty
    # q, copied by the producer (_copy_q)
    q_s0 = gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM)
    q_s1 = gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM)
    q_s2 = gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM)
    q_s3 = gl.allocate_shared_memory(dtype, [BLOCK_H, LAT], SMEM)
    q_sp = gl.allocate_shared_memory(dtype, [BLOCK_H, D_PE], SMEM)
    k_s0 = gl.allocate_shared_memory(dtype, [NSLOT, BLOCK_N, LAT], SMEM)
    k_s1 = gl.allocate_shared_memory(dtype, [NSLOT, BLOCK_N, LAT], SMEM)
    k_s2 = gl.allocate_shared_memory(dtype, [NSLOT, BLOCK_N, LAT], SMEM)
    k_s3 = gl.allocate_shared_memory(dtype, [NSLOT, BLOCK_N, LAT], SMEM)
    # the rope, then P: a probability tile [BLOCK_H, BLOCK_N] takes its slot's rope tile
    kp_s = gl.allocate_shared_memory(dtype, [NSLOT, BLOCK_N, D_PE], SMEM)
    ids_s = gl.allocate_shared_memory(gl.int32, [NSLOT, BLOCK_N], FLAT1)  # each slot's row ids
    m_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], FLAT1)  # m0, then M
    l_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], FLAT1)
    bars = gl.allocate_shared_memory(gl.int64, [9, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(4):
        mbarrier.init(bars.index(j), count=32 * PW)  # ready: one per producer thread
    for j in gl.static_range(4):
        mbarrier.init(bars.index(4 + j), count=1)
    mbarrier.init(bars.index(_Q_READY), count=32 * PW)
    fence_async_shared()  # the barriers' initialisation, before the partitions
    _barrier()

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    gl.warp_specialize(
        [(_pp_producer, (kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2,
                         k_s3, kp_s, ids_s, bars, q_s0, q_s1, q_s2, q_s3, q_sp, q_nope_ptr, q_pe_ptr,
                         i_t, h0, n_heads, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H,
                         BLOCK_N, LAT, D_PE, PW)),
         (_pp_wg0, (q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_s, ids_s, m_smem, l_smem,
                    bars, n_start, n_end, n_steps, n_rows, qk_scale, sink_ptr, out_ptr, lse_ptr, i_t,
                    i_s, h0, n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                    HAS_SINK, PARTIAL, BLOCK_H, BLOCK_N, LAT)),
         (_pp_wg1, (q_s0, q_s1, q_s2, q_s3, q_sp, k_s0, k_s1, k_s2, k_s3, kp_s, ids_s, m_smem, l_smem,
                    bars, n_start, n_end, n_steps, n_rows, qk_scale, sink_ptr, out_ptr, lse_ptr, i_t,
                    i_s, h0, n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                    HAS_SINK, PARTIAL, BLOCK_H, BLOCK_N, LAT))],
        [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
