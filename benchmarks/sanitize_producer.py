"""compute-sanitizer (racecheck, memcheck) on the producer-warpgroup Gluon kernel
(TileConfig.producer_warp): sm90's 64-head bf16 tile with the producer on, over 64 and 80 heads,
with every length full and with partial lengths (programs with no step), each problem's
verdict printed after it so that the sanitizer's reports can be placed."""

import dataclasses
import sys

sys.path.insert(0, "tests")
from problems import aligned_rows, assert_close, make_problem  # noqa: E402

from triton_sparse_mla import configs, sparse_mla_attention, sparse_mla_reference  # noqa: E402

_pick = configs.pick_tile


def _with_producer(*args, **kwargs):
    tile = _pick(*args, **kwargs)
    return dataclasses.replace(tile, producer_warp=True) if tile.gluon and not kwargs.get("fp8") else tile


configs.pick_tile = _with_producer
for h in (64, 80):
    for lengths in (None, "partial"):
        p = make_problem(t=4, h=h, k=512, n=4096, device="cuda", topk_length=lengths, sink=True)
        kv = aligned_rows(p.kv)
        out, lse = sparse_mla_attention(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                                        attn_sink=p.attn_sink, return_lse=True)
        ref = sparse_mla_reference(p.q, kv, p.indices, p.sm_scale, topk_length=p.topk_length,
                                   attn_sink=p.attn_sink)
        assert_close(out, lse, *ref, rtol_norm=3e-2)
        print(f"ok producer H={h} lengths={lengths}", flush=True)
