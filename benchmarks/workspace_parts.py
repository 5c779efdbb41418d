"""Where the fp8 workspace's build time goes: each pass timed alone on the device, and the host
time of a whole build.

Per workload (fp8_ds_mla, K=2048, 32K and 1M rows): ``zeros`` (the marks), ``mark``, ``cumsum``,
``remap``, ``upconvert`` (and ``upconvert_ids``, every row at its own id, where the slots are
the cache's rows) as device time (triton.testing.do_bench, median), then ``build`` queued (as
the choice script times it; it keeps the rows' ids where workspace.ENTRY_BYTES says so) and
``host``: the host's time per build() call with the device never waited on (perf_counter over
20 calls, before the final synchronize).

Usage (GPU): python benchmarks/workspace_parts.py OUT.json
"""

import json
import sys
import time

import torch
import triton

from triton_sparse_mla import workspace
from triton_sparse_mla.bench import Caches, Workload, header, make_inputs, time_us
from triton_sparse_mla.configs import device_traits
from triton_sparse_mla.kernels.dedup import mark_rows_kernel, remap_kernel, upconvert_kernel


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def main(path):
    caches = Caches()
    fp8_cvt = device_traits(torch.cuda.current_device())[2]
    records = []
    for t, n_rows in ((512, 32768), (4096, 32768), (4096, 1 << 20)):
        w = Workload("prefill", t, 16, "fp8_ds_mla", n_rows=n_rows)
        _, kv, idx, _ = make_inputs(w, caches)
        k = idx.shape[1]
        common = dict(idx_ptr=idx, len_ptr=None, n_rows=n_rows, topk=k, stride_idx_t=idx.stride(0),
                      HAS_LEN=False, BLOCK_K=workspace._BLOCK_K)
        grid = (t, triton.cdiv(k, workspace._BLOCK_K))
        mark = torch.zeros(n_rows, dtype=torch.int32, device="cuda")
        rec = dict(workload=w.name)
        rec["zeros_us"] = bench(lambda: torch.zeros(n_rows, dtype=torch.int32, device="cuda"))
        rec["mark_us"] = bench(lambda: mark_rows_kernel[grid](mark_ptr=mark, t_first=0, **common))
        pos = torch.cumsum(mark, 0, dtype=torch.int32)
        rec["cumsum_us"] = bench(lambda: torch.cumsum(mark, 0, dtype=torch.int32))
        new = torch.empty_like(idx)
        ws = torch.empty(min(n_rows, t * k), 576, dtype=torch.bfloat16, device="cuda")
        rec["remap_us"] = bench(lambda: remap_kernel[grid](pos_ptr=pos, new_idx_ptr=new,
                                                           n_slots=ws.shape[0],
                                                           stride_new_t=new.stride(0), **common))

        def upconvert(marks):
            upconvert_kernel[(triton.cdiv(n_rows, workspace._BLOCK_R),)](
                kv_ptr=kv, pos_ptr=marks, ws_ptr=ws, n_rows=n_rows, n_slots=ws.shape[0],
                stride_kv=kv.stride(0), stride_ws=ws.stride(0), FP8_CVT=fp8_cvt, D_PE=64,
                BLOCK_R=workspace._BLOCK_R, INTERPRET=False)

        rec["upconvert_us"] = bench(lambda: upconvert(pos))
        if ws.shape[0] == n_rows:  # every row at its own id (workspace.ENTRY_BYTES)
            rec["upconvert_ids_us"] = bench(lambda: upconvert(None))
        rec["build_queued_us"] = time_us(lambda: workspace.build(kv, idx, None, fp8_cvt, force=True),
                                         graph=False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            workspace.build(kv, idx, None, fp8_cvt, force=True)
        rec["host_us"] = (time.perf_counter() - start) / 20 * 1e6
        torch.cuda.synchronize()
        records.append(rec)
        print("PARTS " + " ".join(f"{k_}={v:.1f}" if isinstance(v, float) else f"{v}"
                                  for k_, v in rec.items()), flush=True)
    with open(path, "w") as f:
        json.dump(dict(header=header(), records=records), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
