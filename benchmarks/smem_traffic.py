"""Shared-memory traffic of the main loop, counted in the SASS (no GPU needed).

Compiles the sm90 decode tiles named below (final output, rope), takes the loop body (the
longest backward branch in ``nvdisasm`` output) and counts per warp and step its shared-memory
instructions with their bytes: ``LDGSTS`` (cp.async into shared memory), ``LDS``/``STS`` (plain
loads and stores) and ``LDSM`` (ldmatrix; 128 bytes per 8x8 matrix). Prints the bytes per
program and step and per gathered row. Uses the ``nvdisasm`` that ships with Triton.

Usage: python benchmarks/smem_traffic.py   (outside TRITON_INTERPRET)
"""

import collections
import os
import re
import subprocess
import tempfile

import triton

from triton_sparse_mla import configs, portability

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}
TILES = [
    ("fp8 16x32 w4 s3 fp8_f16 (sm90 decode)", configs.TileConfig(16, 32, 4, 3, fp8_f16=True), True),
    ("fp8 16x32 w4 s3 (no fp8_f16)", configs.TileConfig(16, 32, 4, 3), True),
    ("fp8 16x32 w8 s3 fp8_f16", configs.TileConfig(16, 32, 8, 3, fp8_f16=True), True),
    ("bf16 16x64 w4 s3 (sm90 decode)", configs.TileConfig(16, 64, 4, 3), False),
]


def loop_body(compiled):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", f.name], capture_output=True,
                          text=True, check=True).stdout
    os.unlink(f.name)
    labels, insts = {}, []
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(insts)
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            insts.append(m.group(2))
    best = (0, 0, 0)
    for i, ins in enumerate(insts):
        m = re.search(r"BRA\s+(?:`\()?(\.L_x_\d+)", ins)
        if m and m.group(1) in labels and labels[m.group(1)] < i and i - labels[m.group(1)] > best[0]:
            best = (i - labels[m.group(1)], labels[m.group(1)], i)
    return insts[best[1]:best[2] + 1]


def smem_op(ins):
    """``(kind, bytes per warp)`` of a shared-memory instruction, else ``(None, 0)``."""
    op = ins.split()[1] if ins.startswith("@") else ins.split()[0]
    parts = op.split(".")
    if parts[0] in ("LDS", "STS", "LDGSTS"):
        return parts[0], 32 * next((WIDTH[p] for p in parts[1:] if p in WIDTH), 4)
    if parts[0] == "LDSM":
        return "LDSM", 128 * (4 if ".4" in op else 2 if ".2" in op else 1)
    return None, 0


def main():
    for name, tile, fp8 in TILES:
        variant = next(v for v in portability._main_kernel_variants(tile, 90, fp8, "sm90")
                       if "partial=0" in v[0] and "d_pe=64" in v[0])
        _, kernel, types, cx, div, warps, stages = variant
        body = loop_body(portability._compile(kernel, types, cx, div, 90, warps, stages))
        count, nbytes = collections.Counter(), collections.Counter()
        for ins in body:
            kind, n = smem_op(ins)
            if kind:
                count[kind] += 1
                nbytes[kind] += n * warps
        total = sum(nbytes.values())
        print(f"{name}: {len(body)} instructions per warp and step; shared-memory instructions "
              f"per warp {dict(count)}; bytes per program and step {dict(nbytes)}, total {total} "
              f"= {total / tile.block_n:.0f} per gathered row")


if __name__ == "__main__":
    main()
