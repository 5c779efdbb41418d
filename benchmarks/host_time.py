"""Host time of one sparse_mla_attention call, and its parts, on a GPU.

The prefill workspace rule reads a count back from the device (workspace.build), so the GPU
waits through whatever host work the call does after that read; in eager decode the host
time bounds the call. Per workload and ``fp8_workspace`` mode this prints the median host
time of a call while the device is kept busy (no call waits for the launch queue), the wall
time per call, and the host time of the call's parts: validation and output allocation (the
call with ``api._run`` stubbed), planning (``_run`` with the launch stubbed) and the launch of
the main kernel alone (``kernel[grid](...)`` with the call's arguments). Each workload runs
twice: with the host code's ``cdiv`` (triton_sparse_mla.hostmath) and with ``triton.cdiv`` in
its place, which the host code called before (a JIT function's call from Python).

Usage (GPU): python benchmarks/host_time.py
"""

import time

import torch
import triton

from triton_sparse_mla import api, configs, hostmath, sparse_mla_attention, workspace
from triton_sparse_mla.bench import Caches, Workload, make_inputs
from triton_sparse_mla.kernels import attention

WORKLOADS = [Workload("prefill", 4096, 16, "fp8_ds_mla"), Workload("prefill", 4096, 64, "fp8_ds_mla"),
             Workload("decode", 1, 16, "fp8_ds_mla"), Workload("decode", 1, 64, "bf16"),
             Workload("decode", 128, 64, "bf16")]
N = 30


def _median_us(fn):
    fn()
    times = []
    for _ in range(N):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[N // 2] * 1e6


def _use_cdiv(fn):
    for module in (configs, workspace, attention):
        module.cdiv = fn


def main():
    caches = Caches()
    for w, (variant, fn) in ((w, v) for w in WORKLOADS
                             for v in (("triton.cdiv", triton.cdiv), ("hostmath.cdiv", hostmath.cdiv))):
        _use_cdiv(fn)
        q, kv, idx, _ = make_inputs(w, caches)
        for mode in ((False, None) if w.fmt == "fp8_ds_mla" and w.t >= 1024 else (None,)):
            def call():
                return sparse_mla_attention(q, kv, idx, 576 ** -0.5, fp8_workspace=mode)
            call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            host = _median_us(call)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / (N + 1) * 1e6
            run, launch = api._run, attention.launch_with_combine
            captured = []
            try:
                api._run = lambda *a, **k: None
                validate = _median_us(call)
                api._run = run
                attention.launch_with_combine = lambda *a: captured.append(a)
                plan = _median_us(call)
            finally:
                api._run, attention.launch_with_combine = run, launch
            kernel, grid, args, out, lse = captured[-1][:5]
            kw = dict(out_ptr=out, lse_ptr=lse, stride_o_t=out.stride(0), stride_o_h=out.stride(1),
                      stride_o_s=0, stride_lse_t=lse.stride(0) if lse is not None else 0,
                      stride_lse_h=lse.stride(1) if lse is not None else 0, PARTIAL=False, **args)
            kernel_launch = _median_us(lambda: kernel[grid](**kw))
            torch.cuda.synchronize()
            print(f"HOST {w.name:40} {variant:13} fp8_workspace={str(mode):5} call {host:7.1f} us (wall {wall:8.1f}): "
                  f"validation+alloc {validate:6.1f}, +planning {plan:6.1f}, kernel[grid] alone "
                  f"{kernel_launch:6.1f} ({kernel.fn.__name__ if hasattr(kernel, 'fn') else kernel.__name__}, "
                  f"{len(kw)} arguments)", flush=True)


if __name__ == "__main__":
    main()
