"""Tuning sweep (GPU): time candidate tile configurations and split rules on key workloads.

Prints per workload every candidate's median time (CUDA-graph replay) and the compiled
kernel's registers, spills and shared memory; writes JSON. The winners go into configs.py
with a note of the run. Usage: python benchmarks/sweep.py OUT.json
[--fp8 | --splits | --regs-decode [--tokens T,T] [--rounds N] | --splits-len | --exchange | --apart | --wide | --latency | --warps | --narrow | --toggle FIELD [--fmt FMT] [--heads H,H] [--base FIELD]]
(--fp8: fp8 conversion variants, pinned or not; --splits: the shipped plan under several
split rules; --regs-decode: fp8_regs in decode at 8 and 16 heads under several split rules; --splits-len: the same with random lengths, up to 8 waves; --exchange: 64-head tiles with and without the probabilities through scratch, and
the latency tiles for 64+ heads; --apart: the exchange tile against scores_apart tiles; --wide: 16-warp exchange tiles; --latency: where the latency phase should end;
--warps: 16-head tiles with 8 warps; --narrow: the few-head Gluon fp8 tiles against the shipped ones and FlashMLA; --toggle FIELD:
each workload's shipped tile with a boolean TileConfig field off and on, e.g. prefetch_idx
(run 32's "--prefetch" was this for prefetch_idx).
"""

import dataclasses
import json
import sys

import torch
import triton

from triton_sparse_mla import api, configs
from triton_sparse_mla.bench import Caches, Workload, flashmla_fn, make_inputs, time_us

import replan

T = configs.TileConfig
CANDIDATES = [
    T(16, 32, 4, 2), T(16, 64, 4, 2), T(16, 64, 4, 3), T(16, 128, 4, 2), T(16, 64, 8, 2),
    T(32, 64, 4, 2), T(32, 64, 8, 2), T(64, 32, 8, 2), T(64, 32, 8, 3), T(64, 64, 8, 2),
]
WORKLOADS = [
    Workload("decode", 1, 128, "bf16"), Workload("decode", 1, 8, "fp8_ds_mla"),
    Workload("decode", 1, 64, "fp8_ds_mla"),
    Workload("decode", 128, 8, "bf16"), Workload("decode", 128, 16, "fp8_ds_mla"),
    Workload("decode", 128, 32, "bf16"),
    Workload("decode", 128, 64, "bf16"), Workload("decode", 128, 64, "fp8_ds_mla"),
    Workload("decode", 128, 128, "bf16"), Workload("decode", 128, 128, "fp8_ds_mla"),
    Workload("prefill", 4096, 16, "bf16", n_rows=32768), Workload("prefill", 4096, 64, "bf16", n_rows=32768),
]


# fp8 variants: (tile, fp8_cvt, pin_conversion), re-measured after tiles were dequantized at
# load (the pinned/unpinned and integer-decode comparisons are in the 2026-11-29 runs). A
# workload runs the tiles whose BLOCK_H fits its heads, and only 64-head tiles from 64 heads up.
FP8_VARIANTS = [
    (T(16, 32, 4, 2), 1, True), (T(16, 32, 4, 3), 1, True), (T(16, 64, 4, 2), 1, True),
    (T(32, 32, 4, 2), 1, True), (T(32, 64, 8, 2), 1, True),
    (T(64, 32, 8, 2), 1, False), (T(64, 32, 8, 3), 1, False), (T(64, 64, 8, 2), 1, False),
]
FP8_WORKLOADS = [Workload("decode", 128, 16, "fp8_ds_mla"), Workload("decode", 128, 8, "fp8_ds_mla"),
                 Workload("decode", 32, 16, "fp8_ds_mla"), Workload("decode", 512, 16, "fp8_ds_mla"),
                 Workload("decode", 128, 32, "fp8_ds_mla"), Workload("decode", 32, 64, "fp8_ds_mla"),
                 Workload("decode", 128, 64, "fp8_ds_mla"), Workload("decode", 512, 64, "fp8_ds_mla"),
                 Workload("decode", 128, 128, "fp8_ds_mla"),
                 Workload("prefill", 4096, 16, "fp8_ds_mla", n_rows=32768),
                 Workload("prefill", 4096, 64, "fp8_ds_mla", n_rows=32768),
                 Workload("prefill", 4096, 128, "fp8_ds_mla", n_rows=32768)]


