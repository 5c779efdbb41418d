"""How fast can one H200 gather random cache rows, by copy mechanism and bytes in flight?

The decode workload's gather alone, with no attention math: T=128 tokens x 2048 uniformly
random row ids over a 1M-row cache (misses L2), rows of 656 bytes (fp8_ds_mla, vLLM's
stride; also at stride 768, every row line-aligned) and of 1152 bytes (bf16). Bytes counted:
T x K x row bytes, as the bench counts the gathered rows. Three mechanisms:

* ``ld``: a plain Triton kernel loading rows into registers (16-byte loads), many programs
  per SM: what the load path reaches with the occupancy the compiler gives it.
* ``cp NS``: one program per token (4 warps, as the few-head tile's producer), 64-row tiles
  copied with ``cp.async`` (16 bytes per thread, 8 threads per 128 bytes of a row) into a
  ring of ``NS`` slots, ``NS`` tiles in flight while the oldest lands.
* ``tma NS``: the same ring filled by the tensor-memory-access unit, one bulk copy per row
  (or two: ``tma2``), issued by one thread, completion counted in bytes on one mbarrier per
  slot; for bf16 rows also nine copies per row into the 128-byte-swizzled operand tiles
  (``tma9``), whose last tile is compared with the rows.

The few-head fp8 tile gathers with ``cp`` into a 2-slot ring whose slots are also its
operand tiles: at most one tile in flight per SM. The shipped attention at T=128 (fp8_ds_mla
16 heads, bf16 16 and 64) is timed in the same run for comparison.

Needs an SM90 GPU and Triton 3.6-3.8, as kernels/gluon_sm90.py (Triton 3.9 renamed some of
the Gluon calls both use). Results: BENCHMARKS.md "The gather alone, by copy mechanism".

``--rows N`` and ``--tokens T`` change the cache's rows and the tokens (e.g. ``--rows 32768
--tokens 4096``: the prefill bench's L2-resident cache, what bounds few-head prefill there).

Usage (on the GPU): python3 benchmarks/gather_ceiling.py OUT.json [--only ld,cp,tma,attention]
[--rows N] [--tokens T]
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from triton_sparse_mla import sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, header, make_inputs, measure_ceilings, time_us

T, K, N_ROWS, BLOCK_N = 128, 2048, 1 << 20, 64
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@triton.jit
def ld_kernel(kv_ptr, idx_ptr, out_ptr, stride_kv, K: tl.constexpr, ROW: tl.constexpr,
              RPAD: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    """Program (token, part): its rows loaded ``BLOCK`` at a time into registers (uint8
    [BLOCK, RPAD], bytes past ``ROW`` masked) and folded into a sum, stored once."""
    i_t = tl.program_id(0)
    i_s = tl.program_id(1)
    o_c = tl.arange(0, RPAD)
    acc = tl.zeros([BLOCK], tl.int32)
    for n in range(i_s * (K // SPLIT), (i_s + 1) * (K // SPLIT), BLOCK):
        ids = tl.load(idx_ptr + i_t * K + n + tl.arange(0, BLOCK))
        p = kv_ptr + tl.multiple_of(ids.to(tl.int64) * stride_kv, 16)[:, None] + o_c[None, :]
        acc += tl.sum(tl.load(p, mask=(o_c < ROW)[None, :], other=0).to(tl.int32), axis=1)
    tl.store(out_ptr + i_t * SPLIT + i_s, tl.sum(acc, axis=0))


@gluon.jit
def cp_kernel(kv_ptr, idx_ptr, out_ptr, stride_kv, K: gl.constexpr, TAIL: gl.constexpr,
              TAIL_PAD: gl.constexpr, NS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Program per token: 64-row tiles by ``cp.async`` into an NS-slot ring (each row's
    first 512 bytes into one tile, the rest, ``TAIL`` bytes, into another), NS tiles in
    flight; the ids of a tile loaded a step before its copies."""
    LAT_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lat_s = gl.allocate_shared_memory(gl.uint8, [NS, BLOCK_N, 512], FLAT)
    tail_s = gl.allocate_shared_memory(gl.uint8, [NS, BLOCK_N, TAIL_PAD], FLAT)
    i_t = gl.program_id(0)
    o_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LAT_L))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, LAT_L))
    o_tc = gl.arange(0, TAIL_PAD, layout=gl.SliceLayout(0, LAT_L))
    n_steps: gl.constexpr = K // BLOCK_N
    ids = gl.load(idx_ptr + i_t * K + o_r)
    for j in range(n_steps + NS - 1):
        if j < n_steps:
            p_row = kv_ptr + ids.to(gl.int64) * stride_kv
            async_copy.async_copy_global_to_shared(lat_s.index(j % NS), p_row[:, None] + o_c[None, :])
            async_copy.async_copy_global_to_shared(tail_s.index(j % NS), p_row[:, None] + 512 + o_tc[None, :],
                                                   mask=(o_tc < TAIL)[None, :])
            if j + 1 < n_steps:
                ids = gl.load(idx_ptr + i_t * K + (j + 1) * BLOCK_N + o_r)
        async_copy.commit_group()
        # tile j - NS + 1 has landed
        async_copy.wait_group(NS - 1)
    async_copy.wait_group(0)
    _barrier()
    # a checksum of the last tile's first 512 bytes a row, checked against torch by the caller
    b_last = lat_s.index((n_steps - 1) % NS).load(LAT_L).to(gl.int32)
    gl.store(out_ptr + i_t, gl.sum(gl.sum(b_last, axis=1), axis=0))


