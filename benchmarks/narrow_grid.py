"""Where the few-head fp8_ds_mla tile's time goes outside its steady state (GPU).

Times the shipped sm90 plan at T = 120, 128 and 132 tokens (128 programs leave 4 of the H200's
132 SMs idle; 132 fill them) and at top-k 2048 and 1024 (the difference is the steady state of
16 steps; what is left of 32 steps is each program's fixed cost: start, first copies, epilogue).
Usage: python benchmarks/narrow_grid.py OUT.json [--heads 8,16]
"""

import json
import sys

import torch

from triton_sparse_mla import configs
from triton_sparse_mla.bench import Caches, Workload, make_inputs

from sweep import time_plan


def main(path, heads=(8, 16)):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for h in heads:
        for t in (120, 128, 132):
            for k in (2048, 1024):
                w = Workload("decode", t, h, "fp8_ds_mla", k=k)
                inputs = make_inputs(w, caches)
                tile = configs.plan_launch("sm90", sms, 1, t_count=t, h_count=h, topk=k, fp8=True).tile
                out = torch.empty(t, h, 512, device="cuda", dtype=torch.bfloat16)
                splits, us, meta = time_plan(inputs, out, tile, 1, True, sms,
                                             pin=configs.pin_fp8_conversion("sm90", tile.block_h))
                records.append(dict(workload=w.name, k=k, tile=str(tile), splits=splits, us=us, **meta))
                print(f"GRID {w.name:36} K={k} splits={splits} {us:8.1f} us", flush=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    heads = (8, 16)
    if "--heads" in args:
        heads = tuple(int(x) for x in args[args.index("--heads") + 1].split(","))
    main(args[0], heads)
