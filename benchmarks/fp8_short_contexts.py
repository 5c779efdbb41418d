"""fp8_ds_mla calls whose tokens have short contexts: does the workspace rule misread them?

``workspace.build`` decides from the entries per distinct row, counting ``T x K`` entries over
the caller's ``rows_bound``. A batch of decode tokens, each of its own request with a context of
``c < K`` rows, names ``T x c`` valid entries over ``T x c`` rows (each row once), yet the rule
reads ``K / c`` entries a row: at 128 heads (``MIN_REUSE_GLUON``'s 8) a batch of 1024 tokens
with contexts of 256 rows passes for reused 8 times. Such batches (vLLM's decode under data-
parallel attention, every head on each rank) take the workspace from ``MIN_TOKENS`` tokens on;
this times whether that loses, and what lowering ``MIN_TOKENS`` to 512 would do there. Since
run 311 (H100: it lost, 1.49x slower at T=1024 H=128 c=256) the plugin also passes
``entries_bound``, here ``T x c``, and the rule reads the reuse over it.

Per workload (T tokens, H heads, contexts of c rows; token i's rows ``i x c .. i x c + c - 1``
of a 1M-row cache, all selected in random order, the rest of its K = 2048 entries -1 and its
``topk_length`` c), each path heated 1 s and timed eagerly:

* ``in_kernel``: ``fp8_workspace=False``;
* ``rows_only``: the shipped rule with ``rows_bound = T x c`` alone (the plugin before
  ``entries_bound``);
* ``auto``: the shipped rule with both bounds, ``entries_bound = T x c`` (the plugin now);
* ``workspace``: ``fp8_workspace=True`` with the same bound (the workspace whatever the rule).

Usage (GPU): python benchmarks/fp8_short_contexts.py OUT.json
"""

import json
import sys

import torch

from triton_sparse_mla import sparse_mla_attention, workspace
from triton_sparse_mla.bench import Caches, header, heat, reference_error, time_us

K = 2048
N_ROWS = 1 << 20
WORKLOADS = [(t, h, c) for t in (512, 1024) for h in (64, 128) for c in (256, 1024)]


def _heated_us(fn):
    heat(fn, 1.0)
    return time_us(fn, graph=False)


def inputs(t, h, c, caches, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(t, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = caches.get("fp8_ds_mla", N_ROWS)
    order = torch.rand(t, c, device="cuda", generator=g).argsort(dim=1)
    rows = torch.arange(t, device="cuda")[:, None] * c + order
    idx = torch.full((t, K), -1, device="cuda", dtype=torch.int32)
    idx[:, :c] = rows.to(torch.int32)
    lengths = torch.full((t,), c, device="cuda", dtype=torch.int32)
    return q, kv, idx, lengths


def main(path):
    caches = Caches()
    scale = 576 ** -0.5
    records = []
    for t, h, c in WORKLOADS:
        q, kv, idx, lengths = inputs(t, h, c, caches)
        bound = t * c

        def call(mode, entries=None, q=q, kv=kv, idx=idx, lengths=lengths, bound=bound):
            return lambda: sparse_mla_attention(q, kv, idx, scale, topk_length=lengths,
                                                fp8_workspace=mode, rows_bound=bound,
                                                entries_bound=entries)

        in_kernel, rows_only, auto, ws = (_heated_us(call(m, e)) for m, e in (
            (False, None), (None, None), (None, bound), (True, None)))
        err = reference_error(q, kv, idx, lengths, scale, call(True)())
        rec = dict(t=t, h=h, context=c, rows_bound=bound, reuse_read=t * K / bound, reuse=1.0,
                   in_kernel_us=in_kernel, rows_only_us=rows_only, auto_us=auto, workspace_us=ws,
                   workspace_rel_err=err)
        records.append(rec)
        print(f"SHORT T={t:5d} H={h:3d} ctx={c:5d} (reuse read {rec['reuse_read']:4.1f}) "
              f"in-kernel {in_kernel:8.1f} rows-only {rows_only:8.1f} auto {auto:8.1f} "
              f"workspace {ws:8.1f} "
              f"x{in_kernel / ws:4.2f} err {err:.1e}", flush=True)
        with open(path, "w") as f:
            json.dump(dict(header=header(), records=records,
                           shipped=dict(MIN_TOKENS=workspace.MIN_TOKENS,
                                        MIN_REUSE_GLUON=workspace.MIN_REUSE_GLUON)), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
