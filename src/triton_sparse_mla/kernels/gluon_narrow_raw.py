"""sm90's few-head Gluon tile over fp8_ds_mla rows with its score dots on the raw e4m3 bytes
(``TileConfig.raw_scores``; 8 or 16 heads).

In kernels/gluon_fp8_producer.py's few-head kernel the raw bytes land inside the 16-bit operand
slot they become, so both dots wait for the conversion and read its 16-bit values: per 64-row
step at 16 heads about 310 KB of shared-memory traffic, the score dots' A operands 72 KB of
it. Here the raw bytes land in a ring of their own, in the e4m3 wgmma layout (128-byte
swizzle), and the score dots read them as they land (fp8 ``wgmma``, K = 32), while the
producer converts the same bytes into the 16-bit V ring that only the PV dots read:

* q in two e4m3 parts per head, ``hi = e4m3(q s)`` and ``lo = e4m3(16 (q s - hi))`` with
  ``s = 448 / max |q|`` of the head (kept at 1.2e-3 of the float64 reference where one part
  alone reaches 5.2e-2, BENCHMARKS.md "Score dots on raw e4m3 rows"), the hi parts of all heads
  then the lo parts along the dots' N (2 x BLOCK_H): the row tile is read once for both;
* one accumulator per 128-column group (four fp8 dots of K = 32 each: the tensor cores'
  narrower accumulation of fp8 products never runs past a group), then in registers
  ``S^T = sum_g scale[:, g] (hi_g + lo_g / 16) / s + rope``: the row scales multiply the rows
  (along M), the split of each accumulator into its hi and lo halves stays in-thread;
* the rope dot on the rows' bf16 rope as in the other kernel.

The consumers wait for a tile's copies (the producer's per-pass ``landed`` barriers) for the
score dots and for its conversion (``ready``) only before the PV dots. Per step at 16 heads the
score dots read 40 KB of rows instead of 72 and 18 KB of q instead of 18 (N doubles, K halves
in bytes): about 280 KB of shared-memory traffic per step instead of 310. The scales are not
staged: the producer loads each pass's scales into registers when it issues the copies, the
consumers load their rows' scales from global memory (L1 hits: the producer read them), so
the slot holds only rows: per slot the raw bytes 32 KB, V 64 KB and the rope 8 KB. P^T goes
into the rope tile of its slot, which the score dots have finished reading. Shared memory at
16 heads: two slots 208 KB, q 16 KB (e4m3) + 2 KB (rope): 226 KB (231,520 bytes of 232,448);
at 8 heads 217 KB.

Import only where Gluon is available and not under the interpreter (as gluon_sm90).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from . import gluon_narrow
from .gluon_fp8_producer import PRODUCER_REGS_NARROW, _copy_latent, _copy_rope
from .gluon_sm90 import (FLAT, GATHER_W4, ROPE_W4, SMEM, _NOT_SPECIALIZED, _barrier, _latent_ring, _pass_ids, _q_values,
                         _row_ids, _split_range, _tile_origin)

# e4m3 tiles as the fp8 wgmma reads them: 128 bytes per row, 128-byte swizzle
E8 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
E4M3_MAX = gl.constexpr(448.0)
# q's second part carries 16 x the first part's rounding error
LO_GAIN = gl.constexpr(16.0)


@gluon.constexpr_function
def _cvt_raw(PW):
    """The conversion's layout over [4 * PW, 128] raw bytes of one pass: 16 threads per row,
    8 bytes each. Half a warp loads one 128-byte row (its 16-byte chunks in any swizzled
    order): no bank conflict; a quarter warp stores one 128-byte row of a 16-bit tile's half
    (64 values): no conflict either."""
    return gl.BlockedLayout([1, 8], [2, 16], [PW, 1], [1, 0])


@gluon.jit
def _copy_scales(sc, kv_ptr, ids, n_rows, stride_kv, LAT: gl.constexpr, SC4: gl.constexpr):
    """The asynchronous copies of rows ``ids``' four fp32 scales into ``sc`` ([ROWS, 4]), 16
    bytes per row; invalid ids zero-filled."""
    ids_s = gl.convert_layout(ids, gl.SliceLayout(1, SC4), assert_trivial=True)
    p_sc = (kv_ptr + ids_s.to(gl.int64) * stride_kv + 4 * LAT).to(gl.pointer_type(gl.float32))
    o_s = gl.arange(0, 4, layout=gl.SliceLayout(0, SC4))
    async_copy.async_copy_global_to_shared(sc, p_sc[:, None] + o_s[None, :],
                                           mask=((ids_s >= 0) & (ids_s < n_rows))[:, None])


@gluon.jit
def _scale_column(b_sc4, c: gl.constexpr, LAYOUT: gl.constexpr):
    """Column ``c`` of the rows' scales ``b_sc4`` [ROWS, 4] (in-thread), in LAYOUT's row slice."""
    o_c = gl.arange(0, 4, layout=gl.SliceLayout(0, b_sc4.type.layout))
    col = gl.sum(gl.where(o_c[None, :] == c, b_sc4, 0.0), axis=1)
    return gl.convert_layout(col, gl.SliceLayout(1, LAYOUT), assert_trivial=True)


@gluon.jit
def _convert_group(raw, k, b_sc, CVT: gl.constexpr, F16: gl.constexpr):
    """One pass's rows of one 128-column group: e4m3 bytes ``raw`` ([ROWS, LAT] uint8, E8)
    times the rows' scales ``b_sc`` into ``k`` ([ROWS, LAT], 16-bit): fp16 with F16 (the
    scale rounded to fp16, one packed multiply per two values), else fp32 rounded to bf16."""
    b_raw = raw.load(CVT).to(gl.float8e4nv, bitcast=True)
    if F16:
        k.store(b_raw.to(gl.float16) * b_sc.to(gl.float16)[:, None])
    else:
        k.store((b_raw.to(gl.float32) * b_sc[:, None]).to(gl.bfloat16))


@gluon.jit
def _raw_producer(kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, r_s0, r_s1, r_s2, r_s3, k_s0,
                  k_s1, k_s2, k_s3, kp_smem, sc_smem, landed, ready, free, BLOCK_N: gl.constexpr, NS: gl.constexpr,
                  PW: gl.constexpr, F16: gl.constexpr):
    """The ``PW`` producer warps: for each step, once the consumers freed its slot, the tile's
    copies in passes of ``4 * PW`` rows (raw bytes into ``r_s*``, rope into ``kp_smem``; each
    pass with its own ``landed`` barrier, on which the consumers' score dots wait too) and the
    rows' scales into registers; then pass by pass, as each lands, the raw bytes times the
    scales into the 16-bit V ring ``k_s*``; then, fenced for the PV dots, ``ready``."""
    LAT: gl.constexpr = k_s0.shape[2]
    RAWP: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [PW, 1], [1, 0])
    ROPEP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
    CVT: gl.constexpr = _cvt_raw(PW)
    ROWS: gl.constexpr = 4 * PW
    PASSES: gl.constexpr = BLOCK_N // ROWS
    SC4: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [PW, 1], [1, 0])
    # the scales in the conversion's rows (4 per row, replicated along the row's threads)
    SC_CVT: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [PW, 1], [1, 0])
    ids = _pass_ids(p_idx, n_start, n_end, ROWS, PASSES, RAWP)
    o_j = gl.arange(0, PASSES, layout=gl.SliceLayout(0, RAWP))
    for i in range(n_steps):
        slot = i % NS
        phase = (i // NS) & 1
        mbarrier.wait(free.index(slot), phase ^ 1)
        for j in gl.static_range(PASSES):
            b_idx = gl.sum(gl.where(o_j[None, :] == j, ids, 0), axis=1)  # (in-thread)
            _copy_latent(r_s0.index(slot).slice(j * ROWS, ROWS), r_s1.index(slot).slice(j * ROWS, ROWS),
                         r_s2.index(slot).slice(j * ROWS, ROWS), r_s3.index(slot).slice(j * ROWS, ROWS),
                         kv_ptr, b_idx, n_rows, stride_kv, RAWP)
            _copy_rope(kp_smem.index(slot).slice(j * ROWS, ROWS), kv_ptr, b_idx, n_rows, stride_kv, LAT, ROPEP)
            _copy_scales(sc_smem.index(slot).slice(j * ROWS, ROWS), kv_ptr, b_idx, n_rows, stride_kv, LAT, SC4)
            async_copy.mbarrier_arrive(landed.index(slot * PASSES + j), increment_count=False)
        ids = _pass_ids(p_idx, n_start + (i + 1) * BLOCK_N, n_end, ROWS, PASSES, RAWP)
        for j in gl.static_range(PASSES):
            mbarrier.wait(landed.index(slot * PASSES + j), phase)
            b_sc4 = sc_smem.index(slot).slice(j * ROWS, ROWS).load(SC_CVT)  # [ROWS, 4]
            _convert_group(r_s0.index(slot).slice(j * ROWS, ROWS), k_s0.index(slot).slice(j * ROWS, ROWS),
                           _scale_column(b_sc4, 0, CVT), CVT, F16)
            _convert_group(r_s1.index(slot).slice(j * ROWS, ROWS), k_s1.index(slot).slice(j * ROWS, ROWS),
                           _scale_column(b_sc4, 1, CVT), CVT, F16)
            _convert_group(r_s2.index(slot).slice(j * ROWS, ROWS), k_s2.index(slot).slice(j * ROWS, ROWS),
                           _scale_column(b_sc4, 2, CVT), CVT, F16)
            _convert_group(r_s3.index(slot).slice(j * ROWS, ROWS), k_s3.index(slot).slice(j * ROWS, ROWS),
                           _scale_column(b_sc4, 3, CVT), CVT, F16)
        # this thread's stores (generic proxy) before the PV dots' reads
        fence_async_shared()
        mbarrier.arrive(ready.index(slot), count=1)


@gluon.jit
def _q_parts(b_q, b_s, q_s, BLOCK_H: gl.constexpr):
    """One 128-column group of q ``b_q`` [BLOCK_H, LAT] times its heads' ``b_s`` [BLOCK_H]
    into ``q_s`` ([2 * BLOCK_H, LAT] e4m3): rows 0..BLOCK_H-1 the first parts, the rest the
    second parts (LO_GAIN x the first part's rounding error)."""
    x = b_q.to(gl.float32) * b_s[:, None]
    hi = x.to(gl.float8e4nv)
    q_s.slice(0, BLOCK_H).store(hi)
    q_s.slice(BLOCK_H, BLOCK_H).store(((x - hi.to(gl.float32)) * LO_GAIN).to(gl.float8e4nv))


@gluon.jit
def _group_scores(a, b_sc, T_L: gl.constexpr):
    """A group's accumulator ``a`` [BLOCK_N, 2 * BLOCK_H] (hi parts' scores, then lo parts')
    as ``b_sc (hi + lo / LO_GAIN)`` [BLOCK_N, BLOCK_H] in T_L: the halves of N are in-thread."""
    BLOCK_N: gl.constexpr = a.shape[0]
    BLOCK_H: gl.constexpr = a.shape[1] // 2
    hi, lo = gl.split(gl.permute(gl.reshape(a, [BLOCK_N, 2, BLOCK_H]), [0, 2, 1]))
    return gl.convert_layout(hi + lo * (1.0 / LO_GAIN), T_L, assert_trivial=True) * b_sc[:, None]


@gluon.jit
def _raw_consumer(q8_s0, q8_s1, q8_s2, q8_s3, q_sp, r_s0, r_s1, r_s2, r_s3, k_s0, k_s1, k_s2, k_s3, kp_smem,
                  sc_smem, landed, ready, free, kv_ptr, stride_kv, p_idx, n_start, n_end, n_steps, n_rows, qk_scale,
                  q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
                  BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, NS: gl.constexpr,
                  PASSES: gl.constexpr, p_smem):
    """The consumer warpgroup: q into its two e4m3 parts per head (``q8_s*``) and its bf16 rope
    (``q_sp``); then per step, once the tile's copies landed, the score dots on the raw rows,
    the softmax (gluon_narrow.narrow_softmax, P^T into the slot's rope tile), and once the
    tile is converted (``ready``), the PV dots (gluon_narrow.narrow_pv); then the slot freed.
    Returns what gluon_narrow.narrow_consumer returns."""
    b_q0, b_q1, b_q2, b_q3, b_qp = _q_values(q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t,
                                             stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_H, LAT,
                                             q_sp.shape[1], False, GATHER_W4, ROPE_W4)
    b_amax = gl.maximum(gl.maximum(gl.max(gl.abs(b_q0.to(gl.float32)), axis=1),
                                   gl.max(gl.abs(b_q1.to(gl.float32)), axis=1)),
                        gl.maximum(gl.max(gl.abs(b_q2.to(gl.float32)), axis=1),
                                   gl.max(gl.abs(b_q3.to(gl.float32)), axis=1)))
    b_amax = gl.where(b_amax > 0, b_amax, E4M3_MAX)  # (a zero head: scale 1)
    b_s = E4M3_MAX / b_amax
    _q_parts(b_q0, b_s, q8_s0, BLOCK_H)
    _q_parts(b_q1, b_s, q8_s1, BLOCK_H)
    _q_parts(b_q2, b_s, q8_s2, BLOCK_H)
    _q_parts(b_q3, b_s, q8_s3, BLOCK_H)
    q_sp.store(b_qp)
    fence_async_shared()  # q's stores (generic proxy) before the wgmma's reads
    _barrier()  # every consumer thread's part
    # the scores' and accumulators' layout (heads along N), and the group accumulators' (N = 2 x
    # BLOCK_H, fp8 operands: K = 32 per instruction)
    T_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    A_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 2 * BLOCK_H, 32])
    # the heads' q scales undone on the scores
    b_inv_s = gl.convert_layout(b_amax / E4M3_MAX, gl.SliceLayout(0, T_L))[None, :]
    b_m = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(0, T_L))
    b_l2 = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    acc0 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    acc1 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    acc2 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    acc3 = gl.zeros([LAT, BLOCK_H], gl.float32, layout=T_L)
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=T_L)
    a_zero = gl.zeros([BLOCK_N, 2 * BLOCK_H], gl.float32, layout=A_L)
    ROWS_L: gl.constexpr = gl.SliceLayout(1, T_L)
    SC_T: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0])  # (one row per thread)
    for i in range(n_steps):
        slot = i % NS
        phase = (i // NS) & 1
        # the rows' ids and scales (global memory; the producer loaded both: L1 hits) before
        # the wait, off the scores' path
        b_idx = _row_ids(p_idx, n_start + i * BLOCK_N, n_end, ROWS_L, BLOCK_N)
        for j in gl.static_range(PASSES):
            mbarrier.wait(landed.index(slot * PASSES + j), phase)
        fence_async_shared()  # the copies' writes (generic proxy) before the wgmma's reads
        a0 = warpgroup_mma(r_s0.index(slot)._reinterpret(gl.float8e4nv, [BLOCK_N, LAT], E8),
                           q8_s0.permute((1, 0)), a_zero, use_acc=False, is_async=True)
        a1 = warpgroup_mma(r_s1.index(slot)._reinterpret(gl.float8e4nv, [BLOCK_N, LAT], E8),
                           q8_s1.permute((1, 0)), a_zero, use_acc=False, is_async=True)
        a2 = warpgroup_mma(r_s2.index(slot)._reinterpret(gl.float8e4nv, [BLOCK_N, LAT], E8),
                           q8_s2.permute((1, 0)), a_zero, use_acc=False, is_async=True)
        a3 = warpgroup_mma(r_s3.index(slot)._reinterpret(gl.float8e4nv, [BLOCK_N, LAT], E8),
                           q8_s3.permute((1, 0)), a_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(kp_smem.index(slot), q_sp.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        b_sc4 = sc_smem.index(slot).load(SC_T)  # [BLOCK_N, 4], the rows' scales (while the dots run)
        a0, a1, a2, a3, s = warpgroup_mma_wait(0, deps=[a0, a1, a2, a3, s])
        b_sc0 = gl.convert_layout(_scale_column(b_sc4, 0, SC_T), ROWS_L)
        b_sc1 = gl.convert_layout(_scale_column(b_sc4, 1, SC_T), ROWS_L)
        b_sc2 = gl.convert_layout(_scale_column(b_sc4, 2, SC_T), ROWS_L)
        b_sc3 = gl.convert_layout(_scale_column(b_sc4, 3, SC_T), ROWS_L)
        s_lat = (_group_scores(a0, b_sc0, T_L) + _group_scores(a1, b_sc1, T_L) +
                 _group_scores(a2, b_sc2, T_L) + _group_scores(a3, b_sc3, T_L))
        s = s_lat * b_inv_s + s
        b_m, b_l2, acc0, acc1, acc2, acc3 = gluon_narrow.narrow_softmax(s, b_idx, n_rows, qk_scale, b_m, b_l2,
                                                                        acc0, acc1, acc2, acc3, p_smem)
        fence_async_shared()  # this thread's part of P^T, for the wgmma
        _barrier()  # every consumer thread's part
        mbarrier.wait(ready.index(slot), phase)
        fence_async_shared()  # the producer's stores (generic proxy) before the wgmma's reads
        acc0, acc1, acc2, acc3 = gluon_narrow.narrow_pv(k_s0.index(slot), k_s1.index(slot), k_s2.index(slot),
                                                        k_s3.index(slot), p_smem, acc0, acc1, acc2, acc3)
        # every consumer warp's PV dots (which read the slot and P^T) are done: free the slot
        _barrier()
        mbarrier.arrive(free.index(slot), count=1)
    return acc0, acc1, acc2, acc3, b_m, b_l2


@gluon.jit(do_not_specialize=_NOT_SPECIALIZED)
def sparse_mla_gluon_narrow_raw_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
    qk_scale, n_rows, n_heads, topk, split_size,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_kv, stride_idx_t,
    stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
    HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, PARTIAL: gl.constexpr,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LAT: gl.constexpr, D_PE: gl.constexpr,
    NS: gl.constexpr, PW: gl.constexpr, F16: gl.constexpr,
):
    """One program per (token, head tile, split), as gluon_fp8_producer's kernel: ``PW``
    producer warps copy and convert (``_raw_producer``), the consumer warpgroup computes
    (``_raw_consumer``). F16: V and P^T in fp16 (else bf16); q is not scaled (``qk_scale`` is
    the plain one). Arguments as gluon_sm90.kernel_args gives them."""
    i_t, h0 = _tile_origin(n_heads, BLOCK_H)
    v_t: gl.constexpr = gl.float16 if F16 else gl.bfloat16
    q8_s0 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], E8)
    q8_s1 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], E8)
    q8_s2 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], E8)
    q8_s3 = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, LAT], E8)
    q_sp = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_PE], SMEM)
    r_s0 = gl.allocate_shared_memory(gl.uint8, [NS, BLOCK_N, LAT], E8)
    r_s1 = gl.allocate_shared_memory(gl.uint8, [NS, BLOCK_N, LAT], E8)
    r_s2 = gl.allocate_shared_memory(gl.uint8, [NS, BLOCK_N, LAT], E8)
    r_s3 = gl.allocate_shared_memory(gl.uint8, [NS, BLOCK_N, LAT], E8)
    k_s0, k_s1, k_s2, k_s3, kp_smem = _latent_ring(v_t, gl.bfloat16, BLOCK_N, LAT, D_PE, NS)
    PASSES: gl.constexpr = BLOCK_N // (4 * PW)
    p_smem = gluon_narrow.narrow_p_tile(v_t, BLOCK_N, BLOCK_H)
    sc_smem = gl.allocate_shared_memory(gl.float32, [NS, BLOCK_N, 4], FLAT)
    landed = gl.allocate_shared_memory(gl.int64, [NS * PASSES, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS * PASSES):
        mbarrier.init(landed.index(j), count=32 * PW)  # one copy-completion per producer thread
    for j in gl.static_range(NS):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(free.index(j), count=1)
    fence_async_shared()  # the barriers' initialisation, before the partitions
    _barrier()

    i_s = gl.program_id(1)
    n_start, n_end, n_steps = _split_range(len_ptr, i_t, i_s, split_size, topk, HAS_LEN, BLOCK_N)
    p_idx = idx_ptr + i_t * stride_idx_t
    acc0, acc1, acc2, acc3, b_m, b_l2 = gl.warp_specialize(
        [(_raw_consumer, (q8_s0, q8_s1, q8_s2, q8_s3, q_sp, r_s0, r_s1, r_s2, r_s3, k_s0, k_s1, k_s2, k_s3,
                          kp_smem, sc_smem, landed, ready, free, kv_ptr, stride_kv, p_idx, n_start, n_end, n_steps,
                          n_rows, qk_scale, q_nope_ptr, q_pe_ptr, i_t, h0, n_heads, stride_qn_t, stride_qn_h,
                          stride_qp_t, stride_qp_h, BLOCK_H, BLOCK_N, LAT, NS, PASSES, p_smem)),
         (_raw_producer, (kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, r_s0, r_s1, r_s2, r_s3,
                          k_s0, k_s1, k_s2, k_s3, kp_smem, sc_smem, landed, ready, free, BLOCK_N, NS, PW, F16))],
        [PW], [PRODUCER_REGS_NARROW])
    gluon_narrow.narrow_epilogue(acc0, acc1, acc2, acc3, b_m, b_l2, sink_ptr, out_ptr, lse_ptr, i_t, i_s, h0,
                                 n_heads, stride_o_t, stride_o_h, stride_o_s, stride_lse_t, stride_lse_h,
                                 HAS_SINK, PARTIAL, BLOCK_H, LAT)
