"""Launch the 64-head bf16 kernels once each between cudaProfilerStart/Stop, for Nsight Compute:
the shipped lockstep tile, then the alternate-tile (pingpong) kernel with each tile height in
``--blocks`` (kernels/gluon_pingpong.py's BLOCK_N, read when a call plans its launch, so one
process can run both heights). Every kernel runs once before profiling starts (compilation).

Usage: ``ncu --profile-from-start off ... python3 benchmarks/pp_profile.py [--phase prefill]
[--t 4096] [--rows 32768] [--blocks 64,32]``. ``benchmarks/device_run.sh`` has no step for it:
run it under ncu as that script's ``ncu`` step runs ncu_profile.py.
"""

import argparse
import contextlib

import torch

from triton_sparse_mla import sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, make_inputs
from triton_sparse_mla.kernels import gluon_pingpong

from ncu_profile import field_on  # (a script beside this one: its directory is on the path)


@contextlib.contextmanager
def pingpong(block_n):
    """The shipped plans, with ``pingpong`` on at ``block_n`` rows per tile (None: as shipped)."""
    if block_n is not None:
        gluon_pingpong.BLOCK_N = block_n
    with field_on(None if block_n is None else "pingpong"):
        yield


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", default="prefill")
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--blocks", default="64,32")
    a = ap.parse_args()
    w = Workload(a.phase, a.t, 64, "bf16", n_rows=a.rows)
    q, kv, idx, lengths = make_inputs(w, Caches())
    variants = [None] + [int(b) for b in a.blocks.split(",")]

    def run_all():
        for block_n in variants:
            with pingpong(block_n):
                sparse_mla_attention(q, kv, idx, 576 ** -0.5, topk_length=lengths)

    run_all()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run_all()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", w.name, "lockstep, then pingpong with", a.blocks, "rows per tile")


if __name__ == "__main__":
    main()
