"""17-32 heads on sm90 (GPU): the table's tile against the one it replaced, through the public API.

sm90's tables give bf16/fp16 rows with 17-32 heads the 64-head alternate-tile kernel, the heads
past H masked (configs._G64_32); before, they took the 32x64 Triton tile (``OLD``). This times
both on the same inputs (decode as CUDA-graph replays; prefill eagerly, each variant heated
first, the rounds in alternating order), checks both outputs against the float64 reference on
the first tokens, and times FlashMLA (heads padded to 64, as vLLM calls it). fp8_ds_mla rows
enter only through prefill's bf16 workspace, which runs the plain table.
Usage: python benchmarks/mid_heads.py OUT.json [--rounds N]
"""

import json
import statistics
import sys

import torch

from triton_sparse_mla import configs, sparse_mla_attention
from triton_sparse_mla.bench import (Caches, Workload, flashmla_fn, header, heat, make_inputs,
                                     reference_error, time_us)

import replan

C = configs.TileConfig
OLD = {("decode", "plain"): ((16, C(16, 64, 4, 3, prefetch_idx=False)), (32, C(32, 64, 4, 2)),
                             (configs._ANY, configs._G64)),
       ("prefill", "plain"): ((16, C(16, 64, 4, 2)), (32, C(32, 64, 4, 2)),
                              (configs._ANY, configs._G64))}
WORKLOADS = [
    *(Workload("decode", t, 32, "bf16") for t in (8, 32, 128, 512)),
    Workload("decode", 128, 32, "bf16", lengths="random"),
    Workload("decode", 128, 20, "bf16"),
    Workload("prefill", 4096, 32, "bf16", n_rows=32768),
    Workload("prefill", 16384, 32, "bf16", n_rows=32768),
    Workload("prefill", 4096, 32, "bf16"),
    Workload("prefill", 4096, 20, "bf16", n_rows=32768),
    Workload("prefill", 4096, 32, "fp8_ds_mla", n_rows=32768),
]


def _with_table(table, fn):
    with replan.patched(configs, CONFIGS={**configs.CONFIGS, "sm90": {**configs.CONFIGS["sm90"], **table}}):
        return fn()


def main(path, rounds):
    caches, records = Caches(), []
    for w in WORKLOADS:
        q, kv, idx, lengths = make_inputs(w, caches)
        scale, graph = 576 ** -0.5, w.phase == "decode"
        outs = {v: torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
                for v in ("new", "old")}

        def call(v):
            return lambda: sparse_mla_attention(q, kv, idx, scale, topk_length=lengths, out=outs[v])

        tables = {"new": {}, "old": OLD}
        times = {"new": [], "old": []}
        for r in range(rounds):
            for v in (("new", "old") if r % 2 == 0 else ("old", "new")):
                def timed(v=v):
                    if not graph:
                        heat(call(v), 1.0)
                    return time_us(call(v), graph)
                times[v].append(_with_table(tables[v], timed))
        errs = {v: reference_error(q, kv, idx, lengths, scale, outs[v]) for v in outs}
        fm = flashmla_fn(w, q, kv, idx, lengths, scale)
        fm_us = time_us(fm, graph) if fm is not None else None
        new, old = (statistics.median(times[v]) for v in ("new", "old"))
        rec = dict(workload=w.name, new_us=new, old_us=old, new_over_old=old / new,
                   flashmla_us=fm_us, rounds=times, rel_err=errs)
        records.append(rec)
        fm_txt = f"{fm_us:9.1f} {fm_us / new:5.2f}" if fm_us else "        -     -"
        print(f"MID {w.name:40} new {new:9.1f} old {old:9.1f} x{old / new:5.2f} FM {fm_txt} "
              f"err {errs['new']:.1e}/{errs['old']:.1e}", flush=True)
        with open(path, "w") as f:
            json.dump(dict(header=header(), records=records), f, indent=1)


if __name__ == "__main__":
    n = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    main(sys.argv[1], n)
