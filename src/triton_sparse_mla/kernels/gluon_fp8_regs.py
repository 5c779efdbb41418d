"""sm90's few-head Gluon kernel over fp8_ds_mla rows whose dots read the rows' raw e4m3 bytes:
the score dots as e4m3 wgmmas straight from shared memory, the PV dots from registers the
consumers convert them into (``TileConfig.fp8_regs``).

In kernels/gluon_fp8_producer.py the producer dequantizes each tile into a 16-bit operand
slot that both dots read from shared memory. At 16 heads a 64-row step then moves about
310 KB through shared memory (the raw bytes written and read, the 16-bit tile written, read
by the score dots and again, transposed, by the PV dots), the busiest unit in that kernel's
profiles (docs/performance-plan.md).

Here the producer only copies: each row's 512 e4m3 bytes, its 4 scales and its bf16 rope,
into a ring of ``NS`` slots of 41 KB (a 16-bit slot is 72 KB), each latent tile of the slot
[64 rows, 128 bytes] apart in the wgmma's 128-byte swizzle (``_COPY_VIEW``). Then:

* scores ``S^T [64 rows, H] = sum_t s_t * (K_t . q_t^T) + K_rope . q_rope^T``: per 128-column
  latent tile ``t`` a chain of e4m3 wgmmas (k32) whose A operand is the raw tile in shared
  memory (``_TILES``), no conversion, against q's tile in two e4m3 parts per head side by
  side along N (``hi = e4m3(q f)``, ``lo = e4m3(16 (q f - hi))``, ``f`` a power of two per
  head that brings its largest latent value into (224, 448]: a bf16 q's 8 significant bits
  held exactly unless the low part falls below e4m3's normal range); the parts summed in
  registers, each tile scaled by its rows' scale ``s_t`` in fp32 afterwards (the scale is
  per row, the dot's M) and the sum by ``1 / f`` per head;
* output ``O_t^T [128 columns, H] += V_t^T . (P * s_t)^T``: the consumers load the raw bytes
  into the register layout of a wgmma's A operand and convert them to fp16 (exact: every
  e4m3 value is an fp16 value). The scale of row ``r`` (the dot's K) multiplies the
  probabilities, four P^T tiles a step, each times 2^8 (divided out at the end). P * s * 2^8
  stays finite in fp16 for any scale below 2^8 (a latent tile's largest value below 2^8 x
  448); a tiny scale costs only fp16's absolute subnormal step.

A wgmma's A fragment gives each thread pairs of K-adjacent values, in columns 8 apart and
rows 8 apart; read as it stands that is a shared-memory access of 2 bytes. But the order of
the output's columns (M of the PV dots) is free if the epilogue writes each to its place. So
the PV dots' view of the raw bytes (``_W_VIEW``) maps a thread's 4 output columns to 4
consecutive bytes of a row (one 4-byte load per row), and the epilogue stores column ``m`` of
tile ``t`` at ``128 t + v_col(m)`` (``_W_VIEW``'s comment); under the copy's swizzle those
loads are free of bank conflicts. Both views are linear maps of the offset
(``gl.SharedLinearLayout``). Each pair of rows' words then becomes the fragment's K pairs by
two byte permutes and four conversions (``_PAIRS_ASM``): 1.017x at 16 heads and 1.036x at 8
over the form that left the order to the compiler (H100, run 381, T=4096 over 32K rows, two
rounds), which permuted the converted 16-bit values instead, twice as many permutes.

One consumer warpgroup per program takes every step, and two programs share an SM (each 108
KB of shared memory at 16 heads, 256 threads launched with at most 128 registers each: the
consumer 200, the producer 56), so that the SM runs two consumer warpgroups whose tiles start
and end apart. (One program whose two warpgroups took alternate steps and merged their states
at the end ran 1.037x slower at 16 heads and 1.051x at 8: H100, run 366.)

A consumer step (:func:`_steps`): the previous step's last PV dots (its last tile's raw words
carried in 16 registers and converted here), the wait for the step's slot, the rope dot and the
latent tiles' e4m3 score dots from shared memory, the softmax, four P^T tiles stored, then each
latent tile's words loaded, converted and its PV dots issued; the slot is freed once the score
dots are done and the last tile's words are in registers. The step is bound by that chain's
latency, not by issue slots or a pipe (Nsight Compute, runs 349 and 362: the consumers issue on
about 20% of their cycles; at 16 heads the tensor pipe is busy 20% of the cycles, the ALU pipe
41%). The producer (:func:`regs_producer`) loads each step's row ids a step ahead, into
registers, and copies two rows per instruction (``COPY_ROWS``).

Measured (BENCHMARKS.md, the parts from "Raw e4m3 rows into register operands" on; each change
timed against the tree before it in one run): against kernels/gluon_fp8_producer.py's tile,
prefill T=4096 over 32K rows 1.40x at 16 heads and 1.50x at 8, over 1M rows 1.16-1.17x at 16
(H100, run 386). sm90's prefill and decode tables run it up to 16 heads (configs._N8_REGS,
_N16_REGS). In prefill it also beats the bf16 workspace (workspace.py) at every reuse
measured; in decode, split for one program per SM (configs.split_rule), 1.04-1.12x the tile
before it at T=32-512, but 0.95x at T=32 with 16 heads (runs 387-388), until its output was
stored 4 columns a thread (:func:`regs_epilogue`): 1.13x more there, 1.055x at T=32 with 8
heads, 1.008-1.013x at T=128, 1.019x in prefill (run 396). Tried and
dropped: three consumer warpgroups on every third step (0.88-0.95x, runs 341 and 345); the
score dots' A fragments as e4m3 in registers (wrong results, likeliest because Triton's wgmma
wait takes no 8-bit values, so nothing kept those registers until the dots had read them); the next step's
score dots issued early (0.85x at 16 heads, run 368: the ring would need its next slot
sooner); the last PV dots carried across the loop as an async accumulator (ptxas then
serialized every wgmma, C7514).

Shared memory per 64-row step at 16 heads: 41 KB copied in, 32 KB read by the score dots and
32 KB by the PV view, the rope tile, q and P^T read by the dots: about 150 KB. The raw slot is
free once the score dots are done and the PV view's bytes are in registers, before the last PV
dots run. Per program: ring 2 x 41 KB, q 18 KB, P^T 4 x 2 KB: 108 KB.

Import only where Gluon is available and not under the interpreter (as gluon_sm90).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from . import gluon_narrow
from .gluon_pingpong import _opaque_zero, _q_fresh
from .gluon_sm90 import (FLAT, FLAT1, Q_F16_SCALE, SMEM, _NOT_SPECIALIZED, _arrive_all, _async_load, _barrier,
                         _lse_and_scale, _pass_ids, _pass_row, _reinterpret, _row_ids, _split_range, _tile_origin)

# The latent row: 512 e4m3 bytes in four tiles of 128 columns, then 4 fp32 scales and the bf16
# rope (formats.FP8_ROPE_BYTE).
RAW = gl.constexpr(512)
# The probabilities times P_SCALE (2^8) before their rounding to fp16, divided out at the end.
P_SCALE = gl.constexpr(256.0)
P_UNSCALE = gl.constexpr(1.0 / 256.0)

# A raw slot [64 rows, 512 bytes] as the producer's copies see it (logical row, byte of the row):
# the four latent tiles apart, each [64 rows, 128 bytes] in wgmma's 128-byte swizzle (a row's
# 16-byte chunk index XOR the row's bits 0-2), so that the score dots read their A operand
# straight from it (``_TILES``): offset bits 0-6 the byte of the tile's row (bits 4-6 flipped by
# the row's bits 0-2), 7-12 the row, 13-14 the tile.
_COPY_VIEW = gl.constexpr(gl.SharedLinearLayout(offset_bases=[
    [0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [0, 32], [0, 64], [1, 16], [2, 32], [4, 64],
    [8, 0], [16, 0], [32, 0], [0, 128], [0, 256]]))
# e4m3 tiles as the score dots read them: the slot's bytes as their A operands ([4 tiles, 64
# rows, 128]) and q's parts as their B ([2 x BLOCK_H, 128]: row h holds head h's high part,
# BLOCK_H + h its low part).
_TILES = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
E4M3_MAX = gl.constexpr(448.0)

@gluon.constexpr_function
def _acc_layout(BLOCK_H):
    """The accumulators' layout: one warpgroup, heads along N."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_H, 16])


