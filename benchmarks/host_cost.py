"""Host time of one call, ours and FlashMLA's, and where ours goes (cProfile).

Run 311 (call_overhead.py, H100) found a call followed by a device sync 126 us slower than its
graph replay at T=512 with 64 heads (FlashMLA: 40 us): host work that the device waits through
whenever nothing is queued ahead of a call. This measures that host work directly: per
workload, ``CALLS`` calls queued back to back after a warm-up, the host's wall time over them
(the device's queue never fills: a few launches per call), per call; then the same calls under
cProfile, whose functions by their own time go to the JSON (the top ``TOP``) and the log.

The label (``--label``) names the code timed in the log and the JSON, with whether
kernels/launch.py's own launch path is on (``TRITON_SPARSE_MLA_FAST_LAUNCH``; absent before
it was written), so runs of two trees, or of one tree both ways, can be told apart.

Usage (GPU): python benchmarks/host_cost.py OUT.json [SPEC ...] [--label NAME]
"""

import argparse
import cProfile
import io
import json
import pstats
import time

import torch

from triton_sparse_mla import sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, flashmla_fn, header, make_inputs

DEFAULT = ["1,64,bf16", "512,64,bf16,N=32768", "2048,64,fp8_ds_mla,N=32768"]
CALLS = 50
TOP = 25


def host_us(fn, calls=CALLS) -> float:
    """Host microseconds per call of ``calls`` calls queued behind a synced warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def profile(fn, calls=CALLS):
    """The top functions by own time over ``calls`` calls: (name, calls, own us/call, cum us/call)."""
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, ncalls, own, cum, _) in stats.stats.items():
        rows.append((f"{path.rsplit('/', 2)[-1]}:{line}({name})", ncalls / calls,
                     own / calls * 1e6, cum / calls * 1e6))
    rows.sort(key=lambda r: -r[2])
    return rows[:TOP]


def fast_launch():
    """Whether this tree launches through kernels/launch.py's own path (None: no such path)."""
    try:
        from triton_sparse_mla.kernels import launch
    except ImportError:
        return None
    return launch.FAST


def main(path, specs, label):
    caches = Caches()
    scale = 576 ** -0.5
    record = {"header": header(), "calls": CALLS, "label": label, "fast_launch": fast_launch(),
              "rows": []}
    for spec in specs:
        w = Workload.from_spec(spec)
        q, kv, idx, lengths = make_inputs(w, caches)

        def ours():
            sparse_mla_attention(q, kv, idx, scale, topk_length=lengths)

        row = {"workload": w.name, "ours_host_us": host_us(ours)}
        fm = flashmla_fn(w, q, kv, idx, lengths, scale)
        row["flashmla_host_us"] = host_us(fm) if fm is not None else None
        row["ours_profile"] = profile(ours)
        record["rows"].append(row)
        fm_text = "-" if row["flashmla_host_us"] is None else f"{row['flashmla_host_us']:7.1f}"
        print(f"HOST [{label} fast_launch={record['fast_launch']}] {w.name:34s} "
              f"ours {row['ours_host_us']:7.1f} us  FlashMLA {fm_text} us", flush=True)
        for name, ncalls, own, cum in row["ours_profile"][:12]:
            print(f"  {own:7.2f} own {cum:8.2f} cum {ncalls:5.1f}x  {name}", flush=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("specs", nargs="*", default=DEFAULT)
    ap.add_argument("--label", default="this tree")
    a = ap.parse_args()
    main(a.out, a.specs, a.label)
