"""Split counts for few tokens with many heads (GPU): the shipped rule against fixed counts.

sm90's 64-head tiles hold one program per SM, and the split rule (configs.choose_splits) fills
one wave with at least ``MIN_TILES_PER_SPLIT`` tiles per split. At T=4 with 64 heads that
leaves half the SMs idle (4 tokens x 16 splits); at T=32 each program runs 8 tiles. This times
each workload through the public API (CUDA-graph replays, as decode runs) with the split count
forced to each of ``COUNTS`` (up to one 64-row tile per split), beside the shipped rule and
FlashMLA, and checks every output against the shipped one.
(A rule measured with it and dropped: at most half the SMs' count of (token, split) pairs on
the 64-head tiles, commit 8c0c75f's ``--rule`` mode; BENCHMARKS.md "Split counts for few
tokens".) With ``--latency``: T=1 and T=4 at 8-128 heads, where ``MIN_TILES_PER_SPLIT`` caps
the count, up to one tile per split, each count timed in ``--rounds`` alternating rounds.
Usage: python benchmarks/split_count.py OUT.json [--latency] [--rounds R]
"""

import argparse
import contextlib
import json
from statistics import median

import torch

from triton_sparse_mla import configs, sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, flashmla_fn, header, make_inputs, time_us

import replan

COUNTS = (1, 2, 4, 8, 16, 32)
WORKLOADS = [Workload("decode", t, h, fmt) for fmt in ("bf16", "fp8_ds_mla")
             for t, h in ((4, 64), (4, 128), (32, 64), (32, 128))] + [
    Workload("decode", 128, 64, "bf16")]
LATENCY_COUNTS = (4, 8, 16, 32, 64)
LATENCY_WORKLOADS = [Workload("decode", t, h, fmt) for fmt in ("bf16", "fp8_ds_mla")
                     for t in (1, 4) for h in (8, 16, 32, 64, 128)]


@contextlib.contextmanager
def forced_splits(n):
    """Inside: every plan splits the top-k axis ``n`` ways (configs.choose_splits replaced)."""
    with replan.patched(configs, choose_splits=lambda *a, **k: n):
        yield


def main(path, latency=False, rounds=1):
    caches, records = Caches(), []
    counts = LATENCY_COUNTS if latency else COUNTS
    for w in LATENCY_WORKLOADS if latency else WORKLOADS:
        q, kv, idx, lengths = make_inputs(w, caches)
        scale = 576 ** -0.5
        plan = configs.plan_launch(*configs.device_traits(0), t_count=w.t, h_count=w.h,
                                   topk=w.k, fp8=w.fmt == "fp8_ds_mla")
        out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)

        def call():
            sparse_mla_attention(q, kv, idx, scale, topk_length=lengths, out=out)

        call()
        base = out.float().clone()
        rec = dict(workload=w.name, tile=str(plan.tile), shipped_splits=plan.splits)
        times = {n: [] for n in counts if n * plan.tile.block_n <= w.k}
        diffs, base_times = {}, []
        for _ in range(rounds):
            base_times.append(time_us(call))
            for n in times:
                with forced_splits(n):
                    times[n].append(time_us(call))
                    diffs[n] = ((out.float() - base).norm() / base.norm()).item()
        rec["counts"] = {n: dict(us=median(ts), rounds_us=ts, rel_diff=diffs[n])
                         for n, ts in times.items()}
        base_us = rec["shipped_us"] = median(base_times)
        fm = flashmla_fn(w, q, kv, idx, lengths, scale)
        rec["flashmla_us"] = time_us(fm) if fm is not None else None
        records.append(rec)
        row = " ".join(f"{n}:{c['us']:.1f}" for n, c in rec["counts"].items())
        worst = max(c["rel_diff"] for c in rec["counts"].values())
        print(f"SPLITN {w.name:36} shipped {plan.splits}:{base_us:.1f} | {row} | FM {rec['flashmla_us']} "
              f"| max diff {worst:.1e}", flush=True)
        with open(path, "w") as f:
            json.dump(dict(header=header(), records=records), f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    main(a.out, a.latency, a.rounds)
