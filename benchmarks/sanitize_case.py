"""A representative run for compute-sanitizer (memcheck; racecheck for the shared memory of
the Gluon tile, whose barriers between warpgroups nothing else checks): the latency tile
(split), sm90's 64-head tile (the Gluon kernel on SM90: split, two head tiles, the cache at an
aligned row stride), a 32-head decode tile (for fp8_ds_mla rows on SM90 the few-head Gluon
kernel, aligned likewise: split, 24 heads), a 16-head prefill tile (no split), an 8-head
decode tile (split; on SM90 the few-head Gluon kernels of both row formats) and an 8-head
prefill tile (on SM90 with fp8_ds_mla rows kernels/gluon_fp8_regs.py), bf16 and fp8_ds_mla,
with invalid indices from the whole menu, partial lengths and a sink. Exits non-zero if any
result is wrong, so the sanitizer's and the math's verdicts both show."""

import sys

sys.path.insert(0, "tests")
from problems import aligned_rows, assert_close, make_problem, tol  # noqa: E402

from triton_sparse_mla import sparse_mla_attention, sparse_mla_reference  # noqa: E402

for fmt in ("bf16", "fp8_ds_mla"):
    for t, h, k in ((2, 64, 2048), (4, 80, 512), (40, 24, 512), (600, 16, 64), (40, 8, 512), (600, 8, 64)):
        p = make_problem(t=t, h=h, k=k, n=4096, fmt=fmt, device="cuda", topk_length="partial", sink=True)
        kv = aligned_rows(p.kv) if h in (80, 24, 8) else p.kv
        out, lse = sparse_mla_attention(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                                        attn_sink=p.attn_sink, return_lse=True)
        ref = sparse_mla_reference(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                                   attn_sink=p.attn_sink)
        assert_close(out, lse, *ref, **tol(fmt))
        print(f"ok {fmt} T={t} H={h} K={k}")
