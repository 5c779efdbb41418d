"""Where a prefill call's time goes beyond its kernel: ours and FlashMLA's, timed four ways.

The bench times prefill eagerly (since 122ca92 ``bench.time_in_turn``: every call heated, then
groups of queued calls in turn; before, ``bench.time_us(fn, graph=False)``). Run 303 put ours at
359.3 us a call at T=512 with 64 heads over 32K rows, where one launch under Nsight Compute
took 287.7 us (run 310, another lease); at T=2048, 1244.3 against 1100. This script measures,
per workload and in one process, for ours and for FlashMLA (padded to 64 heads below 64):

* ``queued``: the bench's group since commit ae81529, ``EAGER_REPS`` calls queued behind one
  untimed call (``bench._eager_ms(fn, reps, lead=True)``);
* ``idle``: the same group started on an idle device, as the bench did before (the first
  call's host work inside the group);
* ``synced``: each call followed by a device sync (host and device in series): minus
  ``graph``, the host work a call cannot hide when nothing is queued ahead of it;
* ``graph``: CUDA-graph replays of one call (device time alone; None where the call cannot be
  captured, e.g. the fp8_ds_mla workspace that counts its rows).

Each path is heated (``bench.heat``, 1 s) first; each way is the median of ``--rounds`` (3)
groups. Workloads (``bench.Workload.from_spec`` forms, prefill phase forced): by default
ShardQ's shapes at 64 heads and the bench's T=4096, bf16 over 32K rows.

Usage (GPU): python benchmarks/call_overhead.py OUT.json [SPEC ...] [--rounds N]
"""

import argparse
import json
import statistics

import torch

from triton_sparse_mla import sparse_mla_attention
from triton_sparse_mla.bench import (EAGER_REPS, Caches, Workload, _eager_ms, flashmla_fn, header,
                                     heat, make_inputs)

DEFAULT = ["512,64,bf16,N=32768", "2048,64,bf16,N=32768", "4096,64,bf16,N=32768",
           "512,128,bf16,N=32768"]


def _synced_ms(fn, reps) -> float:
    """Milliseconds per call with a device sync after each (events around the whole series)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _captured(fn):
    """A CUDA graph of one call of ``fn``, or None if it cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # (allocations made outside the capture first)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # noqa: BLE001 - a call that cannot be captured has no graph time
        return None
    return graph


def ways_us(fn, rounds) -> dict:
    heat(fn, 1.0)
    graph = _captured(fn)
    ways = {"queued": lambda: _eager_ms(fn, EAGER_REPS, lead=True),
            "idle": lambda: _eager_ms(fn, EAGER_REPS),
            "synced": lambda: _synced_ms(fn, EAGER_REPS),
            "graph": lambda: (None if graph is None
                              else _eager_ms(graph.replay, EAGER_REPS, lead=True))}
    out = {}
    for name, way in ways.items():
        times = [way() for _ in range(rounds)]
        out[name] = None if None in times else statistics.median(times) * 1e3
    return out


def main(path, specs, rounds):
    caches = Caches()
    scale = 576 ** -0.5
    record = {"header": header(), "rounds": rounds, "eager_reps": EAGER_REPS, "rows": []}
    for spec in specs:
        w = Workload.from_spec(spec)
        w = Workload("prefill", w.t, w.h, w.fmt, w.k, w.n_rows, w.lengths)
        q, kv, idx, lengths = make_inputs(w, caches)
        row = {"workload": w.name,
               "ours": ways_us(lambda: sparse_mla_attention(q, kv, idx, scale, topk_length=lengths),
                               rounds)}
        fm = flashmla_fn(w, q, kv, idx, lengths, scale)
        row["flashmla"] = ways_us(fm, rounds) if fm is not None else None
        record["rows"].append(row)
        for who in ("ours", "flashmla"):
            if row[who] is not None:
                print(f"OVERHEAD {w.name:32s} {who:8s} " + "  ".join(
                    f"{k} {'-' if v is None else f'{v:8.1f}'}" for k, v in row[who].items()),
                    flush=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("specs", nargs="*", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    main(a.out, a.specs, a.rounds)