# The PV dots' view of a slot: V^T's columns (M) as words of 4 bytes, [128 words, row], under
# the copy's swizzle. Word w of a row holds the columns m, m + 8, m + 64 and m + 72 of tile
# ``w // 32`` (m's bits 0-2 and 4-5 are w's bits 0-4), so a row's byte is ``v_col(m)``: bits
# 0-1 m's bits 3 and 6, 2-4 m's bits 0-2, 5-6 m's bits 4-5.
_W_VIEW = gl.constexpr(gl.SharedLinearLayout(offset_bases=[
    [1, 0], [2, 0], [4, 0], [8, 0], [16, 0], [4, 1], [8, 2], [16, 4], [0, 8], [0, 16], [0, 32], [32, 0], [64, 0]]))
# One tile's words as the consumers load them [32, 64]: a wgmma A fragment of one warpgroup (4
# warps along M) with the 4 columns of a word in one register, rows 2j and 2j + 1 in
# consecutive registers; after :func:`_as_operand` the fragment's own values per thread.
_W_LOAD = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 8], [0, 16], [0, 32]],
    lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]], warp_bases=[[8, 0], [16, 0]], block_bases=[],
    shape=[32, 64]))
# Two rows' words (rows 2j and 2j + 1) into the fp16 values of a wgmma A fragment, two to a
# register: one byte permute per two columns' K pairs, one conversion per K pair. Outputs:
# rows 2j and 2j + 1 at columns m, m + 8, m + 64 and m + 72. Left to Triton (the bytes loaded
# in the fragment's order and converted), the compiler permuted the converted 16-bit values
# instead, one PRMT per K pair: 128 a thread and step where this takes 64.
_PAIRS_ASM = gl.constexpr("""{
.reg .b32 lo, hi;
.reg .b16 l0, l1, h0, h1;
prmt.b32 lo, $4, $5, 0x5140;
prmt.b32 hi, $4, $5, 0x7362;
mov.b32 {l0, l1}, lo;
mov.b32 {h0, h1}, hi;
cvt.rn.f16x2.e4m3x2 $0, l0;
cvt.rn.f16x2.e4m3x2 $1, l1;
cvt.rn.f16x2.e4m3x2 $2, h0;
cvt.rn.f16x2.e4m3x2 $3, h1;
}""")


