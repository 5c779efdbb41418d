"""Time the 64-head bf16 kernels side by side in one process (GPU): forms of the sm90 tile and
FlashMLA, on the same inputs, in rounds (``--rounds``, 2), every other one in the reverse
order, after ``--heat`` seconds of untimed calls (the best of the rounds is reported); each
output compared with the first form's, and each time given as a ratio to it.

Forms: ``shipped`` (the shipped plans: the alternate-tile kernel, kernels/gluon_pingpong.py)
and ``pp:REGS`` (the
alternate-tile kernel with its consumers at REGS registers: gluon_pingpong.CONSUMER_REGS,
which the launcher reads when a call plans its launch, so one process can run several).
``mod:NAME``: the shipped plans with the alternate-tile kernel taken from module
triton_sparse_mla.kernels.NAME (e.g. the file from another commit, written beside
gluon_pingpong.py for the run: ``git show REV:src/triton_sparse_mla/kernels/gluon_pingpong.py
> src/triton_sparse_mla/kernels/_pp_base.py``, then ``mod:_pp_base``).
Any form may end in ``+SPEC``: its kernels compiled with their ``cp.async`` copies rewritten
as benchmarks/ptx_rewrite.py's SPEC says (``shipped+l2_256``).
(Run 157 also timed ``pp:REGS:l2``, an L2 prefetch of the next pair's rows, since removed;
runs 152-157 the form ``lockstep``, the same tile with its consumers in lockstep and 8
producer warps, as shipped until run 153, whose kernel was removed after commit 44043de.)
Prints ``PPC`` lines and writes JSON (after each workload). (Until run 153 forms were
``pp:BLOCK_N:PW:REGS``; runs 147-150 also timed switches since removed: ``:each``, ``:early``,
``:p1``; BENCHMARKS.md "The 64-head bf16 tile beside FlashMLA's kernel".)

Usage: python benchmarks/pp_compare.py OUT.json [--forms shipped,pp:232] [--all]
    [--rounds 4] [--heat 3] [--rows decode:128:16:fp8_ds_mla,prefill:4096:8:bf16:32768]
(--rows: other rows in place of the default ones, each PHASE:T:H:FORMAT[:CACHE_ROWS])
"""

import argparse
import contextlib
import dataclasses
import importlib
import json

import torch

from triton_sparse_mla import configs, sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, flashmla_fn, header, heat, make_inputs, time_us
from triton_sparse_mla.kernels import gluon_pingpong

import replan
from ptx_rewrite import rewritten

WORKLOADS = [
    Workload("decode", 128, 64, "bf16"),
    Workload("decode", 128, 64, "bf16", lengths="random"),
    Workload("prefill", 4096, 64, "bf16", n_rows=32768),
    Workload("prefill", 4096, 64, "bf16"),
]
# --all adds the other rows the 64-head bf16 tile serves: 128 heads (two programs per token),
# split decode (T=1, T=32: partial outputs and the combine).
MORE_WORKLOADS = [
    Workload("decode", 128, 128, "bf16"),
    Workload("decode", 32, 128, "bf16"),
    Workload("decode", 1, 64, "bf16"),
    Workload("decode", 32, 64, "bf16", lengths="random"),
    Workload("prefill", 4096, 128, "bf16", n_rows=32768),
]


@contextlib.contextmanager
def form(spec):
    """The shipped plans (``shipped``), or as the
    alternate-tile kernel with its consumers at REGS registers (``pp:REGS``), or the shipped
    plans with the alternate-tile kernel of another module (``mod:NAME``); each with
    ``+SPEC``, its copies rewritten (module docstring)."""
    spec, _, ptx = spec.partition("+")
    if ptx:
        with rewritten(ptx), form(spec):
            yield
        return
    if spec == "shipped":
        yield
        return
    gp = gluon_pingpong
    if spec.startswith("mod:"):
        other = importlib.import_module(f"triton_sparse_mla.kernels.{spec[4:]}")
        with replan.patched(gp, sparse_mla_gluon_pp_kernel=other.sparse_mla_gluon_pp_kernel):
            yield
        return
    shipped = configs.plan_launch
    kind, _, regs = spec.partition(":")
    if kind != "pp" or not regs.isdigit():
        raise ValueError(f"--forms: shipped, pp:REGS or mod:NAME, got {spec!r}")
    fields = dict(pingpong=True, wide_producer=False)

    def plan(*args, **kwargs):
        p = shipped(*args, **kwargs)
        return dataclasses.replace(p, tile=dataclasses.replace(p.tile, **fields))

    with replan.patched(gp, CONSUMER_REGS=int(regs)), replan.patched(configs, plan_launch=plan):
        yield


def _row(text):
    """A workload from ``PHASE:T:H:FORMAT[:CACHE_ROWS]``."""
    phase, t, h, fmt, *n = text.split(":")
    return Workload(phase, int(t), int(h), fmt, **(dict(n_rows=int(n[0])) if n else {}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--forms", default="shipped")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--rows", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--heat", type=float, default=0.0,
                    help="seconds of untimed calls before a row's first round (bench.heat)")
    a = ap.parse_args()
    forms = a.forms.split(",")
    caches, records, head = Caches(), [], header()
    rows = [_row(r) for r in a.rows.split(",") if r]
    for w in rows or WORKLOADS + (MORE_WORKLOADS if a.all else []):
        q, kv, idx, lengths = make_inputs(w, caches)
        graph = w.phase == "decode"
        outs, times = {}, {f: [] for f in forms + ["FlashMLA"]}
        fm = flashmla_fn(w, q, kv, idx, lengths, 576 ** -0.5)
        if a.heat:
            heat(lambda: sparse_mla_attention(q, kv, idx, 576 ** -0.5, topk_length=lengths), a.heat)
        for r in range(a.rounds):
            for f in forms if r % 2 == 0 else forms[::-1]:  # (neither form always runs later)
                out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)

                def call(f=f, out=out):
                    with form(f):
                        sparse_mla_attention(q, kv, idx, 576 ** -0.5, topk_length=lengths, out=out)

                try:
                    times[f].append(time_us(call, graph=graph))
                except ValueError as exc:  # the row's shipped tile cannot take the form
                    print(f"PPC {w.name:34} {f:14} skipped: {exc}", flush=True)
                    continue
                outs.setdefault(f, out.float())
            if fm is not None:
                times["FlashMLA"].append(time_us(fm, graph=graph))
        if not times[forms[0]]:
            continue  # (the first form cannot run this row: nothing to compare with)
        ref = outs[forms[0]]
        base = min(times[forms[0]])
        fm_us = min(times["FlashMLA"]) if times["FlashMLA"] else None
        for f in [f for f in forms if times[f]] + (["FlashMLA"] if fm_us else []):
            us = min(times[f])
            diff = ((outs[f] - ref).norm() / ref.norm()).item() if f in outs else None
            records.append(dict(workload=w.name, form=f, us=times[f], best_us=us, rel_diff=diff))
            print(f"PPC {w.name:34} {f:14} {us:9.1f} us  x{base / us:5.3f} of {forms[0]}"
                  + (f"  x{fm_us / us:5.3f} of FlashMLA" if fm_us else "")
                  + (f"  diff={diff:.1e}" if diff is not None else ""), flush=True)
        with open(a.out, "w") as fh:  # (after each workload: a call cut short keeps what it timed)
            json.dump(dict(header=head, records=records), fh, indent=1)


if __name__ == "__main__":
    main()
