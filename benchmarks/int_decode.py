"""The SM80/86 e4m3 decoder timed on an SM90 GPU: the integer decoding the sm80 and sm86 tiles
run below SM89, before and after the bit-moving decoder on words (kernels/common.e4m3_to_f16,
e4m3_words_to_f16), with the hardware conversion on the same tiles as the floor.

Each setting runs in a process of its own (the decoder is chosen before anything compiles):
``old`` puts the previous decoder (rebuilt fp32 exponent, subnormals selected; and the tiles
without rows_ahead loading bytes, not words; copied here as the A/B's baseline) in place of the
shipped one, ``new`` runs the shipped one. Both run the tiles at ``fp8_cvt`` 0 (integer
decoding) and 1 (the hardware conversion: the floor, and in ``old`` the byte loads the tiles
without rows_ahead had there). The settings alternate for ``--rounds`` rounds. Each tile runs
under sm90's split rule with the SM count of the GPU, on fp8_ds_mla decode over a 1M-row cache
(tiles of at most 16 heads on 16 heads, of 32 and 64 on 64). The integer-decoded output is
compared with the same tile's hardware-converted one: both decoders are exact and the scales'
unit is a power of two, so they should agree to the bit (with fp16 operands, for scales above
fp16's subnormals). Prints one line per timing and a table of means at the end.

Usage: python benchmarks/int_decode.py OUT.jsonl [--rounds 2] [--workloads "128,16,fp8_ds_mla;..."]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import triton
import triton.language as tl

from triton_sparse_mla.kernels import common

ROUNDS = 2
WORKLOADS = ["128,16,fp8_ds_mla", "128,64,fp8_ds_mla", "32,16,fp8_ds_mla"]


def tiles():
    from triton_sparse_mla import configs

    C = configs.TileConfig
    return [("sm80 16x32", C(16, 32, 4, 2)), ("sm80 16x32 fp8_f16", C(16, 32, 4, 2, fp8_f16=True)),
            ("sm80 32x32", C(32, 32, 4, 2)), ("sm80 32x32 fp8_f16", C(32, 32, 4, 2, fp8_f16=True)),
            ("sm80 64x32 w8", C(64, 32, 8, 2)), ("sm80 64x32 w8 fp8_f16", C(64, 32, 8, 2, fp8_f16=True)),
            ("sm86 16x32 rows_ahead", C(16, 32, 4, 2, fp8_f16=True, rows_ahead=True)),
            ("sm86 32x32 rows_ahead", C(32, 32, 4, 2, fp8_f16=True, rows_ahead=True))]


# --- the decoder before the bit-moving one (the baseline of this A/B) ---------------------
# Integer decoding only; the hardware conversion stays the shipped one (``_hw``).

_hw = common.e4m3_words_to_f16


@triton.jit
def _old_f32(b_raw, FP8_CVT: tl.constexpr):
    if FP8_CVT != 0:
        return b_raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    x = b_raw.to(tl.int32)
    mag = x & 0x7F
    normal = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    subnormal = (mag & 7).to(tl.float32) * 0.001953125
    v = tl.where((mag >> 3) == 0, subnormal, normal)
    return tl.where(x >= 128, -v, v)


@triton.jit
def _old_f16(b_raw, FP8_CVT: tl.constexpr):
    if FP8_CVT != 0:
        return b_raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return _old_f32(b_raw, FP8_CVT).to(tl.float16)


@triton.jit
def _old_words(b_w, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr, EXACT: tl.constexpr = True):
    if FP8_CVT != 0:
        return _hw(b_w, FP8_CVT, INTERPRET)
    b_0 = _old_f16((b_w & 0xFF).to(tl.uint8), 0)
    b_1 = _old_f16(((b_w >> 8) & 0xFF).to(tl.uint8), 0)
    b_2 = _old_f16(((b_w >> 16) & 0xFF).to(tl.uint8), 0)
    b_3 = _old_f16(((b_w >> 24) & 0xFF).to(tl.uint8), 0)
    b_v = tl.join(tl.join(b_0, b_2), tl.join(b_1, b_3))
    return tl.reshape(b_v, [b_w.shape[0], 4 * b_w.shape[1]])


@triton.jit
def _old_unit(b_c, FP8_CVT: tl.constexpr):
    return b_c


@triton.jit
def _old_load_latent_tile(p_row, m_n, J: tl.constexpr, FP8: tl.constexpr, FP8_CVT: tl.constexpr,
                          DTYPE: tl.constexpr, PIN: tl.constexpr, F16: tl.constexpr,
                          INTERPRET: tl.constexpr):
    # the tiles without rows_ahead loaded the latent bytes as bytes
    o_c = J * common.LATENT_TILE + tl.arange(0, common.LATENT_TILE)
    b_raw = tl.load(p_row[:, None] + o_c[None, :], mask=m_n[:, None], other=0)
    if FP8:
        p_scale = (p_row + common.FP8_SCALE_BYTE).to(tl.pointer_type(tl.float32)) + J
        b_c = tl.load(p_scale, mask=m_n, other=0.0)
        if F16:
            b_v = _old_f16(b_raw, FP8_CVT)
        else:
            b_v = _old_f32(b_raw, FP8_CVT)
        b_k = common.scale_tile(b_v, b_c, DTYPE, PIN, F16)
    else:
        b_k = b_raw
    return b_k


def use_old_decoder():
    """Put the old decoder, and the old byte loads of the tiles without rows_ahead, where the
    kernels look them up (before any kernel compiles)."""
    from triton_sparse_mla.kernels import attention, dedup

    common.e4m3_words_to_f16, common.e4m3_unit = _old_words, _old_unit
    attention.load_latent_tile = dedup.load_latent_tile = _old_load_latent_tile


def child(path, setting, workloads):
    import torch

    from triton_sparse_mla.bench import Caches, Workload, make_inputs

    if setting == "old":
        use_old_decoder()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sweep import time_plan

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    with open(path, "a") as f:
        for spec in workloads:
            w = Workload.from_spec(spec)
            inputs = make_inputs(w, caches)
            for name, tile in tiles():
                if (tile.block_h > 16) != (w.h >= 64):
                    continue
                outs = {}
                for level in (0, 1):
                    out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
                    splits, us, meta = time_plan(inputs, out, tile, level, True, sms, pin=True)
                    outs[level] = out.float()
                    diff = None
                    if level == 1:
                        diff = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()
                    rec = dict(setting=setting, decoder=f"{setting}/{'int' if level == 0 else 'hw'}",
                               workload=w.name, tile=name, splits=splits, us=us, rel_diff_int_hw=diff,
                               triton=triton.__version__, torch=torch.__version__, **meta)
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    print(f"INTDEC {rec['decoder']:8} {w.name:28} {name:24} {us:8.1f} us"
                          + (f"  int vs hw {diff:.1e}" if diff is not None else ""), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--workloads", default=";".join(WORKLOADS),
                    help="T,H,FORMAT specs separated by ';' (default: %(default)s)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    workloads = args.workloads.split(";")
    if args.child is not None:
        return child(args.out, args.child, workloads)
    for _ in range(args.rounds):
        for setting in ("old", "new"):
            subprocess.run([sys.executable, os.path.abspath(__file__), args.out, "--child", setting,
                            "--workloads", args.workloads], check=True)
    recs = [json.loads(line) for line in open(args.out)]
    groups = {}
    for r in recs:
        groups.setdefault((r["workload"], r["tile"]), {}).setdefault(r["decoder"], []).append(r["us"])
    print(f"{'workload':28} {'tile':24} {'old int':>8} {'new int':>8} {'old hw':>8} {'new hw':>8} "
          f"{'int old/new':>11} {'new int/hw':>10} {'hw old/new':>10}")
    for (wl, tile), d in groups.items():
        m = {k: statistics.mean(v) for k, v in d.items()}
        oi, ni, oh, nh = (m.get(k, float("nan")) for k in ("old/int", "new/int", "old/hw", "new/hw"))
        print(f"{wl:28} {tile:24} {oi:8.1f} {ni:8.1f} {oh:8.1f} {nh:8.1f} {oi / ni:11.2f} "
              f"{ni / nh:10.2f} {oh / nh:10.2f}")


if __name__ == "__main__":
    main()