@gluon.jit
def _as_operand(w, T_L: gl.constexpr):
    """One tile's raw words ``w`` [32, 64] (as loaded in ``_W_LOAD``) converted (exactly: every
    e4m3 value is an fp16 value) to V^T [128, 64] fp16, the A operand of a wgmma with
    accumulator layout ``T_L``."""
    # (pack=2: each call takes two consecutive registers, rows 2j and 2j + 1 of a word)
    o = gl.inline_asm_elementwise(_PAIRS_ASM, "=r,=r,=r,=r,r,r", [w], [gl.float16] * 4, is_pure=True, pack=2)
    x = gl.join(gl.join(o[0], o[1]), gl.join(o[2], o[3]))  # [word, row, m bit 3, m bit 6]
    # the word's bits 0-2 are m's bits 0-2, its bits 3-4 m's bits 4-5
    x = x.reshape([4, 8, 64, 2, 2]).permute((4, 0, 3, 1, 2)).reshape([128, 64])
    return gl.convert_layout(x, gl.DotOperandLayout(operand_index=0, parent=T_L, k_width=2), assert_trivial=True)


@gluon.jit
def _store_q8(q_s, b_q, q_scale, BLOCK_H: gl.constexpr):
    """One latent tile of q ``b_q`` [BLOCK_H, 128] fp32 times ``q_scale`` per head as two e4m3
    parts into ``q_s``: rows h the high part, BLOCK_H + h 16 x the rest."""
    b_q = b_q * q_scale[:, None]
    hi = b_q.to(gl.float8e4nv)
    q_s.slice(0, BLOCK_H).store(hi)
    q_s.slice(BLOCK_H, BLOCK_H).store(((b_q - hi.to(gl.float32)) * 16.0).to(gl.float8e4nv))


@gluon.jit
def _load_q8(q_s0, q_s1, q_s2, q_s3, q_sp, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t, stride_qn_h,
             stride_qp_t, stride_qp_h, BLOCK_H: gl.constexpr, D_PE: gl.constexpr):
    """q into shared memory: its four latent tiles as two e4m3 parts per head (``hi = e4m3(q x
    s)``, ``lo = e4m3(16 (q x s - hi))``, rows h and BLOCK_H + h), its rope in bf16 times
    Q_F16_SCALE. ``s`` is a power of two per head that brings its largest latent value into
    (224, 448] (at most 2^118); returns Q_F16_SCALE / s [BLOCK_H] in the layout of the scores'
    columns."""
    G: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    o_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, G))
    m_h = (o_h < n_heads)[:, None]
    o_k = gl.arange(0, 128, layout=gl.SliceLayout(0, G))
    p_q = (q_nope_ptr + i_t * stride_qn_t + o_h * stride_qn_h)[:, None] + o_k[None, :]
    b_0 = gl.load(p_q, mask=m_h, other=0.0).to(gl.float32)
    b_1 = gl.load(p_q + 128, mask=m_h, other=0.0).to(gl.float32)
    b_2 = gl.load(p_q + 256, mask=m_h, other=0.0).to(gl.float32)
    b_3 = gl.load(p_q + 384, mask=m_h, other=0.0).to(gl.float32)
    amax = gl.maximum(gl.maximum(gl.max(gl.abs(b_0), axis=1), gl.max(gl.abs(b_1), axis=1)),
                      gl.maximum(gl.max(gl.abs(b_2), axis=1), gl.max(gl.abs(b_3), axis=1)))
    amax = gl.where(amax > 0.0, amax, 1.0)
    # (at most 2^118, so that Q_F16_SCALE / q_scale stays a normal fp32 for a q near bf16's
    # smallest values, whose parts then flush to zero)
    q_scale = gl.exp2(gl.minimum(gl.floor(gl.log2(E4M3_MAX / amax)), 118.0))
    _store_q8(q_s0, b_0, q_scale, BLOCK_H)
    _store_q8(q_s1, b_1, q_scale, BLOCK_H)
    _load_q_rope(q_sp, q_pe_ptr, i_t, h0, n_heads, stride_qp_t, stride_qp_h, BLOCK_H, D_PE)
    _store_q8(q_s2, b_2, q_scale, BLOCK_H)
    _store_q8(q_s3, b_3, q_scale, BLOCK_H)
    return gl.convert_layout(Q_F16_SCALE / q_scale, gl.SliceLayout(0, _acc_layout(BLOCK_H)))