def fp8_variant_applies(tile, h):
    if h >= 64:
        return tile.block_h == 64
    return tile.block_h <= max(16, triton.next_power_of_2(h))


def plan_call(inputs, out, tile, fp8_cvt, fp8, sms, pin=True, per_sm=None):
    """``(splits, fn)``: a call of the kernel with this tile under the shipped split rule for
    ``sms`` SMs holding ``per_sm`` programs each (default: what sm90's rule counts for the tile
    in the call's phase, configs.split_rule); ``fn()`` launches it and returns the compiled main
    kernel."""
    q, kv, idx, lengths = inputs
    t, h = q.shape[0], q.shape[1]
    rule_per_sm, min_tiles = configs.split_rule("sm90", configs.phase_of("sm90", t, h), tile)
    splits = configs.choose_splits(t, triton.cdiv(h, tile.block_h), idx.shape[1], tile.block_n, sms,
                                   per_sm or rule_per_sm, min_tiles)
    plan = configs.LaunchPlan(tile, splits, fp8_cvt=fp8_cvt, pin_conversion=pin)
    return splits, lambda: api._run(q[..., :512], q[..., 512:], kv, idx, lengths, None, 576 ** -0.5,
                                    out, None, family=None, sm_count=None, fp8_cvt=fp8_cvt, fp8=fp8,
                                    plan=plan)


def time_plan(inputs, out, tile, fp8_cvt, fp8, sms, pin=True, per_sm=None):
    """Time one candidate under the split rule; return (splits, us, kernel facts)."""
    splits, fn = plan_call(inputs, out, tile, fp8_cvt, fp8, sms, pin, per_sm)
    try:
        k = fn()
        return splits, time_us(fn), dict(regs=k.n_regs, spills=k.n_spills, smem=k.metadata.shared)
    except Exception as exc:  # noqa: BLE001 - a candidate that fails is recorded
        return splits, float("nan"), dict(error=str(exc)[:200])


def time_against_first(inputs, w, tile, fp8, sms, first, per_sm=None):
    """Time ``tile`` on sm90's pinning and split rule (or ``per_sm`` programs per SM) and
    compare its output with the first variant's of this workload (``first``: an empty list the
    first time, which this fills). Returns the record (with the compiled kernel's facts) and
    those facts."""
    out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
    splits, us, meta = time_plan(inputs, out, tile, 1, fp8, sms,
                                 pin=configs.pin_fp8_conversion("sm90", tile.block_h), per_sm=per_sm)
    if not first:
        first.append(out.float())
    diff = ((out.float() - first[0]).norm() / first[0].norm()).item()
    return dict(workload=w.name, tile=str(tile), splits=splits, us=us, rel_diff=diff, **meta), meta


def flashmla_record(w, inputs, label):
    """FlashMLA timed on the workload's inputs (None where it has no kernel for them): the
    record, after printing it under ``label``."""
    try:
        fm = flashmla_fn(w, *inputs, 576 ** -0.5)
        fm_us = time_us(fm) if fm is not None else None
    except Exception as exc:  # noqa: BLE001 - no baseline for this workload
        print(f"FlashMLA failed: {exc}", flush=True)
        fm_us = None
    print(f"{label} {w.name:36} FlashMLA {fm_us}", flush=True)
    return dict(workload=w.name, tile="FlashMLA", us=fm_us)


def _option(name):
    """The command line's value after ``name``, or None where it is absent."""
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


def _ints(value):
    """``"8,16"`` as ``[8, 16]``; None as None."""
    return [int(v) for v in value.split(",")] if value else None


