"""compute-sanitizer (racecheck, memcheck) on the producer-warpgroup Gluon kernels
(TileConfig.producer_warp): sm90's 64-head tile with the producer on, bf16 rows and fp8_ds_mla
rows (kernels/gluon_fp8_producer.py), over 64 and 80 heads, with every length full and with
partial lengths (programs with no step), each problem's verdict printed after it so that the
sanitizer's reports can be placed. Usage: python benchmarks/sanitize_producer.py [FORMAT ...]
(default: bf16 fp8_ds_mla)."""

import dataclasses
import sys

sys.path.insert(0, "tests")
from problems import aligned_rows, assert_close, make_problem  # noqa: E402

from triton_sparse_mla import configs, sparse_mla_attention, sparse_mla_reference  # noqa: E402

_pick = configs.pick_tile


def _with_producer(*args, **kwargs):
    tile = _pick(*args, **kwargs)
    return dataclasses.replace(tile, producer_warp=True) if tile.gluon else tile


configs.pick_tile = _with_producer


def check(fmt, h, lengths):
    p = make_problem(t=4, h=h, k=512, n=4096, fmt=fmt, device="cuda", topk_length=lengths, sink=True)
    kv = aligned_rows(p.kv)
    out, lse = sparse_mla_attention(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                                    attn_sink=p.attn_sink, return_lse=True)
    ref = sparse_mla_reference(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                               attn_sink=p.attn_sink)
    assert_close(out, lse, *ref, rtol_norm=3e-2)
    print(f"ok producer {fmt} H={h} lengths={lengths}", flush=True)


for fmt in sys.argv[1:] or ["bf16", "fp8_ds_mla"]:
    for h in (64, 80):
        for lengths in (None, "partial"):
            check(fmt, h, lengths)
