"""Instructions in the main loop of the sm80 and sm86 fp8_ds_mla tiles, counted in the SASS (no
GPU needed): what the e4m3 decoding costs where it is done with integer operations.

Compiles each tile (final output, rope) for its target, takes the loop body
(:func:`smem_traffic.loop_body`) and prints per warp and step its instruction count, per
gathered row the warp instructions of the program, and the most frequent opcodes. The sm86
tiles are also compiled for sm89, where the hardware converts e4m3, as the floor. With
``--old-decoder`` the integer decoding is the one before the bit-moving decoder
(:func:`int_decode.use_old_decoder`).

Usage: python benchmarks/sass_count.py [--old-decoder]   (outside TRITON_INTERPRET)
"""

import collections
import os
import sys

import triton

from triton_sparse_mla import configs, portability

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smem_traffic import loop_body  # noqa: E402

C = configs.TileConfig
ROWS = [
    ("sm80", 80, C(16, 32, 4, 2)), ("sm80", 80, C(16, 32, 4, 2, fp8_f16=True)),
    ("sm80", 80, C(32, 32, 4, 2)), ("sm80", 80, C(64, 32, 8, 2)),
    ("sm86", 86, C(16, 32, 4, 2, fp8_f16=True, rows_ahead=True)),
    ("sm86", 86, C(32, 32, 4, 2, fp8_f16=True, rows_ahead=True)),
    ("sm86", 89, C(16, 32, 4, 2, fp8_f16=True, rows_ahead=True)),
    ("sm86", 89, C(32, 32, 4, 2, fp8_f16=True, rows_ahead=True)),
]


def main():
    if "--old-decoder" in sys.argv[1:]:
        from int_decode import use_old_decoder

        use_old_decoder()
    print(f"Triton {triton.__version__}{' (old decoder)' if '--old-decoder' in sys.argv[1:] else ''}")
    for family, cap, tile in ROWS:
        variant = next(v for v in portability._main_kernel_variants(tile, cap, True, family)
                       if "partial=0" in v[0] and "d_pe=64" in v[0])
        _, kernel, types, cx, div, warps, stages = variant
        body = loop_body(portability._compile(kernel, types, cx, div, cap, warps, stages))
        ops = collections.Counter((i.split()[1] if i.startswith("@") else i.split()[0]).split(".")[0]
                                  for i in body)
        flags = "".join(f" {f}" for f in ("fp8_f16", "rows_ahead") if getattr(tile, f))
        print(f"sm_{cap} {tile.block_h}x{tile.block_n} w{tile.num_warps}{flags}: {len(body)} per warp "
              f"and step, {len(body) * warps / tile.block_n:.0f} per row | "
              + ", ".join(f"{k} {n}" for k, n in ops.most_common(6)))


if __name__ == "__main__":
    main()
