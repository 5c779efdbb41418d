"""fp8_ds_mla prefill: convert inside the kernel, or through the workspace of distinct rows?

Times, per workload, eagerly (as prefill runs), in one run:

* ``in_kernel``: ``sparse_mla_attention(..., fp8_workspace=False)``.
* ``workspace``: ``fp8_workspace=True`` (triton_sparse_mla.workspace; the whole call: marking,
  prefix sum, remap, upconvert, then the bf16 kernel; or, where the rows keep their ids
  (``ids_kept``, workspace.ENTRY_BYTES), the upconvert of every row, then the bf16 kernel) with
  min(N, T x K) slots, known from the shapes (``SHAPE_MAX_BYTES`` raised to ``MAX_BYTES`` for
  it); its parts ``build`` alone and ``bf16_kernel`` over the built workspace; and where the ids
  were kept, ``remapped``: the same call with the rows found and remapped instead.
* ``counted``: the same with the distinct rows counted and the count read on the host (the path
  of a cache too large for the shape bound, as vLLM's), and its ``build`` alone.
* ``auto``: ``fp8_workspace=None``, what the shipped rule does (and the bench times).
* ``bounded``: the same with ``rows_bound``, the rows the tokens can name (the cache's or its
  window's), as the vLLM plugin passes its requests' context lengths summed.

Workloads: K=2048; prefill T=4096 with H in {8, 16, 32, 64, 128} over caches of 32K and 1M rows
(the bench's inputs); "ctx64K": a 1M-row cache whose tokens all read inside one 64K-row window
(one long request, as in vLLM); T=16384 over 32K rows with H in {8, 16, 32, 64} and the 64K
window with 32 and 128 heads (the reuse thresholds, workspace.MIN_REUSE_GLUON); T=512 and 1024
(H=16, 32K rows) to place the token threshold, and T=1024 with 8, 32, 64 and 128 heads. Each
workload also reports the two paths' relative difference and the workspace's error against the
float64 reference. ``--rows N`` keeps only the workloads over caches of N rows.

``--shardq`` times instead the calls vLLM 0.34's ShardQ makes under tensor parallelism: a
prefill step's tokens split over the ranks, every rank's heads in each call, so T=512 and
2048 tokens with 64 and 128 heads (a 4096- or 16384-token step at TP8), over 32K rows and in
the 64K-row window; they place ``workspace.MIN_TOKENS`` (1024, measured at 16 heads) for
64-128 heads.

Each path is heated (``bench.heat``, 1 s) before it is timed. ``--heads H[,H]`` keeps only the
workloads with those head counts.

Usage (GPU): python benchmarks/fp8_prefill_choice.py OUT.json [--heads H[,H]] [--rows N]
[--shardq]
"""

import json
import sys

import torch

from triton_sparse_mla import sparse_mla_attention, workspace
from triton_sparse_mla.bench import (Caches, Workload, header, heat, make_inputs, reference_error,
                                     time_us)
from triton_sparse_mla.configs import device_traits


def workloads(shardq=False):
    if shardq:
        for t in (512, 2048):
            for h in (64, 128):
                yield Workload("prefill", t, h, "fp8_ds_mla", n_rows=32768), None
                yield Workload("prefill", t, h, "fp8_ds_mla", n_rows=1 << 20), 65536
        return
    for n_rows in (32768, 1 << 20):
        for h in (8, 16, 32, 64, 128):
            yield Workload("prefill", 4096, h, "fp8_ds_mla", n_rows=n_rows), None
    for h in (8, 16, 64):
        yield Workload("prefill", 4096, h, "fp8_ds_mla", n_rows=1 << 20), 65536
    for h in (8, 16, 32, 64):
        yield Workload("prefill", 16384, h, "fp8_ds_mla", n_rows=32768), None
    for h in (32, 128):
        yield Workload("prefill", 4096, h, "fp8_ds_mla", n_rows=1 << 20), 65536
    for t in (512, 1024):
        yield Workload("prefill", t, 16, "fp8_ds_mla", n_rows=32768), None
    for h in (8, 32, 64, 128):  # reuse 64: where the rows kept at their ids start to pay
        yield Workload("prefill", 1024, h, "fp8_ds_mla", n_rows=32768), None


def _heated_us(fn):
    heat(fn, 1.0)
    return time_us(fn, graph=False)


