"""Launch the shipped kernels once per workload between cudaProfilerStart/Stop, for Nsight Compute.

Each workload is run once before profiling starts (compilation, autotuning of nothing, caches
built), so the profiled launches are the steady-state kernels. Run under
``ncu --profile-from-start off ... python3 benchmarks/profile.py [WORKLOAD ...]`` where a
workload is ``T,H,FORMAT`` (default: the decode workloads whose targets are missed at 8-16 heads,
with bf16 beside them for contrast). ``benchmarks/device_run.sh ncu`` does that.
"""

import sys

import torch

from triton_sparse_mla import sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, make_inputs

DEFAULT = ["128,16,fp8_ds_mla", "128,16,bf16", "128,8,fp8_ds_mla"]


def main(specs):
    caches = Caches()
    calls = []
    for spec in specs:
        t, h, fmt = spec.split(",")
        w = Workload("decode" if int(t) <= 512 else "prefill", int(t), int(h), fmt)
        q, kv, idx, lengths = make_inputs(w, caches)
        calls.append((w.name, lambda q=q, kv=kv, idx=idx, n=lengths:
                      sparse_mla_attention(q, kv, idx, 576 ** -0.5, topk_length=n)))
    for _, fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in calls:
        print("profiling", name, flush=True)
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
