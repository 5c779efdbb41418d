"""compute-sanitizer (racecheck, memcheck) on the producer-warpgroup Gluon kernels
(every TileConfig.gluon tile): sm90's 64-head tile, bf16 rows and fp8_ds_mla
rows (kernels/gluon_fp8_producer.py), over 64 and 80 heads, and for fp8_ds_mla rows the few-head
tile (kernels/gluon_narrow.py) over 16 and 24 heads, with every length full and with
partial lengths (programs with no step), each problem's verdict printed after it so that the
sanitizer's reports can be placed. Usage: python benchmarks/sanitize_producer.py [FORMAT ...]
[--heads H,H] [--k K] (default: bf16 fp8_ds_mla, every head count, top-k 512: eight 64-row
tiles per token; with ``--k 128`` the bf16 tile's two consumer warpgroups (the alternate-tile
kernel) have one pair of tiles, with 256 two)."""

import sys

sys.path.insert(0, "tests")
from problems import aligned_rows, assert_close, make_problem, tol  # noqa: E402

from triton_sparse_mla import sparse_mla_attention, sparse_mla_reference  # noqa: E402


def check(fmt, t, h, lengths, k):
    p = make_problem(t=t, h=h, k=k, n=4096, fmt=fmt, device="cuda", topk_length=lengths, sink=True)
    kv = aligned_rows(p.kv)
    out, lse = sparse_mla_attention(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                                    attn_sink=p.attn_sink, return_lse=True)
    ref = sparse_mla_reference(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                               attn_sink=p.attn_sink)
    assert_close(out, lse, *ref, **tol(fmt))
    print(f"ok producer {fmt} T={t} H={h} K={k} lengths={lengths}", flush=True)


args = sys.argv[1:]
heads = None
if "--heads" in args:
    heads = [int(h) for h in args.pop(args.index("--heads") + 1).split(",")]
    args.remove("--heads")
topk = 512
if "--k" in args:
    topk = int(args.pop(args.index("--k") + 1))
    args.remove("--k")
for fmt in args or ["bf16", "fp8_ds_mla"]:
    for t, h in ((4, 64), (4, 80)) + (((12, 16), (12, 24)) if fmt == "fp8_ds_mla" else ()):
        if heads and h not in heads:
            continue
        for lengths in (None, "partial"):
            check(fmt, t, h, lengths, topk)
