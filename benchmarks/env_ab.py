"""A/B timing of kernel variants selected by environment variables, one process per setting.

A kernel experiment that is not a ``TileConfig`` field (so ``sweep.py --toggle`` cannot switch
it inside one process) can read a module constant from the environment, e.g.
``FLAG = gl.constexpr(int(os.environ.get("TSM_FLAG", "0")))`` in a Gluon module. This script
then times the shipped plan of each workload under each setting, each setting in a process of
its own, the settings in turn for ``--rounds`` rounds (so drift shows as a difference between
rounds), prefill rows heated first. It prints one line per timing and, at the end, each
setting's mean per workload against the first setting's. It times the kernel with the shipped
tile (``sweep.time_plan``), so an fp8_ds_mla prefill row is that tile, not the bf16 workspace
route the API takes there. A setting may also change ``PYTHONPATH`` (another Triton, e.g.
unpacked into a folder there: ``"PYTHONPATH=/that/folder:$PWD/src"``).

Usage: ``python benchmarks/env_ab.py OUT.jsonl --set "TSM_FLAG=0" --set "TSM_FLAG=1"
[--rounds 2] [--field FIELD] WORKLOAD ...`` where a setting is one or more ``NAME=VALUE``
separated by spaces and a workload is ``T,H,FORMAT[,N=ROWS][,len=rand]``
(``bench.Workload.from_spec``). ``--field`` sets a boolean ``TileConfig`` field on each
workload's shipped tile in every setting (e.g. an experimental kernel that no table selects).
``device_run.sh envab`` runs it with ``$ENV_AB_SETS`` (settings separated by ``;``),
``$ENV_AB_WORKLOADS`` and ``$ENV_AB_FIELD``. The records in OUT.jsonl carry the setting;
times vary 10-40% between runs on shared machines, so compare settings within one run only.
"""

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys

ROUNDS = 2


def parse_setting(text):
    """``"A=1 B=0"`` -> ``{"A": "1", "B": "0"}``."""
    pairs = [p.split("=", 1) for p in text.split()]
    if not pairs or any(len(p) != 2 or not p[0] for p in pairs):
        raise SystemExit(f"--set {text!r}: expected NAME=VALUE[ NAME=VALUE...]")
    return dict(pairs)


def check_field(field):
    """Refuse a ``--field`` that is not a boolean ``TileConfig`` field (before any process)."""
    if field is None:
        return
    from triton_sparse_mla import configs

    kinds = {f.name: f.type for f in dataclasses.fields(configs.TileConfig)}
    if kinds.get(field) not in (bool, "bool"):
        raise SystemExit(f"--field: expected a boolean TileConfig field, got {field!r}")


def child(path, setting, specs, field=None):
    """Time each workload's shipped plan in this process (its environment is the setting),
    with the boolean ``TileConfig`` field ``field`` set on its tile where given."""
    import torch
    import triton

    from triton_sparse_mla import configs
    from triton_sparse_mla.bench import Caches, Workload, heat, make_inputs

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sweep import plan_call, time_plan

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = Caches()
    with open(path, "a") as f:
        for spec in specs:
            w = Workload.from_spec(spec)
            fp8 = w.fmt == "fp8_ds_mla"
            tile = configs.plan_launch("sm90", sms, 1, t_count=w.t, h_count=w.h, topk=w.k, fp8=fp8).tile
            if field:
                tile = dataclasses.replace(tile, **{field: True})
            inputs = make_inputs(w, caches)
            out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
            pin = configs.pin_fp8_conversion("sm90", tile.block_h)
            if w.phase == "prefill":
                heat(plan_call(inputs, out, tile, 1, fp8, sms, pin)[1], 1.0)
            splits, us, meta = time_plan(inputs, out, tile, 1, fp8, sms, pin=pin)
            rec = dict(setting=setting, workload=w.name, tile=str(tile), splits=splits, us=us,
                       triton=triton.__version__, torch=torch.__version__, **meta)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(f"ENVAB [{setting}] triton {triton.__version__} {w.name:40} {us:9.1f} us", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--set", dest="settings", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--field", help="a boolean TileConfig field set on every workload's shipped tile")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child(args.out, args.child, args.workloads, args.field)
    if len(args.settings) < 2:
        raise SystemExit("give at least two --set settings to compare")
    from triton_sparse_mla.bench import Workload

    for spec in args.workloads:  # (a bad spec fails here, before any process starts)
        Workload.from_spec(spec)
    for text in args.settings:
        parse_setting(text)
    check_field(args.field)
    for _ in range(args.rounds):
        for text in args.settings:
            env = dict(os.environ, **parse_setting(text))
            subprocess.run([sys.executable, os.path.abspath(__file__), args.out, *args.workloads,
                            "--child", text, *(["--field", args.field] if args.field else [])],
                           env=env, check=False)
    summarize(args.out, args.settings)


def summary(path, settings):
    """Each setting's times per workload over the file's records: rows of (workload, setting,
    mean us, fastest, slowest, count, the first setting's mean over this one's: above 1 is
    faster than the first)."""
    times = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            times.setdefault((r["workload"], r["setting"]), []).append(r["us"])
    rows = []
    for w in dict.fromkeys(w for w, _ in times):
        base = times.get((w, settings[0]))
        for text in settings:
            got = times.get((w, text))
            if got:
                ratio = statistics.mean(base) / statistics.mean(got) if base else float("nan")
                rows.append((w, text, statistics.mean(got), min(got), max(got), len(got), ratio))
    return rows


def summarize(path, settings):
    for w, text, mean, lo, hi, n, ratio in summary(path, settings):
        print(f"ENVAB-SUM {w:40} [{text}] {mean:9.1f} us ({lo:.1f}-{hi:.1f}, n={n}) {ratio:.3f}x",
              flush=True)


if __name__ == "__main__":
    main()