@gluon.jit
def _pick(ids, o_r, r: gl.constexpr):
    """Entry ``r`` of ``ids`` (held whole by every thread): a register selection, no shuffle."""
    return gl.sum(gl.where(o_r == r, ids, 0), axis=0)


@gluon.jit
def tma_kernel(desc_a, desc_b, idx_ptr, out_ptr, K: gl.constexpr, NS: gl.constexpr, BLOCK_N: gl.constexpr,
               TWO: gl.constexpr):
    """Program per token: 64-row tiles by one TMA copy per row (``desc_a``'s box, [1, WA]
    int64) and with TWO a second (``desc_b``, the row's rest), into an NS-slot ring, NS tiles
    in flight, one mbarrier per slot expecting the tile's bytes."""
    WA: gl.constexpr = desc_a.block_type.shape[1]
    WB: gl.constexpr = desc_b.block_type.shape[1]
    a_s = gl.allocate_shared_memory(gl.int64, [NS, BLOCK_N, WA], desc_a.layout)
    if TWO:
        b_s = gl.allocate_shared_memory(gl.int64, [NS, BLOCK_N, WB], desc_b.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(bars.index(s), count=1)
    _barrier()
    # every thread holds all of a tile's ids (_pick)
    IDL: gl.constexpr = gl.BlockedLayout([BLOCK_N], [32], [gl.num_warps()], [0])
    o_r = gl.arange(0, BLOCK_N, layout=IDL)
    i_t = gl.program_id(0)
    n_steps: gl.constexpr = K // BLOCK_N
    ROW_BYTES: gl.constexpr = 8 * (WA + WB) if TWO else 8 * WA
    ids = gl.load(idx_ptr + i_t * K + o_r)
    for j in range(n_steps + NS - 1):
        if j < n_steps:
            slot = j % NS
            mbarrier.expect(bars.index(slot), BLOCK_N * ROW_BYTES)
            for r in gl.static_range(BLOCK_N):
                row = _pick(ids, o_r, r)
                tma.async_copy_global_to_shared(desc_a, [row, 0], bars.index(slot),
                                                a_s.index(slot).slice(r, 1))
                if TWO:
                    tma.async_copy_global_to_shared(desc_b, [row, WA], bars.index(slot),
                                                    b_s.index(slot).slice(r, 1))
            if j + 1 < n_steps:
                ids = gl.load(idx_ptr + i_t * K + (j + 1) * BLOCK_N + o_r)
        if j >= NS - 1:
            i = j - NS + 1
            mbarrier.wait(bars.index(i % NS), (i // NS) & 1)
            # no thread re-arms this slot before every thread saw this phase complete
            _barrier()
    # a checksum of the last tile's first box a row (int64 words), checked by the caller
    CHK: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [gl.num_warps(), 1], [1, 0])
    b_last = a_s.index((n_steps - 1) % NS).load(CHK)
    gl.store(out_ptr + i_t, gl.sum(gl.sum(b_last, axis=1), axis=0))


@gluon.jit
def _rows(tile, slot, r: gl.constexpr):
    """Row ``r`` of ring slot ``slot`` of a swizzled tile ring, as a [1, 64] view without the
    swizzle (Gluon does not slice along a swizzle pattern): the TMA unit swizzles by address."""
    NS: gl.constexpr = tile.shape[0]
    BLOCK_N: gl.constexpr = tile.shape[1]
    PLAIN: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    return tile._reinterpret(gl.bfloat16, [NS, BLOCK_N, 64], PLAIN).index(slot).slice(r, 1)


@gluon.jit
def tma9_kernel(desc, idx_ptr, out_ptr, K: gl.constexpr, NS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Program per token: bf16 rows (576 values) by nine TMA copies per row, each a [1, 64]
    box into row r of one of nine 128-byte-swizzled [BLOCK_N, 64] operand tiles (the layout
    the wgmma reads), NS tiles in flight. The last tile is written to ``out_ptr`` ([T,
    BLOCK_N, 576] bf16) through the tiles' own layout, so the caller sees whether a copy of
    one row lands where the swizzle puts that row."""
    SW: gl.constexpr = desc.layout
    t0 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t1 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t2 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t3 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t4 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t5 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t6 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t7 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    t8 = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_N, 64], SW)
    bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(bars.index(s), count=1)
    _barrier()
    IDL: gl.constexpr = gl.BlockedLayout([BLOCK_N], [32], [gl.num_warps()], [0])
    o_r = gl.arange(0, BLOCK_N, layout=IDL)
    i_t = gl.program_id(0)
    n_steps: gl.constexpr = K // BLOCK_N
    ids = gl.load(idx_ptr + i_t * K + o_r)
    for j in range(n_steps + NS - 1):
        if j < n_steps:
            slot = j % NS
            mbarrier.expect(bars.index(slot), BLOCK_N * 1152)
            for r in gl.static_range(BLOCK_N):
                row = _pick(ids, o_r, r)
                bar = bars.index(slot)
                tma.async_copy_global_to_shared(desc, [row, 0], bar, _rows(t0, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 64], bar, _rows(t1, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 128], bar, _rows(t2, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 192], bar, _rows(t3, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 256], bar, _rows(t4, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 320], bar, _rows(t5, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 384], bar, _rows(t6, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 448], bar, _rows(t7, slot, r))
                tma.async_copy_global_to_shared(desc, [row, 512], bar, _rows(t8, slot, r))
            if j + 1 < n_steps:
                ids = gl.load(idx_ptr + i_t * K + (j + 1) * BLOCK_N + o_r)
        if j >= NS - 1:
            i = j - NS + 1
            mbarrier.wait(bars.index(i % NS), (i // NS) & 1)
            _barrier()
    OUT_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, OUT_L))
    o_c = gl.arange(0, 64, layout=gl.SliceLayout(0, OUT_L))
    p_o = out_ptr + i_t * BLOCK_N * 576 + o_n[:, None] * 576 + o_c[None, :]
    last = (n_steps - 1) % NS
    gl.store(p_o, t0.index(last).load(OUT_L))
    gl.store(p_o + 64, t1.index(last).load(OUT_L))
    gl.store(p_o + 128, t2.index(last).load(OUT_L))
    gl.store(p_o + 192, t3.index(last).load(OUT_L))
    gl.store(p_o + 256, t4.index(last).load(OUT_L))
    gl.store(p_o + 320, t5.index(last).load(OUT_L))
    gl.store(p_o + 384, t6.index(last).load(OUT_L))
    gl.store(p_o + 448, t7.index(last).load(OUT_L))
    gl.store(p_o + 512, t8.index(last).load(OUT_L))


def _desc(kv8, stride_words, words, box):
    """A TMA descriptor over the rows of ``kv8`` (int64 view [rows, stride_words]), ``words``
    8-byte words a row, box [1, box]."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=64, rank=2)
    return TensorDescriptor(kv8, [kv8.shape[0], words], [stride_words, 1], [1, box], layout)


def main(path, only=None):
    ceilings = measure_ceilings()
    head = dict(header(), ceilings=ceilings, t=T, k=K, n_rows=N_ROWS)
    print(head, flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    idx = torch.randint(0, N_ROWS, (T, K), device="cuda", dtype=torch.int32, generator=g)
    out = torch.zeros(T * 32, device="cuda", dtype=torch.int32)
    out64 = torch.zeros(T, device="cuda", dtype=torch.int64)
    last = idx[:, -BLOCK_N:].long()
    records = []

    def record(kind, row, stride, variant, fn, check=None):
        if only is not None and kind not in only:
            return
        us = time_us(fn)
        ok = None
        if check is not None:
            got, want = check()
            ok = bool(torch.equal(got, want))
        gbps = T * K * row / us / 1e3
        rec = dict(kind=kind, row_bytes=row, stride=stride, variant=variant, us=us, GBps=gbps,
                   copy_share=gbps / ceilings["copy_GBps"], checksum_ok=ok)
        records.append(rec)
        print(f"GATHER {kind:5} row={row:4} stride={stride:4} {variant:22} {us:8.1f} us {gbps:7.0f} GB/s "
              f"{100 * rec['copy_share']:5.1f}% of copy{'' if ok is None else ' checksum ' + ('ok' if ok else 'WRONG')}",
              flush=True)

    for row, stride in ((656, 656), (656, 768), (1152, 1152)):
        store = torch.randint(0, 255, (N_ROWS, stride), device="cuda", dtype=torch.uint8)
        kv = store[:, :row]
        for block, warps, split in ((16, 4, 16), (32, 4, 8), (32, 8, 8), (64, 8, 8)):
            rpad = 1024 if row == 656 else 2048
            record("ld", row, stride, f"b{block} w{warps} s{split}",
                   lambda: ld_kernel[(T, split)](kv, idx, out, stride, K=K, ROW=row, RPAD=rpad, BLOCK=block,
                                                 SPLIT=split, num_warps=warps))
        tail, tail_pad = row - 512, (256 if row == 656 else 1024)
        for ns in ((1, 2, 3, 4) if row == 656 else (1, 2)):
            record("cp", row, stride, f"ns{ns}",
                   lambda: cp_kernel[(T,)](kv, idx, out, stride, K=K, TAIL=tail, TAIL_PAD=tail_pad, NS=ns,
                                           BLOCK_N=BLOCK_N, num_warps=4),
                   lambda: (out[:T], kv[last, :512].int().sum(dim=(1, 2)).int()))
        kv8 = store.view(torch.int64)
        words = row // 8
        if row == 656:
            variants = [("tma1", _desc(kv8, stride // 8, words, 128), None, (1, 2, 3)),
                        ("tma2", _desc(kv8, stride // 8, words, 64), _desc(kv8, stride // 8, words, 32), (1, 2, 3, 4))]
        else:
            variants = [("tma2", _desc(kv8, stride // 8, words, 128), _desc(kv8, stride // 8, words, 16), (1, 2, 3))]
        for name, da, db, nss in variants:
            for ns in nss:
                record("tma", row, stride, f"{name} ns{ns}",
                       lambda: tma_kernel[(T,)](da, db if db is not None else da, idx, out64, K=K, NS=ns,
                                                BLOCK_N=BLOCK_N, TWO=db is not None, num_warps=4),
                       lambda: (out64, kv8[last, :min(words, da.block_shape[1])].sum(dim=(1, 2))))
        if row == 1152:
            rows16 = store.view(torch.bfloat16)
            sw = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
            d9 = TensorDescriptor(rows16, [N_ROWS, 576], [576, 1], [1, 64], sw)
            o9 = torch.zeros(T, BLOCK_N, 576, device="cuda", dtype=torch.bfloat16)
            for ns in (1, 2):
                record("tma", row, stride, f"tma9 swizzled ns{ns}",
                       lambda: tma9_kernel[(T,)](d9, idx, o9, K=K, NS=ns, BLOCK_N=BLOCK_N, num_warps=4),
                       lambda: (o9.view(torch.int16), rows16[last].view(torch.int16)))
        del store, kv, kv8
        torch.cuda.empty_cache()

    # the shipped attention on the same shape, for scale (the cache of the bench)
    caches = Caches()
    for fmt, h in (() if only is not None and "attention" not in only else
                   (("fp8_ds_mla", 8), ("fp8_ds_mla", 16), ("bf16", 8), ("bf16", 16), ("bf16", 64))):
        w = Workload("decode" if T <= 512 else "prefill", T, h, fmt, n_rows=N_ROWS)
        q, kv, idx_w, _ = make_inputs(w, caches)
        row = 656 if fmt == "fp8_ds_mla" else 1152
        us = time_us(lambda: sparse_mla_attention(q, kv, idx_w, 576 ** -0.5))
        gbps = T * K * row / us / 1e3
        records.append(dict(kind="attention", row_bytes=row, stride=row, variant=f"H={h}", us=us, GBps=gbps,
                            copy_share=gbps / ceilings["copy_GBps"]))
        print(f"GATHER attn  row={row:4} H={h:3} {us:8.1f} us {gbps:7.0f} GB/s (rows only) "
              f"{100 * gbps / ceilings['copy_GBps']:5.1f}% of copy", flush=True)
    with open(path, "w") as f:
        json.dump(dict(head, records=records), f, indent=1)


def _option(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


if __name__ == "__main__":
    N_ROWS, T = _option("--rows", N_ROWS), _option("--tokens", T)
    main(sys.argv[1], sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None)