def main(path):
    if "--fp8" in sys.argv:
        return main_fp8(path)
    if "--splits" in sys.argv:
        return main_splits(path)
    if "--splits-len" in sys.argv:
        return main_splits(path, LEN_SPLIT_WORKLOADS, rules=(1, 2, 4, 8))
    if "--regs-decode" in sys.argv:
        return main_regs_decode(path, rounds=int(_option("--rounds") or 2), tokens=_ints(_option("--tokens")))
    if "--apart" in sys.argv:
        return main_exchange(path, APART_WORKLOADS, APART_TILES, "APART")
    if "--exchange" in sys.argv:
        return main_exchange(path)
    if "--wide" in sys.argv:
        return main_exchange(path, WIDE_WORKLOADS, WIDE_TILES)
    if "--latency" in sys.argv:
        return main_latency(path)
    if "--warps" in sys.argv:
        return main_warps(path)
    if "--narrow" in sys.argv:
        return main_narrow(path, _option("--fmt"))
    if "--toggle" in sys.argv:
        return main_toggle(path, _option("--toggle"), _option("--fmt"), _ints(_option("--heads")), _option("--base"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in WORKLOADS:
        inputs = make_inputs(w, caches)
        out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
        fp8 = w.fmt == "fp8_ds_mla"
        rows = []
        for tile in CANDIDATES:
            if tile.block_h > max(16, triton.next_power_of_2(w.h)):
                continue
            for per_sm in ((1, 2) if w.t == 1 else (1,)):
                splits, us, meta = time_plan(inputs, out, tile, 1, fp8, sms, per_sm=per_sm)
                rows.append(dict(workload=w.name, tile=list(tile.__dict__.values()), per_sm=per_sm,
                                 splits=splits, us=us, **meta))
                print(f"{w.name:36} {tile} per_sm={per_sm} splits={splits:3d} {us:9.1f} us {meta}", flush=True)
        rows.append(flashmla_record(w, inputs, "SWEEP"))
        fm_us = rows[-1]["us"]
        best = min((r for r in rows if r["us"] is not None and r["us"] == r["us"]), key=lambda r: r["us"] if r["tile"] != "FlashMLA" else 1e30, default=None)
        print(f"BEST {w.name:36} {best} FlashMLA {fm_us}", flush=True)
        records += rows
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


def main_fp8(path):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in FP8_WORKLOADS:
        inputs = make_inputs(w, caches)
        out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
        for tile, hw, pin in FP8_VARIANTS:
            if not fp8_variant_applies(tile, w.h):
                continue
            splits, us, meta = time_plan(inputs, out, tile, hw, True, sms, pin=pin)
            records.append(dict(workload=w.name, tile=str(tile), fp8_cvt=hw, pin=pin, splits=splits,
                                us=us, **meta))
            print(f"FP8 {w.name:36} {tile} cvt={hw} pin={int(pin)} splits={splits} {us:8.1f} us {meta}",
                  flush=True)
        records.append(flashmla_record(w, inputs, "FP8"))
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


SPLIT_WORKLOADS = [Workload("decode", 128, 16, "fp8_ds_mla"), Workload("decode", 128, 8, "fp8_ds_mla"),
                   Workload("decode", 32, 16, "fp8_ds_mla"), Workload("decode", 128, 32, "fp8_ds_mla"),
                   Workload("decode", 128, 16, "bf16"), Workload("decode", 128, 32, "bf16"),
                   Workload("decode", 128, 64, "bf16"), Workload("decode", 128, 64, "fp8_ds_mla")]


# --splits-len: with random lengths (vLLM passes topk_length), more splits than one wave let
# programs past their token's length exit at once and the hardware balance the rest, at the
# cost of more partial outputs to combine (docs/performance-plan.md, item 3). Full-length rows
# show that cost.
LEN_SPLIT_WORKLOADS = [Workload("decode", 128, h, fmt, lengths=lengths)
                       for fmt in ("bf16", "fp8_ds_mla") for h in (16, 64, 128)
                       for lengths in ("random", "full")]


def main_splits(path, workloads=SPLIT_WORKLOADS, rules=(1, 2, 3, 4, 6)):
    """The shipped plan (tile tables, pinning) under several split rules (programs per SM,
    whatever the tile, but a tile with ``fp8_regs`` keeps configs.split_rule's one program per
    SM; --regs-decode varies that), with each workload's lengths."""
    caches = Caches()
    records = []
    for w in workloads:
        inputs = make_inputs(w, caches)
        q, kv, idx, lengths = inputs
        out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
        for per_sm in rules:
            fn = lambda: api.sparse_mla_attention((q[..., :512], q[..., 512:]), kv, idx,  # noqa: E731
                                                  576 ** -0.5, topk_length=lengths, out=out)
            with replan.patched(configs, programs_per_sm=lambda family, tile, per_sm=per_sm: per_sm):
                plan = configs.plan_launch(*configs.device_traits(0), t_count=w.t, h_count=w.h,
                                           topk=idx.shape[1], fp8=w.fmt == "fp8_ds_mla")
                us = time_us(fn)
            records.append(dict(workload=w.name, per_sm=per_sm, splits=plan.splits,
                                tile=str(plan.tile), us=us))
            print(f"SPLIT {w.name:36} per_sm={per_sm} splits={plan.splits:3d} {us:8.1f} us {plan.tile}",
                  flush=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


EXCHANGE_WORKLOADS = [
    Workload(phase, t, h, fmt, n_rows=32768 if phase == "prefill" else 1 << 20)
    for fmt in ("bf16", "fp8_ds_mla") for h in (64, 128)
    for phase, t in (("decode", 1), ("decode", 4), ("decode", 32), ("decode", 128),
                     ("decode", 512), ("prefill", 4096))]
# 64-head tiles with and without exchange_p (the first is the table's tile before exchange_p
# was timed), and for the latency phase (T <= 8) the 16-head tiles its tables use.
EXCHANGE_TILES = [T(64, 64, 8, 2), T(64, 64, 8, 2, exchange_p=True), T(64, 32, 8, 2, exchange_p=True)]
LATENCY_TILES = [T(16, 64, 4, 2), T(16, 64, 8, 2), T(16, 32, 4, 2)]


# 64-head exchange tiles with four warpgroups (16 warps): each computes a quarter of the score
# tile and of each output tile; 128 registers per thread, and at 32 rows a third stage fits
# (185 KB, compiled by Triton 3.6). Against the shipped 8-warp tile.
WIDE_WORKLOADS = [Workload("decode", 128, 64, "bf16"), Workload("prefill", 4096, 64, "bf16", n_rows=32768),
                  Workload("decode", 128, 64, "fp8_ds_mla")]
WIDE_TILES = [T(64, 64, 8, 2, exchange_p=True), T(64, 64, 16, 2, exchange_p=True),
              T(64, 32, 16, 3, exchange_p=True)]


# --apart: the shipped 64-head exchange tile against scores_apart tiles (kernels/attention.py,
# SCORES_APART): at 64 rows (224 KB bf16, 193 KB fp8 with Triton 3.6) and at 32 rows, where a
# third stage fits (184 / 153 KB).
APART_WORKLOADS = [w for w in EXCHANGE_WORKLOADS if w.t >= 32]
APART_TILES = [T(64, 64, 8, 2, exchange_p=True), T(64, 64, 8, 2, scores_apart=True),
               T(64, 32, 8, 3, scores_apart=True), T(64, 32, 8, 2, scores_apart=True)]


def main_exchange(path, workloads=None, tiles=None, label="EXCH"):
    """64-head tiles with and without ``exchange_p`` (kernels/attention.py), and the latency
    tiles at T <= 8, each under the shipped split rule; every output is compared with the
    first tile's."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in workloads or EXCHANGE_WORKLOADS:
        inputs = make_inputs(w, caches)
        fp8 = w.fmt == "fp8_ds_mla"
        first = []
        for tile in (tiles or EXCHANGE_TILES + (LATENCY_TILES if w.t <= configs.LATENCY_MAX_TOKENS else [])):
            rec, meta = time_against_first(inputs, w, tile, fp8, sms, first)
            records.append(rec)
            print(f"{label} {w.name:38} {tile.block_h}x{tile.block_n} w{tile.num_warps} s{tile.num_stages} "
                  f"ex={int(tile.exchange_p)} apart={int(tile.scores_apart)} splits={rec['splits']:3d} {rec['us']:9.1f} us "
                  f"diff={rec['rel_diff']:.1e} {meta}", flush=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


LATENCY_WORKLOADS = [Workload("decode", t, h, fmt) for fmt in ("bf16", "fp8_ds_mla")
                     for h in (8, 16, 32, 64, 128) for t in (2, 3, 4, 8)]


def main_latency(path):
    """The shipped plan with the latency phase ending at each of several token counts
    (``configs.LATENCY_MAX_TOKENS``): which tiles serve 2-8 query tokens, latency or decode."""
    caches = Caches()
    records = []
    for w in LATENCY_WORKLOADS:
        q, kv, idx, lengths = make_inputs(w, caches)
        out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
        for limit in (8, 1):
            fn = lambda: api.sparse_mla_attention((q[..., :512], q[..., 512:]), kv, idx,  # noqa: E731
                                                  576 ** -0.5, out=out)
            with replan.patched(configs, LATENCY_MAX_TOKENS=limit):
                plan = configs.plan_launch(*configs.device_traits(0), t_count=w.t, h_count=w.h,
                                           topk=idx.shape[1], fp8=w.fmt == "fp8_ds_mla")
                us = time_us(fn)
            records.append(dict(workload=w.name, latency_max_tokens=limit, tile=str(plan.tile),
                                splits=plan.splits, us=us))
            t = plan.tile
            print(f"LAT {w.name:36} latency_max={limit} {t.block_h}x{t.block_n} w{t.num_warps} "
                  f"s{t.num_stages} ex={int(t.exchange_p)} splits={plan.splits:3d} {us:8.1f} us",
                  flush=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


# Workloads for --toggle: each runs the tile the shipped sm90 plan gives it.
TOGGLE_WORKLOADS = [
    Workload("decode", 128, 64, "bf16"), Workload("decode", 128, 64, "fp8_ds_mla"),
    Workload("decode", 128, 128, "bf16"), Workload("decode", 128, 128, "fp8_ds_mla"),
    Workload("decode", 32, 128, "bf16"),
    Workload("prefill", 4096, 64, "bf16", n_rows=32768),
    Workload("prefill", 4096, 128, "bf16", n_rows=32768),
    Workload("prefill", 4096, 64, "bf16"), Workload("decode", 128, 64, "bf16", lengths="random"),
    Workload("decode", 128, 8, "fp8_ds_mla"), Workload("decode", 128, 16, "fp8_ds_mla"),
    Workload("decode", 128, 8, "bf16"), Workload("decode", 128, 16, "bf16"), Workload("decode", 512, 16, "fp8_ds_mla"),
    Workload("decode", 128, 32, "bf16"), Workload("decode", 128, 32, "fp8_ds_mla"),
    Workload("decode", 4, 16, "bf16"), Workload("decode", 4, 16, "fp8_ds_mla"),
    Workload("decode", 1, 128, "fp8_ds_mla"),
    Workload("decode", 32, 64, "fp8_ds_mla"), Workload("decode", 512, 128, "fp8_ds_mla"),
    Workload("prefill", 4096, 16, "bf16", n_rows=32768), Workload("prefill", 4096, 8, "bf16", n_rows=32768),
    Workload("prefill", 4096, 16, "bf16"), Workload("decode", 128, 16, "bf16", lengths="random"),
    Workload("prefill", 4096, 16, "fp8_ds_mla", n_rows=32768), Workload("prefill", 4096, 8, "fp8_ds_mla", n_rows=32768),
    Workload("prefill", 4096, 32, "bf16", n_rows=32768),
    Workload("prefill", 4096, 16, "fp8_ds_mla"),  # 1M rows: the few-head tile in the kernel
    Workload("decode", 128, 8, "fp8_ds_mla", lengths="random"),
    Workload("decode", 128, 16, "fp8_ds_mla", lengths="random"),
]


def main_toggle(path, field, fmt=None, heads=None, base=None):
    """Each workload's shipped sm90 tile with the boolean ``TileConfig`` field off and on,
    alternating, twice each; every output is compared with the first variant's. ``fmt``: only
    the workloads of that row format (``fp8_f16`` changes nothing on bf16 rows); ``heads``:
    only those head counts; ``base``: another boolean field set in both variants (one that
    ``field`` needs)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in TOGGLE_WORKLOADS:
        if (fmt and w.fmt != fmt) or (heads and w.h not in heads):
            continue
        fp8 = w.fmt == "fp8_ds_mla"
        tile = configs.plan_launch("sm90", sms, 1, t_count=w.t, h_count=w.h, topk=2048, fp8=fp8).tile
        try:  # (a tile that cannot take the field, e.g. a Gluon-only one on a Triton tile: skipped)
            tile = dataclasses.replace(tile, **{base: True}) if base else tile
            variants = [dataclasses.replace(tile, **{field: on}) for on in (False, True)]
        except ValueError as exc:
            print(f"TOGGLE {w.name:38} skipped: {exc}", flush=True)
            continue
        inputs = make_inputs(w, caches)
        first = []
        for on in (False, True, False, True):
            t = variants[on]
            rec, meta = time_against_first(inputs, w, t, fp8, sms, first)
            records.append(dict(rec, field=field, on=on))
            print(f"TOGGLE {w.name:38} {t.block_h}x{t.block_n} s{t.num_stages} ex={int(t.exchange_p)} "
                  f"{field}={int(on)} splits={rec['splits']:3d} {rec['us']:9.1f} us "
                  f"diff={rec['rel_diff']:.1e} {meta}", flush=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


# --regs-decode: decode over fp8_ds_mla rows with 8 and 16 heads, fp8_regs (kernels/
# gluon_fp8_regs.py) split for 1, 2 or 4 programs per SM against the tile it replaced (the
# shipped tile without fp8_regs, under its split rule), all-valid and random lengths. Written
# to decide fp8_regs in decode (runs 387-388), which now ships split for one program per SM
# (configs.split_rule): the rows per_sm=1 are the shipped plan.
REGS_DECODE_WORKLOADS = [Workload("decode", t, h, "fp8_ds_mla", lengths=lengths)
                         for t in (32, 128, 512) for h in (8, 16) for lengths in ("full", "random")]


def main_regs_decode(path, rules=(1, 2, 4), rounds=2, tokens=None):
    """Each REGS_DECODE_WORKLOADS workload (of the token counts in ``tokens``, if given) with
    the shipped tile without fp8_regs under its split rule, then with fp8_regs under each
    split rule in ``rules``, ``rounds`` times in turn; outputs compared with the first's."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in REGS_DECODE_WORKLOADS:
        if tokens and w.t not in tokens:
            continue
        shipped = configs.plan_launch("sm90", sms, 1, t_count=w.t, h_count=w.h, topk=2048, fp8=True).tile
        base, regs = (dataclasses.replace(shipped, fp8_regs=on) for on in (False, True))
        inputs = make_inputs(w, caches)
        first = []
        for rnd in range(rounds):
            for tile, per_sm in [(base, None)] + [(regs, r) for r in rules]:
                rec, meta = time_against_first(inputs, w, tile, True, sms, first, per_sm=per_sm)
                records.append(dict(rec, fp8_regs=tile.fp8_regs, per_sm=per_sm, round=rnd))
                print(f"REGSDEC {w.name:40} fp8_regs={int(tile.fp8_regs)} per_sm={per_sm or '-'} "
                      f"splits={rec['splits']:3d} {rec['us']:8.1f} us diff={rec['rel_diff']:.1e} {meta}",
                      flush=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


# Workloads for --warps: the shipped 16-head tiles against the same shapes with 8 warps.
# Compiled for sm90 by Triton 3.6, fp8 16x32 with 8 warps takes 128 registers (no spills), so
# two programs still fit per SM: 16 warps instead of 8 to overlap the gather and conversion
# latency, for 34% more instructions per program (loop: 8 x 472 against 4 x 705 per step).
# bf16 16x64 with 8 warps: 128 registers with 2 stages (two per SM), 148 with 3 (one), 14%
# more instructions per program (8 x 503 against 4 x 880, 2 stages).
WARPS_WORKLOADS = [
    Workload("decode", 128, h, fmt) for fmt in ("fp8_ds_mla", "bf16") for h in (8, 16)] + [
    Workload("decode", 32, 16, "fp8_ds_mla"), Workload("decode", 512, 16, "fp8_ds_mla"),
    Workload("decode", 512, 16, "bf16"),
    Workload("prefill", 4096, 16, "fp8_ds_mla", n_rows=32768), Workload("prefill", 4096, 16, "fp8_ds_mla"),
    Workload("prefill", 4096, 16, "bf16", n_rows=32768),
]


def main_warps(path):
    """Each workload's shipped sm90 tile, then the same shape with 8 warps or 4 stages under
    split rules for one or two programs per SM; outputs compared with the first."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in WARPS_WORKLOADS:
        inputs = make_inputs(w, caches)
        fp8 = w.fmt == "fp8_ds_mla"
        shipped = configs.pick_tile("sm90", t_count=w.t, h_count=w.h, fp8=fp8)
        # 8 warps with 2-4 stages for two programs per SM and with 3 for one; 4 warps with 4
        # stages (fp8 16x32: 112 KB, two per SM). 2-stage tiles load row ids a step ahead, as
        # every shipped 2-stage tile does.
        variants = [(shipped, None)] + [
            (dataclasses.replace(shipped, num_warps=warps, num_stages=st,
                                 prefetch_idx=st == 2 or shipped.prefetch_idx), per_sm)
            for warps, st, per_sm in ((8, 2, 2), (8, 3, 2), (8, 4, 2), (8, 3, 1), (4, 4, 2))]
        first = []
        for tile, per_sm in variants:
            rec, meta = time_against_first(inputs, w, tile, fp8, sms, first, per_sm=per_sm)
            records.append(dict(rec, per_sm=per_sm))
            print(f"WARPS {w.name:40} {tile.block_h}x{tile.block_n} w{tile.num_warps} s{tile.num_stages} "
                  f"per_sm={per_sm} splits={rec['splits']:3d} {rec['us']:9.1f} us diff={rec['rel_diff']:.1e} {meta}",
                  flush=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)



# --narrow: fp8_ds_mla workloads of 8-32 heads on the Triton tile the table had before the
# few-head Gluon tiles (kernels/gluon_narrow.py: heads along the wgmma's N, the dequantizing
# producer of kernels/gluon_fp8_producer.py), then those tiles of 16 and 32 heads where they
# cover the heads, then FlashMLA on the same inputs; the 64- and 128-head rows time the shipped
# tile (the same producer) beside FlashMLA. (Runs 101-105 also timed, with temporary switches
# since removed, the producer issuing the next tile's copies before converting this one, the
# copies and conversion in two partitions, probes of either side alone, and (run 110, now
# shipped) the raw halves of odd rows swapped: BENCHMARKS.md "Few heads along N".)
NARROW_WORKLOADS = [Workload("decode", t, h, "fp8_ds_mla") for h in (8, 16) for t in (128, 32, 512)] + [
    Workload("decode", 128, 32, "fp8_ds_mla"), Workload("decode", 128, 16, "fp8_ds_mla", lengths="random"),
    Workload("decode", 4, 16, "fp8_ds_mla"),
    Workload("prefill", 4096, 16, "fp8_ds_mla", n_rows=32768), Workload("prefill", 4096, 16, "fp8_ds_mla"),
    Workload("prefill", 4096, 8, "fp8_ds_mla"), Workload("decode", 128, 8, "fp8_ds_mla", lengths="random"),
    Workload("decode", 128, 64, "fp8_ds_mla"), Workload("decode", 128, 128, "fp8_ds_mla")]
NARROW_WORKLOADS += [Workload("decode", t, h, "bf16") for h in (8, 16) for t in (128, 512)] + [
    Workload("decode", 32, 16, "bf16"), Workload("decode", 128, 16, "bf16", lengths="random"),
    Workload("prefill", 4096, 8, "bf16", n_rows=32768), Workload("prefill", 4096, 16, "bf16", n_rows=32768),
    Workload("prefill", 4096, 16, "bf16")]
# bf16 rows: the few-head consumers fed by the plain rows' producer (kernels/gluon_narrow_plain.py)
NARROW_PLAIN_TILES = [T(8, 64, 4, 2, gluon=True), T(16, 64, 4, 2, gluon=True)]
NARROW_TILES = [T(8, 64, 4, 2, fp8_f16=True, gluon=True),
                T(16, 64, 4, 2, fp8_f16=True, gluon=True),
                T(32, 64, 4, 2, fp8_f16=True, gluon=True)]


def main_narrow(path, fmt=None):
    """``fmt``: only the workloads of that row format."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    records = []
    for w in NARROW_WORKLOADS:
        if fmt and w.fmt != fmt:
            continue
        fp8 = w.fmt == "fp8_ds_mla"
        inputs = make_inputs(w, caches)
        shipped = configs.pick_tile("sm90", t_count=w.t, h_count=w.h, fp8=fp8)
        # (the few-head tiles' fallback: the Triton tiles the table ran before run 101)
        tiles = [shipped.fallback or shipped]
        # the few-head tiles that cover the heads, no wider than 16 below 16 heads, each twice
        # in alternation (adjacent timings are compared)
        gluon_tiles = [t for t in (NARROW_TILES if fp8 else NARROW_PLAIN_TILES)
                       if t.block_h >= w.h and (t.block_h <= 16 or w.h > 16)]
        tiles += gluon_tiles * 2
        first = []
        for tile in tiles:
            rec, meta = time_against_first(inputs, w, tile, fp8, sms, first)
            records.append(rec)
            print(f"NARROW {w.name:40} {tile.block_h}x{tile.block_n} w{tile.num_warps} s{tile.num_stages} "
                  f"gluon={int(tile.gluon)} splits={rec['splits']:3d} {rec['us']:9.1f} us "
                  f"diff={rec['rel_diff']:.1e} {meta}", flush=True)
        records.append(flashmla_record(w, inputs, "NARROW"))
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