@gluon.jit
def _load_q_rope(q_sp, q_pe_ptr, i_t, h0, n_heads, stride_qp_t, stride_qp_h, BLOCK_H: gl.constexpr,
                 D_PE: gl.constexpr):
    """q's rope into shared memory in bf16, times Q_F16_SCALE."""
    GP: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    o_h2 = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, GP))
    o_p = gl.arange(0, D_PE, layout=gl.SliceLayout(0, GP))
    p_qp = (q_pe_ptr + i_t * stride_qp_t + o_h2 * stride_qp_h)[:, None] + o_p[None, :]
    b_qp = gl.load(p_qp, mask=(o_h2 < n_heads)[:, None], other=0.0)
    q_sp.store((b_qp.to(gl.float32) * Q_F16_SCALE).to(gl.bfloat16))


@gluon.jit
def _scale_col(sc_smem, slot, t: gl.constexpr, LAYOUT: gl.constexpr):
    """Column ``t`` of slot ``slot``'s row scales, [64] fp32 in ``LAYOUT``."""
    return sc_smem.index(4 * slot + t).load(LAYOUT)


@gluon.constexpr_function
def _acc8_layout(BLOCK_H):
    """The fp8 score dots' accumulators: one warpgroup, both parts of each head along N."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 2 * BLOCK_H, 32])


@gluon.jit
def _pair_sum(st, T_L: gl.constexpr):
    """Each head's two parts summed, the low one divided by 16: [64, 2 x BLOCK_H] -> [64,
    BLOCK_H] in ``T_L`` (columns h and BLOCK_H + h are registers of one thread, and the sum
    has T_L's place for head h)."""
    hi, lo = st.reshape([st.shape[0], 2, st.shape[1] // 2]).permute((0, 2, 1)).split()
    return gl.convert_layout(hi + lo * 0.0625, T_L, assert_trivial=True)


@gluon.jit
def _scores_fp8(tiles, q_s0, q_s1, q_s2, q_s3, c0, c1, c2, c3, q_f, sp, zero8, acc3, v3, T_L: gl.constexpr):
    """The scores ``sp`` (the rope dot's, issued) plus each latent tile's e4m3 dots, A the raw
    tile in shared memory (``tiles``), times its rows' scales and ``q_f`` per head (q's parts
    back to Q_F16_SCALE); the next tile's dots in flight while one tile's are summed. The
    previous step's last PV dots (``acc3`` from ``v3``), issued before all these, are waited
    for with the first tile's. Returns the scores and ``acc3``."""
    st0 = warpgroup_mma(tiles.index(0), q_s0.permute((1, 0)), zero8, use_acc=False, is_async=True)
    st1 = warpgroup_mma(tiles.index(1), q_s1.permute((1, 0)), zero8, use_acc=False, is_async=True)
    st0, acc3, v3 = warpgroup_mma_wait(1, deps=[st0, acc3, v3])
    lat = _pair_sum(st0, T_L) * c0[:, None]
    st2 = warpgroup_mma(tiles.index(2), q_s2.permute((1, 0)), zero8, use_acc=False, is_async=True)
    st1 = warpgroup_mma_wait(1, deps=[st1])
    lat = lat + _pair_sum(st1, T_L) * c1[:, None]
    st3 = warpgroup_mma(tiles.index(3), q_s3.permute((1, 0)), zero8, use_acc=False, is_async=True)
    st2 = warpgroup_mma_wait(1, deps=[st2])
    lat = lat + _pair_sum(st2, T_L) * c2[:, None]
    sp, st3 = warpgroup_mma_wait(0, deps=[sp, st3])
    lat = lat + _pair_sum(st3, T_L) * c3[:, None]
    return sp + lat * q_f[None, :], acc3


@gluon.jit
def _steps(q_s0, q_s1, q_s2, q_s3, q_sp, q_f, raw_ring, kp_smem, sc_smem, p_s, ready, free, p_idx, n_start, n_end,
           n_steps, n_rows, qk_scale, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, NS: gl.constexpr):
    """The consumer warpgroup's steps: the scores from the raw tiles (:func:`_scores_fp8`, q's
    parts back to scale by ``q_f`` per head), the online softmax along the rows (as
    kernels/gluon_narrow.py's), the four scaled P^T tiles (``p_s``), the slot freed, the PV
    dots, the last of them issued at the next step's start and waited for with its first
    score dots. Returns the four output accumulators [128, BLOCK_H] (columns in ``v_col``
    order, times P_SCALE), the running max and per-entry denominators."""
    T_L: gl.constexpr = _acc_layout(BLOCK_H)
    ROW: gl.constexpr = gl.SliceLayout(1, T_L)
    b_m = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(0, T_L))
    b_l2 = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    acc0 = gl.zeros([128, BLOCK_H], gl.float32, layout=T_L)
    acc1 = gl.zeros([128, BLOCK_H], gl.float32, layout=T_L)
    acc2 = gl.zeros([128, BLOCK_H], gl.float32, layout=T_L)
    acc3 = gl.zeros([128, BLOCK_H], gl.float32, layout=T_L)
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    zero8 = gl.zeros([BLOCK_N, 2 * BLOCK_H], gl.float32, layout=_acc8_layout(BLOCK_H))
    # Each step issues the previous step's last PV dots (P^T tile 3 and that step's last raw
    # words ``w3``, converted here) first, so that they run while it waits for its slot and
    # issues its score dots; before the first step they add zero times zero (P^T tile 3
    # cleared). (Carried converted, the 32 registers of the fragment were copied into the
    # wgmma's at every step's start: 32 moves a step that the 16 raw words do not need.)
    w3 = gl.zeros([32, BLOCK_N], gl.int32, layout=_W_LOAD)
    p_s.index(3).store(gl.zeros([BLOCK_N, BLOCK_H], gl.float16, layout=T_L))
    fence_async_shared()
    _barrier()
    b_idx_next = _row_ids(p_idx, n_start, n_end, ROW, BLOCK_N)
    for i in range(n_steps):
        # (q's and P^T's views through an index the compiler cannot fold, so that their wgmma
        # descriptors are formed where used instead of hoisted out of the loop and spilled:
        # kernels/gluon_pingpong.py's _q_fresh)
        z = _opaque_zero(i, n_steps)
        slot = i % NS
        pt0 = p_s.index(z)
        pt1 = p_s.index(1 + z)
        pt2 = p_s.index(2 + z)
        pt3 = p_s.index(3 + z)
        b_idx = b_idx_next
        # (the next step's ids, loaded a step ahead: an L2 latency per step otherwise, 4.6% of
        # the consumers' samples at 16 heads in run 349)
        b_idx_next = _row_ids(p_idx, n_start + (i + 1) * BLOCK_N, n_end, ROW, BLOCK_N)
        v3 = _as_operand(w3, T_L)
        acc3 = warpgroup_mma(v3, pt3, acc3, is_async=True)
        mbarrier.wait(ready.index(slot), (i // NS) & 1)
        fence_async_shared()  # the copies before the wgmma's reads of the slot
        # the slot's four latent tiles as the score dots' A operands
        tiles = _reinterpret(raw_ring.index(slot), gl.float8e4nv, [4, BLOCK_N, 128], _TILES)
        c0 = _scale_col(sc_smem, slot, 0, ROW)
        c1 = _scale_col(sc_smem, slot, 1, ROW)
        c2 = _scale_col(sc_smem, slot, 2, ROW)
        c3 = _scale_col(sc_smem, slot, 3, ROW)
        sp = warpgroup_mma(kp_smem.index(slot), _q_fresh(q_sp, z).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        s, acc3 = _scores_fp8(tiles, _q_fresh(q_s0, z), _q_fresh(q_s1, z), _q_fresh(q_s2, z), _q_fresh(q_s3, z),
                              c0, c1, c2, c3, q_f, sp, zero8, acc3, v3, T_L)
        p, b_m, b_l2, acc0, acc1, acc2, acc3 = gluon_narrow.narrow_probs(s, b_idx, n_rows, qk_scale, b_m, b_l2,
                                                                         acc0, acc1, acc2, acc3)
        p = p * P_SCALE
        pt0.store((p * c0[:, None]).to(gl.float16))
        pt1.store((p * c1[:, None]).to(gl.float16))
        pt2.store((p * c2[:, None]).to(gl.float16))
        pt3.store((p * c3[:, None]).to(gl.float16))
        vv = _reinterpret(raw_ring.index(slot), gl.int32, [RAW // 4, BLOCK_N], _W_VIEW)
        v0 = _as_operand(vv.slice(0, 32, dim=0).load(_W_LOAD), T_L)
        v1 = _as_operand(vv.slice(32, 32, dim=0).load(_W_LOAD), T_L)
        fence_async_shared()  # this thread's part of P^T, for the wgmma
        _barrier()  # every thread of the warpgroup's part
        # (at most two V fragments live, and a third loading)
        acc0 = warpgroup_mma(v0, pt0, acc0, is_async=True)
        acc1 = warpgroup_mma(v1, pt1, acc1, is_async=True)
        v2 = _as_operand(vv.slice(64, 32, dim=0).load(_W_LOAD), T_L)
        acc0, v0 = warpgroup_mma_wait(1, deps=[acc0, v0])
        acc2 = warpgroup_mma(v2, pt2, acc2, is_async=True)
        w3 = vv.slice(96, 32, dim=0).load(_W_LOAD)
        # the score dots are done and every thread of the warpgroup has its V bytes in
        # registers: the slot is free
        _arrive_all(free.index(slot))
        acc1, v1 = warpgroup_mma_wait(1, deps=[acc1, v1])
        acc2, v2 = warpgroup_mma_wait(0, deps=[acc2, v2])
    acc3 = warpgroup_mma(_as_operand(w3, T_L), p_s.index(3), acc3, is_async=True)
    acc3 = warpgroup_mma_wait(0, deps=[acc3])
    return acc0, acc1, acc2, acc3, b_m, b_l2


@gluon.jit
def regs_consumer(q_s0, q_s1, q_s2, q_s3, q_sp, raw_ring, kp_smem, sc_smem, p_s, ready, free, p_idx, n_start, n_end,
                  n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t, stride_qn_h,
                  stride_qp_t, stride_qp_h, sink_ptr, out_ptr, lse_ptr, i_s, stride_o_t, stride_o_h, stride_o_s,
                  stride_lse_t, stride_lse_h, HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr,
                  BLOCK_N: gl.constexpr, NS: gl.constexpr):
    """The consumer warpgroup: q into shared memory, every step (:func:`_steps`), the output
    written."""
    q_f = _load_q8(q_s0, q_s1, q_s2, q_s3, q_sp, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                   stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H, q_sp.shape[1])
    fence_async_shared()  # q's stores (generic proxy) before the wgmma's reads
    _barrier()  # every thread's part of q
    acc0, acc1, acc2, acc3, b_m, b_l2 = _steps(q_s0, q_s1, q_s2, q_s3, q_sp, q_f, raw_ring, kp_smem, sc_smem, p_s,
                                               ready, free, p_idx, n_start, n_end, n_steps, n_rows, qk_scale, BLOCK_H,
                                               BLOCK_N, NS)
    regs_epilogue(acc0, acc1, acc2, acc3, b_m, gl.sum(b_l2, axis=0), sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0,
                  n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL, BLOCK_H)


@gluon.jit
def _copy_pass(raw, kp, kv_ptr, ids, n_rows, stride_kv, j: gl.constexpr, o_b, o_p, ROWS: gl.constexpr,
               ROPEL: gl.constexpr):
    """Pass ``j``'s rows into the raw slot view ``raw`` and the rope slot ``kp``, ids from
    ``_pass_ids``'s ``[ROWS, passes]``."""
    ids = _pass_row(ids, j)
    p_row = kv_ptr + ids.to(gl.int64) * stride_kv
    ok = (ids >= 0) & (ids < n_rows)
    _async_load(raw.slice(j * ROWS, ROWS), p_row[:, None] + o_b[None, :], mask=ok[:, None])
    # (the same rows per thread in both layouts: a renaming)
    p_pe = gl.convert_layout((p_row + RAW + 16).to(gl.pointer_type(gl.bfloat16)), gl.SliceLayout(1, ROPEL),
                             assert_trivial=True)
    ok_p = gl.convert_layout(ok, gl.SliceLayout(1, ROPEL), assert_trivial=True)
    _async_load(kp.slice(j * ROWS, ROWS), p_pe[:, None] + o_p[None, :], mask=ok_p[:, None])


# Rows a producer warp's copy instruction covers, 32 // COPY_ROWS threads x 16 bytes of each
# (2 or 4). Over vLLM's 656-byte rows, which start 16 x (id mod 8) bytes into a 128-byte line,
# an instruction touches about 2 lines per row at 4 (8 in all) and 3 per row at 2 (6). 2 against
# 4 in one run (H100, 2026-12-07, runs 341-342): 1.043-1.051x at 8 heads, 1.077x at 16
# (prefill T=4096 over 32K rows), though its loop is 227 instructions per warp against 168.
COPY_ROWS = gl.constexpr(2)


@gluon.jit
def regs_producer(kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, raw_ring, kp_smem, sc_smem, ready,
                  free, BLOCK_N: gl.constexpr, NS: gl.constexpr, PW: gl.constexpr):
    """The ``PW`` producer warps: per step, once its slot is free, the copies of the tile's
    rows in passes of ``COPY_ROWS * PW`` rows (raw bytes and rope; invalid ids zero-filled)
    and of its scales, then an arrival on the slot's ``ready`` barrier that lands when this
    thread's copies have. Each thread copies one row of a pass (``16 * COPY_ROWS`` of its
    bytes, ``2 * COPY_ROWS`` of its rope values); the next step's ids are loaded a step
    ahead, into registers."""
    gl.static_assert((COPY_ROWS == 2) | (COPY_ROWS == 4), "a copy instruction covers 2 or 4 rows")
    ROWS: gl.constexpr = COPY_ROWS * PW
    PASSES: gl.constexpr = BLOCK_N // ROWS
    LANES: gl.constexpr = 32 // COPY_ROWS  # a row's lanes
    RAWL: gl.constexpr = gl.BlockedLayout([1, 16], [COPY_ROWS, LANES], [PW, 1], [1, 0])
    ROPEL: gl.constexpr = gl.BlockedLayout([1, 64 // LANES], [COPY_ROWS, LANES], [PW, 1], [1, 0])  # the same rows
    # the scales: [4 tiles, BLOCK_N rows], a tile per warp (PW = 4)
    SCL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [PW, 1], [1, 0])
    SC_IDL: gl.constexpr = gl.SliceLayout(0, SCL)
    o_b = gl.arange(0, RAW, layout=gl.SliceLayout(0, RAWL))
    o_p = gl.arange(0, 64, layout=gl.SliceLayout(0, ROPEL))
    o_t = gl.arange(0, 4, layout=gl.SliceLayout(1, SCL))
    sc_steps = _reinterpret(sc_smem, gl.float32, [NS, 4, BLOCK_N], FLAT)
    ids = _pass_ids(p_idx, n_start, n_end, ROWS, PASSES, RAWL)
    i_s = _row_ids(p_idx, n_start, n_end, SC_IDL, BLOCK_N)
    for i in range(n_steps):
        slot = i % NS
        n1 = n_start + (i + 1) * BLOCK_N
        # the next step's ids, a step of copies before their use
        ids_next = _pass_ids(p_idx, n1, n_end, ROWS, PASSES, RAWL)
        j_s = _row_ids(p_idx, n1, n_end, SC_IDL, BLOCK_N)
        mbarrier.wait(free.index(slot), ((i // NS) & 1) ^ 1)
        raw = _reinterpret(raw_ring.index(slot), gl.uint8, [BLOCK_N, RAW], _COPY_VIEW)
        kp = kp_smem.index(slot)
        for j in gl.static_range(PASSES):
            _copy_pass(raw, kp, kv_ptr, ids, n_rows, stride_kv, j, o_b, o_p, ROWS, ROPEL)
        # the step's scales, [4 tiles, BLOCK_N rows] of 4 bytes each, in one copy (its ids loaded
        # again in the copy's layout: two loads a thread, L1 hits, where a layout conversion of
        # the pass ids would cross threads); the mask is ok_s broadcast to the copy's shape
        p_sc = (kv_ptr + i_s.to(gl.int64) * stride_kv + RAW).to(gl.pointer_type(gl.float32))
        ok_s = (i_s >= 0) & (i_s < n_rows)
        _async_load(sc_steps.index(slot), p_sc[None, :] + o_t[:, None], mask=ok_s[None, :] & (o_t >= 0)[:, None])
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
        ids, i_s = ids_next, j_s


@gluon.constexpr_function
def _out_layout(BLOCK_H):
    """An accumulator tile indexed by output column (:func:`_by_column`): the accumulators'
    own registers, lanes and warps, each thread's 4 columns consecutive (registers first), so
    that a warp stores 4 heads x 128 bytes of fp32 in one 16-byte store a thread."""
    heads = [[0, 1]] + ([[0, 8]] if BLOCK_H == 16 else [])
    return gl.DistributedLinearLayout(
        reg_bases=[[1, 0], [2, 0]] + heads, lane_bases=[[0, 2], [0, 4], [4, 0], [8, 0], [16, 0]],
        warp_bases=[[32, 0], [64, 0]], block_bases=[], shape=[128, BLOCK_H])


@gluon.jit
def _by_column(x, BLOCK_H: gl.constexpr):
    """An accumulator tile ``x`` [128 (m), BLOCK_H] re-indexed by output column ``v_col(m)``,
    in :func:`_out_layout`: the same values in the same threads, no data moved."""
    # (m's bits from the top, 6 to 0; the column's, 6 to 0, are m's bits 5, 4, 2, 1, 0, 6, 3)
    x = x.reshape([2, 2, 2, 2, 2, 2, 2, BLOCK_H]).permute((1, 2, 4, 5, 6, 0, 3, 7)).reshape([128, BLOCK_H])
    return gl.convert_layout(x, _out_layout(BLOCK_H), assert_trivial=True)


@gluon.jit
def regs_epilogue(acc0, acc1, acc2, acc3, b_m, b_l, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                  stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK: gl.constexpr,
                  PARTIAL: gl.constexpr, BLOCK_H: gl.constexpr):
    """gluon_narrow.narrow_epilogue for accumulators in the PV view's column order and times
    P_SCALE, from the final max and denominator ``b_m``, ``b_l`` [BLOCK_H]: each tile put in
    column order in registers (:func:`_by_column`) and stored 4 columns a thread. (Stored in
    the accumulators' order, each thread's values lay 4 columns apart: 4x the ideal L2 sectors;
    in a split decode call, T=32 with 16 heads, the epilogue waiting on its fp32 stores took
    26% of the consumer's stall samples, at T=128 unsplit 1%: H100, run 395. Stored this way:
    decode T=32 26.2 against 29.6 us at 16 heads, 23.4 against 24.7 at 8; T=128 1.013x and
    1.008x; prefill T=4096 H=16 over 32K rows 1.019x: run 396.)"""
    O_L: gl.constexpr = _out_layout(BLOCK_H)
    b_inv_l = _lse_and_scale(b_m, b_l, sink_ptr, lse_ptr, i_t, i_s, h0, n_heads,
                             stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL, True, BLOCK_H)
    inv_l = (b_inv_l * P_UNSCALE)[None, :]
    o_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, O_L))
    o_c = gl.arange(0, 128, layout=gl.SliceLayout(1, O_L))
    p_o = out_ptr + i_t * stride_o_t + i_s * stride_o_s + o_h[None, :] * stride_o_h + o_c[:, None]
    m_o = (o_h < n_heads)[None, :]
    dt: gl.constexpr = out_ptr.dtype.element_ty
    gl.store(p_o, _by_column((acc0 * inv_l).to(dt), BLOCK_H), mask=m_o)
    gl.store(p_o + 128, _by_column((acc1 * inv_l).to(dt), BLOCK_H), mask=m_o)
    gl.store(p_o + 256, _by_column((acc2 * inv_l).to(dt), BLOCK_H), mask=m_o)
    gl.store(p_o + 384, _by_column((acc3 * inv_l).to(dt), BLOCK_H), mask=m_o)


# Two programs per SM, each in 256 threads: launched with at most LAUNCH_MAXNREG registers a
# thread (2 x 256 x 128 = 64K), the consumer warpgroup takes CONSUMER_REGS of its program's
# 2 x 128 and the producer (the default partition, PW = 4 warps) the rest, 56.
LAUNCH_MAXNREG = 65536 // (2 * 256)
CONSUMER_REGS = gl.constexpr(200)
# Ring slots, 41 KB each: two programs of 108 KB at 16 heads (q 18 KB, P^T 8 KB) fit an SM's
# 228 KB.
NS = gl.constexpr(2)


@gluon.jit(do_not_specialize=_NOT_SPECIALIZED)
def sparse_mla_gluon_fp8_regs_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
    qk_scale, n_rows, n_heads, topk, split_size,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_kv, stride_idx_t,
    stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
    HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
    NS: gl.constexpr, PW: gl.constexpr,
):
    """One program per (token, head tile, split), as kernels/attention.py's, over fp8_ds_mla
    rows (this module's docstring); ``qk_scale`` divided by Q_F16_SCALE (the launcher)."""
    i_t, h0 = _tile_origin(n_heads, BLOCK_H)
    q_s0 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], _TILES)
    q_s1 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], _TILES)
    q_s2 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], _TILES)
    q_s3 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], _TILES)
    q_sp = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_PE], SMEM)
    raw_ring = gl.allocate_shared_memory(gl.uint8, [NS, BLOCK_N, RAW], FLAT)
    kp_smem = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, D_PE], SMEM)
    sc_smem = gl.allocate_shared_memory(gl.float32, [4 * NS, BLOCK_N], FLAT1)
    p_s = gl.allocate_shared_memory(
        gl.float16, [4, BLOCK_N, BLOCK_H],
        gl.NVMMASharedLayout(swizzle_byte_width=2 * BLOCK_H if BLOCK_H >= 16 else 0, element_bitwidth=16, rank=2))
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS):
        mbarrier.init(ready.index(j), count=32 * PW)  # one copy-completion per producer thread
        mbarrier.init(free.index(j), count=1)  # one arrival, once the consumers are all there
    fence_async_shared()
    _barrier()

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    gl.warp_specialize(
        [(regs_producer, (kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, raw_ring, kp_smem, sc_smem,
                          ready, free, BLOCK_N, NS, PW)),
         (regs_consumer, (q_s0, q_s1, q_s2, q_s3, q_sp, raw_ring, kp_smem, sc_smem, p_s, ready, free, p_idx, n_start,
                          n_end, n_steps, n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                          stride_qn_h, stride_qp_t, stride_qp_h, sink_ptr, out_ptr, lse_ptr, i_s, stride_o_t,
                          stride_o_h, stride_o_s, stride_lse_t, stride_lse_h, HAS_SINK, PARTIAL, BLOCK_H, BLOCK_N,
                          NS))],
        [4], [CONSUMER_REGS])
