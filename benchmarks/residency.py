"""Time tiles on the H200 at the residency an SM120/SM86 GPU would give them (GPU).

SM120/121 and SM86/89 have 100 KB of shared memory per SM, the H200 228 KB, so a tile that
runs two programs per SM on the H200 may run one on the users' GPUs. Registers per SM are the
same (64K), so only the shared-memory limit differs. This script compiles each tile for sm120
to learn its shared memory there, derives how many programs fit per SM (``R``), and launches
the H200 kernel with its dynamic shared memory padded so that the H200 also fits only ``R``.
Absolute times are the H200's (its bandwidth and SM count); the ranking between tiles at equal
residency is what carries over. Prints a table and writes JSON.

Usage: python benchmarks/residency.py OUT.json [--toggle FIELD | --warps] [--fmt FMT]
(--toggle FIELD: the shipped sm86 tiles with a boolean ``TileConfig`` field off and on, e.g.
``prefetch_idx`` (run 34's "--prefetch"), under the shipped
one-program-per-SM split rule; --warps: the shipped sm86 tiles with their warps and with 8: one
program of 8 warps per SM instead of one of 4.)

Padding: Triton launches a compiled kernel with ``packed_metadata = (num_warps, num_ctas,
shared)``; replacing it changes the dynamic shared memory of every later launch of that cached
kernel, after the function's limit is raised with ``cuFuncSetAttribute``.
"""

import ctypes
import dataclasses
import json
import sys

import torch
from triton_sparse_mla import configs, portability
from triton_sparse_mla.bench import Caches, Workload, make_inputs, time_us
from sweep import plan_call

KB = 1024
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

T = configs.TileConfig
CANDIDATES = {  # per format: the shipped sm86 tile first, then the candidates that fit two
    "bf16": [T(16, 64, 4, 2), T(16, 32, 4, 2), T(16, 16, 4, 2), T(16, 16, 4, 1), T(16, 32, 4, 1)],
    # rows_ahead (rows in registers a step ahead; stages change nothing there): 55 KB (16x32)
    # and 37 KB (16x16) of shared memory compiled for sm120 by Triton 3.6, so 16x16 fits two
    # per SM there; then the staged tiles
    "fp8_ds_mla": [T(16, 32, 4, 2, fp8_f16=True, rows_ahead=True),
                   T(16, 16, 4, 1, fp8_f16=True, rows_ahead=True),
                   T(16, 32, 4, 2, fp8_f16=True), T(16, 16, 4, 2, fp8_f16=True),
                   T(16, 16, 4, 1, fp8_f16=True), T(16, 32, 4, 1, fp8_f16=True)],
}
for _fmt, _first in CANDIDATES.items():  # the comment above holds
    assert _first[0] == configs.pick_tile("sm86", t_count=128, h_count=16, fp8=_fmt != "bf16"), _fmt
WORKLOADS = [Workload("decode", 128, 8, "fp8_ds_mla"), Workload("decode", 128, 16, "fp8_ds_mla"),
             Workload("decode", 32, 16, "fp8_ds_mla"), Workload("decode", 128, 16, "bf16"),
             Workload("decode", 32, 16, "bf16"),
             Workload("prefill", 4096, 16, "fp8_ds_mla", n_rows=32768),
             Workload("prefill", 4096, 16, "bf16", n_rows=32768)]
# --toggle: also the head counts that take the sm86 table's 32-head tile
TOGGLE_WORKLOADS = WORKLOADS + [Workload("decode", 128, 32, "fp8_ds_mla"),
                                Workload("decode", 128, 64, "fp8_ds_mla"),
                                Workload("decode", 128, 64, "bf16"),
                                Workload("prefill", 4096, 64, "fp8_ds_mla", n_rows=32768)]


def sm120_shared(tile, fp8):
    """Shared memory of the tile's main kernel compiled for sm120 (the largest variant)."""
    sizes = []
    for _, kernel, types, cx, div, warps, stages in portability._main_kernel_variants(tile, 120, fp8, "sm86"):
        sizes.append(portability._compile(kernel, types, cx, div, 120, warps, stages).metadata.shared)
    return max(sizes)


def pad_to(kernel, shared):
    """Launch ``kernel`` (a CompiledKernel) from now on with ``shared`` bytes of shared memory."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    rc = libcuda.cuFuncSetAttribute(ctypes.c_void_p(kernel.function),
                                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ctypes.c_int(shared))
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute returned {rc}")
    warps, ctas, _ = kernel.packed_metadata
    kernel.packed_metadata = (warps, ctas, shared)


def main(path, toggle=None, fmt=None, warps=False):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    rules = (2, 1)  # the split rule's residency assumption (PROGRAMS_PER_SM)
    if toggle or warps:
        rules = (configs.PROGRAMS_PER_SM["sm86"],)
    for w in TOGGLE_WORKLOADS if toggle or warps else WORKLOADS:
        if fmt and w.fmt != fmt:
            continue
        fp8 = w.fmt == "fp8_ds_mla"
        inputs = make_inputs(w, caches)
        out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
        shipped = configs.pick_tile("sm86", t_count=w.t, h_count=w.h, fp8=fp8)
        if toggle:  # the tile the shipped sm86 plan gives this workload, the field off and on
            candidates = [dataclasses.replace(shipped, **{toggle: on}) for on in (False, True)]
        elif warps:  # the shipped tile with its warps and with 8
            candidates = [shipped, dataclasses.replace(shipped, num_warps=8)]
        else:
            candidates = CANDIDATES[w.fmt]
        for tile in candidates:
            r120 = configs.fit_by_shared_memory(sm120_shared(tile, fp8), 120)
            for per_sm in rules:
                splits, fn = plan_call(inputs, out, tile, configs.fp8_cvt_level((9, 0)), fp8, sms,
                                       pin=configs.pin_fp8_conversion("sm86", tile.block_h), per_sm=per_sm)
                kernel = fn()
                own = kernel.metadata.shared
                padded = max(own, configs.SMEM_PER_SM_KB[90] * KB // max(r120, 1)
                             - configs.SMEM_RESERVED_PER_BLOCK)
                # guard: at `padded`, the H200 fits exactly as many programs as SM120 would
                assert configs.fit_by_shared_memory(padded, 90) == max(r120, 1) or padded == own
                saved = kernel.packed_metadata
                pad_to(kernel, padded)
                us = time_us(fn)
                kernel.packed_metadata = saved
                rec = dict(workload=w.name, tile=str(tile), sm120_programs_per_sm=r120, split_rule_per_sm=per_sm,
                           splits=splits, shared_h200=own, padded=padded, us=us)
                records.append(rec)
                print(f"RES {w.name:40} {tile.block_h}x{tile.block_n} w{tile.num_warps} s{tile.num_stages} "
                      f"pf={int(tile.prefetch_idx)} ra={int(tile.rows_ahead)} "
                      f"R120={r120} rule={per_sm} splits={splits:3d} pad={padded // KB}KB {us:9.1f} us", flush=True)
                if splits == 1:
                    break  # the other rule gives the same launch
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    arg = lambda name: sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None  # noqa: E731
    main(sys.argv[1], toggle=arg("--toggle"), fmt=arg("--fmt"), warps="--warps" in sys.argv)
