"""A producer for sm90's few-head fp8_ds_mla tile that loads its rows into registers a tile
ahead (``TileConfig.raw_in_regs``), instead of copying them into the ring slot and
converting them there (kernels/gluon_fp8_producer.py's ``_fp8_producer``).

With two ring slots the copying producer can start a tile's copies only once the consumers
free its slot, one step before they need it, so the copies' latency sits inside every step:
a step took (consumers + producer) / 2 on the H200, which is why moving work between the
two changed nothing (BENCHMARKS.md "aligned copies and late scales"). Loads into registers
need no slot: this producer issues the next tile's loads as soon as it has converted this
one, waits for the slot only to store the converted values, and never writes or reads the
raw bytes in shared memory (per 64-row step 42 KB of copies and 32 KB of raw reads less).

Each step is two passes of 32 rows. A pass is held as 32-bit words (a thread's 16 bytes of
a row as one vector load; held as 8-bit values, each byte would take a register): the four
latent tiles' e4m3 bytes, 4 threads per row with 16 bytes of each 64-byte half; the row's 4
scales; the rope's bf16 pairs, 8 threads per row. Each word of e4m3 bytes becomes two words
of fp16 pairs (``cvt.rn.f16x2.e4m3x2``, then one packed multiply by the scale, as the
copying producer's fp16 path rounds), stored as 32-bit words through views of the slot's
128-byte-swizzled tiles, so that each quarter-warp's 16-byte stores (rows r and r + 1, of
opposite swizzle parity) fall in distinct banks. Registers: a tile's two passes, 88 per
thread, at the producer's 128.

Only with fp16 operands (``fp8_f16``) and 4 producer warps. Import only where Gluon is
available and not under the interpreter (as gluon_sm90).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from .gluon_sm90 import _row_ids

# One pass, 4 warps: [32 rows, 32 words] of one latent tile's raw bytes, 4 threads per row,
# each with a 16-byte vector of each half; their fp16 values [32, 64] words, 8 per thread and
# half; the rows' scales [32, 4] fp32, replicated over a row's threads; the rope [32, 32]
# words, 8 threads per row (a quarter-warp stores one row's 128 bytes).
RAW_WORDS = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0]))
F16_WORDS = gl.constexpr(gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0]))
SCALES4 = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0]))
ROPE_WORDS = gl.constexpr(gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))
# The ring's 128-byte-swizzled 16-bit tiles as 32-bit words, each basis the (row, word) of
# one offset bit: a latent tile [64, 128] values as [64, 64] words, two 8 KB halves (values
# 0-63, then 64-127 of every row: offset bit 11), a row's half 128 bytes (bits 5-10 the
# row) whose 16-byte chunks (bits 2-4) are XOR-swizzled by the row's low 3 bits; the rope
# tile [64, 64] values as [64, 32] words, one such half.
LAT_WORDS = gl.constexpr(gl.SharedLinearLayout(offset_bases=[
    [0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [1, 4], [2, 8], [4, 16], [8, 0], [16, 0], [32, 0],
    [0, 32]]))
PE_WORDS = gl.constexpr(gl.SharedLinearLayout(offset_bases=[
    [0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [1, 4], [2, 8], [4, 16], [8, 0], [16, 0], [32, 0]]))
# formats.FP8_ROW_BYTES's parts: 512 e4m3 bytes, 4 fp32 scales, 64 bf16 rope values
SCALE_BYTE = gl.constexpr(512)
ROPE_BYTE = gl.constexpr(528)


@gluon.jit
def _load_pass(kv_ptr, p_idx, n0, n_end, n_rows, stride_kv, ROWS: gl.constexpr):
    """Rows ``n0 : n0 + ROWS`` of this program's index list, into registers: the four latent
    tiles' bytes as [ROWS, 32] int32 words, the scales [ROWS, 4] fp32 and the rope [ROWS, 32]
    int32 words; zeros for an id past ``n_end`` or outside the cache."""
    ids = _row_ids(p_idx, n0, n_end, gl.SliceLayout(1, RAW_WORDS), ROWS)
    m_r = ((ids >= 0) & (ids < n_rows))[:, None]
    p_w = (kv_ptr + ids.to(gl.int64) * stride_kv).to(gl.pointer_type(gl.int32))
    ptrs = p_w[:, None] + gl.arange(0, 32, layout=gl.SliceLayout(0, RAW_WORDS))[None, :]
    b_w0 = gl.load(ptrs, mask=m_r, other=0)
    b_w1 = gl.load(ptrs + 32, mask=m_r, other=0)
    b_w2 = gl.load(ptrs + 64, mask=m_r, other=0)
    b_w3 = gl.load(ptrs + 96, mask=m_r, other=0)
    ids_s = gl.convert_layout(ids, gl.SliceLayout(1, SCALES4), assert_trivial=True)
    p_sc = (kv_ptr + ids_s.to(gl.int64) * stride_kv + SCALE_BYTE).to(gl.pointer_type(gl.float32))
    o_s = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES4))
    b_sc4 = gl.load(p_sc[:, None] + o_s[None, :],
                    mask=((ids_s >= 0) & (ids_s < n_rows))[:, None], other=0.0)
    ids_p = _row_ids(p_idx, n0, n_end, gl.SliceLayout(1, ROPE_WORDS), ROWS)
    p_pe = (kv_ptr + ids_p.to(gl.int64) * stride_kv + ROPE_BYTE).to(gl.pointer_type(gl.int32))
    o_p = gl.arange(0, 32, layout=gl.SliceLayout(0, ROPE_WORDS))
    b_pe = gl.load(p_pe[:, None] + o_p[None, :], mask=((ids_p >= 0) & (ids_p < n_rows))[:, None],
                   other=0)
    return b_w0, b_w1, b_w2, b_w3, b_sc4, b_pe


@gluon.jit
def _store_latent(k_s, slot, row0: gl.constexpr, b_w, b_sc4, c: gl.constexpr):
    """Latent tile ``k_s``'s rows ``row0 : row0 + ROWS`` of ring slot ``slot``: the e4m3 bytes
    ``b_w`` [ROWS, 32] int32 times column ``c`` of the rows' scales ``b_sc4``, in fp16."""
    ROWS: gl.constexpr = b_w.shape[0]
    BLOCK_N: gl.constexpr = k_s.shape[1]
    o_c = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES4))
    b_sc = gl.sum(gl.where(o_c[None, :] == c, b_sc4, 0.0), axis=1).to(gl.float16)  # (in-thread)
    # the scale twice in a word, once per row
    b_s2 = gl.inline_asm_elementwise("mov.b32 $0, {$1, $1};", "=r,h", [b_sc], dtype=gl.int32,
                                     is_pure=True, pack=1)
    b_s2 = gl.convert_layout(b_s2, gl.SliceLayout(1, RAW_WORDS), assert_trivial=True)
    b_lo, b_hi = gl.inline_asm_elementwise(
        "{ .reg .b16 l, h; .reg .b32 a, b; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 a, l; "
        "cvt.rn.f16x2.e4m3x2 b, h; mul.rn.f16x2 $0, a, $3; mul.rn.f16x2 $1, b, $3; }",
        "=r,=r,r,r", [b_w, gl.broadcast(b_s2[:, None], b_w)[0]], dtype=(gl.int32, gl.int32),
        is_pure=True, pack=1)
    # word 2w + k: values 4w + 2k and 4w + 2k + 1
    b_v = gl.convert_layout(gl.reshape(gl.join(b_lo, b_hi), [ROWS, 64]), F16_WORDS,
                            assert_trivial=True)
    k_s.index(slot)._reinterpret(gl.int32, [BLOCK_N, 64], LAT_WORDS).slice(row0, ROWS).store(b_v)


