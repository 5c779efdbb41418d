"""Launch the DSA indexer's score kernels once per workload between cudaProfilerStart/Stop, for
Nsight Compute (``benchmarks/device_run.sh indexer-ncu``).

Workloads are ``prefill,T,CTX,HEADS`` or ``decode,BATCH,CTX,NEXT_N,HEADS`` (default: the prefill
of 8192 new tokens at 64 heads and the decode of 32 requests of 8K at 64 heads, two rows each),
on the inputs of ``triton_sparse_mla.indexer.bench``. Each is run once before profiling starts (compilation),
so the profiled launch is the steady-state kernel.

Usage (GPU): ncu --profile-from-start off ... python3 benchmarks/indexer_profile.py [WORKLOAD ...]
"""

import sys

import torch

from triton_sparse_mla.indexer import bench

DEFAULT = ["prefill,8192,0,64", "decode,32,8192,2,64"]


def launcher(spec: str):
    phase, *numbers = spec.split(",")
    try:
        n = [int(x) for x in numbers]
        if phase == "prefill" and len(n) == 3:
            w = bench.Workload("prefill", heads=n[2], ctx=n[1], t=n[0])
        elif phase == "decode" and len(n) == 4:
            w = bench.Workload("decode", heads=n[3], ctx=n[1], batch=n[0], next_n=n[2])
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"workload {spec!r}: expected prefill,T,CTX,HEADS or "
                         "decode,BATCH,CTX,NEXT_N,HEADS") from None
    return bench.ours(w, bench.make_inputs(w, "cuda"))


def main(specs):
    runs = [launcher(s) for s in specs or DEFAULT]
    for run in runs:
        run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for run in runs:
        run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:])
