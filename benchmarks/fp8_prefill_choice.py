"""fp8_ds_mla prefill: convert inside the kernel (shipped) or gather-and-upconvert into a workspace?

Per workload (T=4096, K=2048, H in {8, 16, 64, 128}, caches of 32K and 1M rows):

* in-kernel: ``sparse_mla_attention`` on the fp8 cache, the shipped path.
* workspace, in chunks of C tokens: gather the chunk's C x K rows, dequantize them to bf16 into a
  ``[C x K, 576]`` workspace (C x K x 1152 bytes), then run the bf16 kernel over it with indices
  ``t K + j``. The upconvert pass is charged at its ideal cost, its bytes (656 read + 1152
  written per row) at the copy bandwidth measured in this run, so the comparison is as
  favourable to the workspace as it can be; the bf16 kernel over the workspace is timed (on
  random workspace values: only the time is compared). Both scaled to T tokens.

Usage (GPU): python benchmarks/fp8_prefill_choice.py OUT.json
"""

import json
import sys

import torch

from triton_sparse_mla import sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, make_inputs, measure_ceilings, time_us
from triton_sparse_mla.formats import FP8_ROW_BYTES

T, K = 4096, 2048
CHUNKS = (256, 1024)


def main(path):
    ceilings = measure_ceilings()
    caches = Caches()
    scale = 576 ** -0.5
    records = []
    for n_rows in (32768, 1 << 20):
        for h in (8, 16, 64, 128):
            w = Workload("prefill", T, h, "fp8_ds_mla", n_rows=n_rows)
            q, kv, idx, _ = make_inputs(w, caches)
            in_kernel = time_us(lambda: sparse_mla_attention(q, kv, idx, scale))
            rec = dict(workload=w.name, in_kernel_us=in_kernel)
            for chunk in CHUNKS:
                ws = torch.randn(chunk * K, 576, device="cuda", dtype=torch.bfloat16)
                ws_idx = torch.arange(chunk * K, device="cuda", dtype=torch.int32).view(chunk, K)
                kernel = time_us(lambda: sparse_mla_attention(q[:chunk], ws, ws_idx, scale)) * T / chunk
                upconvert = T * K * (FP8_ROW_BYTES + 1152) / ceilings["copy_GBps"] / 1e3
                rec[f"workspace_C{chunk}"] = dict(
                    bf16_kernel_us=kernel, upconvert_ideal_us=upconvert, total_us=kernel + upconvert,
                    workspace_MB=chunk * K * 1152 / 1e6)
            best = min(rec[f"workspace_C{c}"]["total_us"] for c in CHUNKS)
            print(f"CHOICE {w.name:38} in-kernel {in_kernel:9.1f} us   workspace (ideal upconvert) "
                  f"{best:9.1f} us   -> {'in-kernel' if in_kernel <= best else 'workspace'}", flush=True)
            records.append(rec)
    with open(path, "w") as f:
        json.dump(dict(ceilings=ceilings, results=records), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
