"""EXPERIMENT (temporary; with $TSM_ONE_TILE, kernels/gluon_sm90.ONE_TILE, the plain producer
keeps one tile in flight): the few-head consumers' step with one part removed
(kernels/gluon_narrow.ABLATE, from $TSM_NARROW_ABLATE; timing only, the outputs are wrong when
set). One process per setting; prints ``ABL a=<setting> <workload> <us>`` and appends JSON."""

import json
import os
import sys

import torch

from triton_sparse_mla import configs
from triton_sparse_mla.bench import Caches, Workload, heat, make_inputs
from triton_sparse_mla.kernels import gluon_narrow, gluon_sm90

sys.path.insert(0, os.path.dirname(__file__))
from sweep import plan_call, time_plan  # noqa: E402

WORKLOADS = [Workload("prefill", 4096, 16, "bf16", n_rows=32768), Workload("prefill", 4096, 8, "bf16", n_rows=32768),
             ]


def main(path):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches, records = Caches(), []
    for w in WORKLOADS:
        fp8 = w.fmt == "fp8_ds_mla"
        tile = configs.plan_launch("sm90", sms, 1, t_count=w.t, h_count=w.h, topk=2048, fp8=fp8).tile
        inputs = make_inputs(w, caches)
        out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
        pin = configs.pin_fp8_conversion("sm90", tile.block_h)
        if w.phase == "prefill":
            heat(plan_call(inputs, out, tile, 1, fp8, sms, pin)[1], 1.0)
        splits, us, meta = time_plan(inputs, out, tile, 1, fp8, sms, pin=pin)
        rec = dict(ablate=int(gluon_narrow.ABLATE), one_tile=int(gluon_sm90.ONE_TILE), workload=w.name, tile=str(tile), splits=splits, us=us, **meta)
        records.append(rec)
        print(f"THR one_tile={rec['one_tile']} a={rec['ablate']} {w.name:36} {us:9.1f} us {meta}", flush=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