def main(path, heads=None, rows=None, shardq=False):
    caches = Caches()
    scale = 576 ** -0.5
    fp8_cvt = device_traits(torch.cuda.current_device())[2]
    records = []
    for w, window in workloads(shardq):
        if (heads and w.h not in heads) or (rows and w.n_rows != rows):
            continue
        q, kv, idx, lengths = make_inputs(w, caches)
        if window is not None:
            idx = (idx % window).contiguous()
        name = w.name + (f" ctx{window // 1024}K" if window else "")
        def call(mode):
            return lambda: sparse_mla_attention(q, kv, idx, scale, fp8_workspace=mode)

        def build():
            return workspace.build(kv, idx, None, fp8_cvt, force=True)

        in_kernel = _heated_us(call(False))
        auto = _heated_us(call(None))
        named = window or w.n_rows  # the rows the tokens can name
        bounded = _heated_us(lambda: sparse_mla_attention(q, kv, idx, scale, rows_bound=named))
        shipped = workspace.SHAPE_MAX_BYTES
        workspace.SHAPE_MAX_BYTES = workspace.MAX_BYTES  # slots from the shapes where they fit
        ws_us = _heated_us(call(True))
        build_us = time_us(build, graph=False)
        ws, ws_idx = build()
        ids_kept = ws_idx is idx
        kernel_us = _heated_us(lambda: sparse_mla_attention(q, ws, ws_idx, scale))
        entry_bytes = workspace.ENTRY_BYTES
        workspace.ENTRY_BYTES = 0  # the distinct rows found and the indices remapped
        remapped_us = _heated_us(call(True)) if ids_kept else ws_us
        workspace.ENTRY_BYTES = entry_bytes
        workspace.SHAPE_MAX_BYTES = 0  # rows always counted
        counted_us = _heated_us(call(True))
        counted_build_us = time_us(build, graph=False)
        distinct = build()[0].shape[0]
        workspace.SHAPE_MAX_BYTES = shipped
        a = call(False)()
        b = call(True)()
        diff = ((a.float() - b.float()).norm() / a.float().norm()).item()
        rel_err = reference_error(q, kv, idx, lengths, scale, b)
        rec = dict(workload=name, in_kernel_us=in_kernel, auto_us=auto, bounded_us=bounded,
                   rows_bound=named, workspace_us=ws_us,
                   build_us=build_us, bf16_kernel_us=kernel_us, ids_kept=ids_kept,
                   remapped_us=remapped_us, counted_us=counted_us,
                   counted_build_us=counted_build_us, slots=ws.shape[0], distinct_rows=distinct,
                   reuse=w.t * w.k / distinct, workspace_MB=ws.numel() * 2 / 1e6,
                   paths_rel_diff=diff, workspace_rel_err=rel_err)
        records.append(rec)
        print(f"CHOICE {name:44} in-kernel {in_kernel:8.1f} auto {auto:8.1f} bounded {bounded:8.1f} "
              f"| ws {ws_us:8.1f} "
              f"(build {build_us:6.1f} + bf16 {kernel_us:8.1f}{' ids' if ids_kept else ''}) "
              f"x{in_kernel / ws_us:4.2f} remapped {remapped_us:8.1f} | counted "
              f"{counted_us:8.1f} (build {counted_build_us:6.1f}) | rows {distinct:7d} "
              f"reuse {rec['reuse']:6.1f} diff {diff:.1e} err {rel_err:.1e}", flush=True)
    with open(path, "w") as f:
        json.dump(dict(header=header(), records=records,
                       shipped=dict(MIN_TOKENS=workspace.MIN_TOKENS, MIN_REUSE=workspace.MIN_REUSE,
                                    ENTRY_BYTES=workspace.ENTRY_BYTES,
                                    MIN_REUSE_GLUON=workspace.MIN_REUSE_GLUON,
                                    MAX_BYTES=workspace.MAX_BYTES,
                                    SHAPE_MAX_BYTES=workspace.SHAPE_MAX_BYTES)), f, indent=1)


if __name__ == "__main__":
    only = sys.argv[sys.argv.index("--heads") + 1] if "--heads" in sys.argv else ""
    n_rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else None
    main(sys.argv[1], {int(h) for h in only.split(",") if h}, n_rows, "--shardq" in sys.argv)
