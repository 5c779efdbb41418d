"""Where a split decode call's time goes (GPU): the main kernel and the combine, per variant.

Run 171 found decode T=32 H=64 bf16 at 57.5 us with the shipped 4 splits and 46.7 with 2,
where the same kernel over 32 heads takes 42.8 with 4 (run 172). This times, under
torch.profiler, each kernel of the call for: 64 heads with 4 and 2 splits; 64 heads whose q
rows 32-63 are zero (the same stores as 64 heads, the data of 32) with 4 splits; 32 heads with
4 splits; and T=128 H=64 with 1 split. If the zero-q variant runs as fast as 32 heads, the cost
follows the data (the clocks under the dots' power); if as slow as 64 heads, it follows the
stores and the combine.
Usage: python benchmarks/kernel_split_probe.py OUT.json
"""

import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from split_count import forced_splits  # noqa: E402

from triton_sparse_mla import sparse_mla_attention  # noqa: E402
from triton_sparse_mla.bench import Caches, Workload, header, make_inputs, time_us  # noqa: E402

REPS = 50
VARIANTS = [  # (name, T, H, splits, zero q heads from)
    ("H64 s4", 32, 64, 4, None), ("H64 s2", 32, 64, 2, None), ("H64 zero32 s4", 32, 64, 4, 32),
    ("H32 s4", 32, 32, 4, None), ("H32 s2", 32, 32, 2, None), ("T128 H64 s1", 128, 64, 1, None),
]


def main(path):
    caches, records = Caches(), []
    for name, t, h, splits, zero_from in VARIANTS:
        q, kv, idx, _ = make_inputs(Workload("decode", t, h, "bf16"), caches)
        if zero_from is not None:
            q[:, zero_from:] = 0
        out = torch.empty(t, h, 512, device="cuda", dtype=torch.bfloat16)

        def call():
            sparse_mla_attention(q, kv, idx, 576 ** -0.5, out=out)

        with forced_splits(splits):
            total = time_us(call)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(REPS):
                    call()
                torch.cuda.synchronize()
        per_kernel = collections.defaultdict(float)
        for e in prof.key_averages():
            if e.self_device_time_total > 0:
                per_kernel[e.key[:48]] += e.self_device_time_total / REPS
        rec = dict(variant=name, t=t, h=h, splits=splits, graph_us=total, kernels_us=dict(per_kernel))
        records.append(rec)
        parts = " ".join(f"{k}={v:.1f}" for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1]))
        print(f"PROBE {name:14} graph {total:6.1f} us | {parts}", flush=True)
        with open(path, "w") as f:
            json.dump(dict(header=header(), records=records), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
