"""Launch the 64-head bf16 kernels once each between cudaProfilerStart/Stop, for Nsight Compute:
each form in ``--forms`` (as ``pp_compare.py`` names them: ``shipped``, ``lockstep``,
``pp:REGS``), and with ``--flashmla`` FlashMLA's kernel
on the same inputs (``bench.flashmla_fn``: its sparse prefill kernel, legacy on sm90). Every
kernel runs once before profiling starts (compilation).

Usage: ``ncu --profile-from-start off ... python3 benchmarks/pp_profile.py [--phase prefill]
[--t 4096] [--rows 32768] [--forms lockstep,shipped] [--flashmla]``;
``benchmarks/device_run.sh ppncu`` runs it so, in decode and in prefill.
"""

import argparse

import torch

from triton_sparse_mla import sparse_mla_attention
from triton_sparse_mla.bench import Caches, Workload, flashmla_fn, make_inputs

from pp_compare import form  # (a script beside this one: its directory is on the path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", default="prefill")
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--forms", default="lockstep,shipped")
    ap.add_argument("--flashmla", action="store_true")
    a = ap.parse_args()
    w = Workload(a.phase, a.t, 64, "bf16", n_rows=a.rows)
    q, kv, idx, lengths = make_inputs(w, Caches())
    forms = [f for f in a.forms.split(",") if f]
    baseline = flashmla_fn(w, q, kv, idx, lengths, 576 ** -0.5) if a.flashmla else None
    if a.flashmla and baseline is None:
        raise SystemExit("--flashmla: FlashMLA is not importable here")

    def run_all():
        for f in forms:
            with form(f):
                sparse_mla_attention(q, kv, idx, 576 ** -0.5, topk_length=lengths)
        if baseline is not None:
            baseline()

    run_all()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run_all()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", w.name, ", ".join(forms), "then FlashMLA" if baseline is not None else "")


if __name__ == "__main__":
    main()
