"""The shipped combine kernel against benchmarks/combine_variants.py's candidate (GPU).

1. Alone: each kernel over the same random partials (CUDA-graph replays; the partials stay in
   L2 between replays), outputs compared.
2. In the call: decode workloads through the public API with the candidate patched in for the
   shipped combine, timed in alternating order (CUDA-graph replays), outputs compared with the
   shipped call's and the float64 reference's.
Usage: python benchmarks/combine_probe.py OUT.json
"""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from combine_variants import launch_combine_heads  # noqa: E402

from triton_sparse_mla import sparse_mla_attention  # noqa: E402
from triton_sparse_mla.bench import (Caches, Workload, header, make_inputs,  # noqa: E402
                                     reference_error, time_us)
from triton_sparse_mla.kernels import attention  # noqa: E402
from triton_sparse_mla.kernels.combine import launch_combine  # noqa: E402

ALONE = [(32, 4, 64), (32, 2, 64), (32, 4, 32), (4, 16, 64), (4, 16, 128), (32, 2, 128),
         (128, 2, 64), (8, 16, 64), (16, 8, 64)]
IN_CALL = [Workload("decode", t, h, fmt) for fmt in ("bf16", "fp8_ds_mla")
           for t, h in ((4, 64), (4, 128), (8, 64), (16, 64), (32, 64), (32, 128))] + [
    Workload("decode", 32, 32, "bf16"), Workload("decode", 32, 16, "fp8_ds_mla"),
    Workload("decode", 128, 32, "bf16"), Workload("decode", 64, 64, "bf16")]
KERNELS = {"shipped": launch_combine, "heads": launch_combine_heads,
           "heads2": lambda *a: launch_combine_heads(*a, block_hc=2)}


def alone():
    records = []
    for t, s, h in ALONE:
        part_o = torch.randn(t, s, h, 512, device="cuda")
        part_lse = torch.randn(t, h, s, device="cuda") * 4
        outs = {k: torch.empty(t, h, 512, device="cuda", dtype=torch.bfloat16) for k in KERNELS}
        lses = {k: torch.empty(t, h, device="cuda") for k in KERNELS}
        us = {k: time_us(lambda k=k: KERNELS[k](part_o, part_lse, None, outs[k], lses[k]))
              for k in KERNELS}
        diff = max((outs[k].float() - outs["shipped"].float()).abs().max().item() for k in KERNELS)
        mb = part_o.numel() * 4 / 1e6
        records.append(dict(t=t, splits=s, h=h, partial_MB=mb, us=us, max_abs_diff=diff))
        print(f"ALONE T={t:3d} S={s:2d} H={h:3d} {mb:5.1f} MB shipped {us['shipped']:6.1f} us "
              f"heads {us['heads']:6.1f} us heads2 {us['heads2']:6.1f} us "
              f"x{us['shipped'] / min(us['heads'], us['heads2']):.2f} diff {diff:.1e}", flush=True)
    return records


def in_call(rounds=2):
    caches, records = Caches(), []
    for w in IN_CALL:
        q, kv, idx, lengths = make_inputs(w, caches)
        outs = {k: torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16) for k in KERNELS}
        times = {k: [] for k in KERNELS}
        for r in range(rounds):
            for k in (list(KERNELS) if r % 2 == 0 else list(KERNELS)[::-1]):
                attention.launch_combine = KERNELS[k]
                try:
                    times[k].append(time_us(lambda k=k: sparse_mla_attention(
                        q, kv, idx, 576 ** -0.5, topk_length=lengths, out=outs[k])))
                finally:
                    attention.launch_combine = launch_combine
        us = {k: statistics.median(v) for k, v in times.items()}
        diff = max(((outs[k].float() - outs["shipped"].float()).norm()
                    / outs["shipped"].float().norm()).item() for k in KERNELS)
        err = max(reference_error(q, kv, idx, lengths, 576 ** -0.5, outs[k]) for k in KERNELS)
        records.append(dict(workload=w.name, us=us, rounds=times, rel_diff=diff, rel_err=err))
        print(f"CALL {w.name:36} shipped {us['shipped']:6.1f} heads {us['heads']:6.1f} heads2 "
              f"{us['heads2']:6.1f} x{us['shipped'] / min(us['heads'], us['heads2']):.3f} "
              f"diff {diff:.1e} err {err:.1e}", flush=True)
    return records


def main(path):
    record = dict(header=header(), alone=alone())
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    record["in_call"] = in_call()
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
