"""Launch the shipped kernels once per workload between cudaProfilerStart/Stop, for Nsight Compute.

Each workload is run once before profiling starts (compilation, autotuning of nothing, caches
built), so the profiled launches are the steady-state kernels. Run under
``ncu --profile-from-start off ... python3 benchmarks/ncu_profile.py [WORKLOAD ...]`` where a
workload is ``T,H,FORMAT[,FIELD][,N=ROWS][,len=rand]`` (``bench.Workload.from_spec`` with a
field; default: the decode workloads whose targets are missed at 8-16 heads, with bf16 beside
them for contrast); ``FIELD`` turns that boolean
``TileConfig`` field on in the shipped tile (e.g. ``128,16,fp8_ds_mla,fp8_vec8``), ``-FIELD``
off; ``N=ROWS`` sets the cache's rows (default 1M; e.g. ``4096,16,bf16,N=32768``, the prefill
bench's L2-resident cache); ``ws=0`` keeps an fp8_ds_mla call off the bf16 workspace
(``fp8_workspace=False``: the conversion in the kernel, e.g.
``4096,16,fp8_ds_mla,fp8_regs,N=32768,ws=0``). ``benchmarks/device_run.sh ncu`` does that,
with ``PROFILE_WORKLOADS`` for other workloads.
"""

import contextlib
import dataclasses
import sys

import torch

from triton_sparse_mla import configs, sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, make_inputs

import replan


@contextlib.contextmanager
def field_on(field):
    """The shipped plans, with ``field`` of their tile set (nothing when ``field`` is None)."""
    if field is None:
        yield
        return
    shipped = configs.plan_launch

    def plan(*args, **kwargs):
        p = shipped(*args, **kwargs)
        on = not field.startswith("-")  # ("-FIELD": off)
        return dataclasses.replace(p, tile=dataclasses.replace(p.tile, **{field.lstrip("-"): on}))

    with replan.patched(configs, plan_launch=plan):
        yield

DEFAULT = ["128,16,fp8_ds_mla", "128,16,bf16", "128,8,fp8_ds_mla"]


def main(specs):
    caches = Caches()
    calls = []
    for spec in specs:
        # (a part that is not the workload's own names a TileConfig field)
        parts = spec.split(",")
        ws = None if "ws=0" not in parts else False
        parts = [r for r in parts if r != "ws=0"]
        field = [r for r in parts[3:] if not (r.startswith("N=") or r == "len=rand")]
        w = Workload.from_spec(",".join(r for r in parts if r not in field))
        q, kv, idx, lengths = make_inputs(w, caches)

        def call(q=q, kv=kv, idx=idx, n=lengths, field=field[0] if field else None, ws=ws):
            with field_on(field):
                sparse_mla_attention(q, kv, idx, 576 ** -0.5, topk_length=n, fp8_workspace=ws)

        calls.append((w.name + (f" {field[0]}" if field else ""), call))
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