@gluon.jit
def _store_pass(k_s0, k_s1, k_s2, k_s3, kp_smem, slot, row0: gl.constexpr, b_w0, b_w1, b_w2, b_w3,
                b_sc4, b_pe):
    """One pass's rows, converted, into ring slot ``slot`` from row ``row0``."""
    ROWS: gl.constexpr = b_w0.shape[0]
    BLOCK_N: gl.constexpr = k_s0.shape[1]
    _store_latent(k_s0, slot, row0, b_w0, b_sc4, 0)
    _store_latent(k_s1, slot, row0, b_w1, b_sc4, 1)
    _store_latent(k_s2, slot, row0, b_w2, b_sc4, 2)
    _store_latent(k_s3, slot, row0, b_w3, b_sc4, 3)
    kp_smem.index(slot)._reinterpret(gl.int32, [BLOCK_N, 32], PE_WORDS).slice(row0, ROWS).store(b_pe)


@gluon.jit
def fp8_regs_producer(kv_ptr, p_idx, n_start, n_end, n_steps, n_rows, stride_kv, k_s0, k_s1, k_s2,
                      k_s3, kp_smem, ready, free, BLOCK_N: gl.constexpr, NS: gl.constexpr):
    """The 4 producer warps: the first tile's two passes loaded before the loop; each step
    waits for its slot to be free, stores each pass converted and loads the same pass of the
    next tile in its registers, then hands the slot over (Gluon's ``mbarrier.arrive``: a
    barrier of the partition's threads, then one arrival). Past the last step the loads are
    masked off."""
    ROWS: gl.constexpr = BLOCK_N // 2
    a0, a1, a2, a3, a_sc, a_pe = _load_pass(kv_ptr, p_idx, n_start, n_end, n_rows, stride_kv, ROWS)
    b0, b1, b2, b3, b_sc, b_pe = _load_pass(kv_ptr, p_idx, n_start + ROWS, n_end, n_rows, stride_kv,
                                            ROWS)
    for i in range(n_steps):
        slot = i % NS
        # the slot's previous tile (step i - NS) has been read; the first NS steps pass at once
        mbarrier.wait(free.index(slot), ((i // NS) & 1) ^ 1)
        n_next = n_start + (i + 1) * BLOCK_N
        _store_pass(k_s0, k_s1, k_s2, k_s3, kp_smem, slot, 0, a0, a1, a2, a3, a_sc, a_pe)
        a0, a1, a2, a3, a_sc, a_pe = _load_pass(kv_ptr, p_idx, n_next, n_end, n_rows, stride_kv, ROWS)
        _store_pass(k_s0, k_s1, k_s2, k_s3, kp_smem, slot, ROWS, b0, b1, b2, b3, b_sc, b_pe)
        b0, b1, b2, b3, b_sc, b_pe = _load_pass(kv_ptr, p_idx, n_next + ROWS, n_end, n_rows,
                                                stride_kv, ROWS)
        fence_async_shared()  # this thread's stores (generic proxy) before the wgmma's reads
        mbarrier.arrive(ready.index(slot), count=1)
