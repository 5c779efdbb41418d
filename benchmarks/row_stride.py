"""Does the fp8_ds_mla rows' alignment cost the copies? The shipped sm90 plan timed over the
same rows stored at three row strides: 656 bytes (vLLM's layout: a row starts 16 bytes past a
32-byte sector every other row, and at 16 x (id mod 8) bytes into a 128-byte line), 672 (every
row sector-aligned, not line-aligned) and 768 (every row line-aligned). The bytes gathered are
the same; only their alignment changes. Each stride twice, alternating; every output is
compared with the first's (same values: they must agree exactly).

With ``--toggle FIELD`` (a boolean ``TileConfig`` field), the workloads of fewer than 64 heads
at strides 656 and 768, each with the field off and on (for a switch that moves only where
bytes go, the outputs agree exactly; the printed diff says whether they do).

Usage (on the GPU): python3 benchmarks/row_stride.py OUT.json [--toggle FIELD]
"""

import dataclasses
import json
import sys

import torch

from sweep import time_against_first
from triton_sparse_mla import configs
from triton_sparse_mla.bench import Caches, Workload, make_inputs

WORKLOADS = [Workload("decode", 128, 16, "fp8_ds_mla"), Workload("decode", 128, 8, "fp8_ds_mla"),
             Workload("decode", 512, 16, "fp8_ds_mla"), Workload("decode", 128, 64, "fp8_ds_mla"),
             Workload("decode", 128, 128, "fp8_ds_mla")]
STRIDES = (656, 672, 768)


def strided(kv, stride):
    """``kv`` ([rows, 656] uint8) copied into rows of ``stride`` bytes, as a [rows, 656] view."""
    if stride == kv.stride(0):
        return kv
    wide = torch.zeros(kv.shape[0], stride, dtype=kv.dtype, device=kv.device)
    wide[:, :kv.shape[1]] = kv
    return wide[:, :kv.shape[1]]


def main(path, field=None):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in WORKLOADS if field is None else [w for w in WORKLOADS if w.h < 64]:
        shipped = configs.plan_launch("sm90", sms, 1, t_count=w.t, h_count=w.h, topk=2048, fp8=True).tile
        variants = ([(None, shipped)] if field is None else
                    [(on, dataclasses.replace(shipped, **{field: on})) for on in (False, True)])
        q, kv, idx, lengths = make_inputs(w, caches)
        first = []
        for _ in range(2):
            for stride in STRIDES if field is None else (656, 768):
                view = strided(kv, stride)
                for on, tile in variants:
                    rec, _ = time_against_first((q, view, idx, lengths), w, tile, True, sms, first)
                    records.append(dict(rec, row_stride=stride, **({} if on is None else {field: on})))
                    print(f"STRIDE {w.name:36} {tile.block_h}x{tile.block_n} stride={stride} "
                          f"{'' if on is None else f'{field}={int(on)} '}"
                          f"{rec['us']:8.1f} us diff={rec['rel_diff']:.1e}", flush=True)
                del view
                torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[sys.argv.index("--toggle") + 1] if "--toggle" in sys.argv else None)
