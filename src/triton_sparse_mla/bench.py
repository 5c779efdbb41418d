"""Benchmark: our kernels beside FlashMLA (when importable) and the plain-PyTorch baseline, on
identical inputs, in one run.

Decode workloads are timed as CUDA-graph replays (the way vLLM runs decode), median of many;
prefill workloads as eager calls queued back to back (the way vLLM runs prefill). The
machine's ceilings are measured in the same run: a device-to-device copy (bytes read + written)
and a bf16 8192^3 matmul on random data. Bytes = q + out + the cache rows actually gathered
(sum of valid lengths x row bytes); FLOPs = 2 x H x sum of valid lengths x (576 + 512). Each
workload's output is also checked: the relative error of its first tokens against the float64
reference (``rel_err``).
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field

import torch
import triton

from .api import sparse_mla_attention
from .formats import FP8_ROW_BYTES, quantize_fp8_ds_mla
from .reference import sparse_mla_reference, valid_entries
from .torch_baseline import sparse_mla_torch

ROW_BYTES = {"bf16": 576 * 2, "fp8_ds_mla": FP8_ROW_BYTES}
PRESETS = {
    "glm5-tp8": [8], "deepseek-v32-tp8": [16], "tp4": [32], "glm5-tp1": [64], "deepseek-v32-tp1": [128],
    "all": [8, 16, 32, 64, 128],
}


@dataclass
class Workload:
    phase: str
    t: int
    h: int
    fmt: str
    k: int = 2048
    n_rows: int = 1 << 20
    lengths: str = "full"  # or "random"

    @property
    def name(self):
        return (f"{self.phase} T={self.t} H={self.h} {self.fmt} N={self.n_rows >> 10}K"
                + ("" if self.lengths == "full" else " len=rand"))

    @classmethod
    def from_spec(cls, spec: str) -> "Workload":
        """The workload a benchmark script's command line names as ``"T,H,FORMAT"`` with
        optional ``",N=ROWS"`` (the cache's rows, default 1M) and ``",len=rand"`` (random valid
        lengths), e.g. ``"4096,16,bf16,N=32768"``: decode up to T=512, prefill above, K 2048."""
        parts = spec.split(",")
        if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit()):
            raise ValueError(f"workload spec {spec!r}: expected T,H,FORMAT[,N=ROWS][,len=rand]")
        t, h, fmt, *rest = parts
        if fmt not in ROW_BYTES:
            raise ValueError(f"workload spec {spec!r}: format must be one of {sorted(ROW_BYTES)}, got {fmt!r}")
        kw = {}
        for part in rest:
            if part.startswith("N=") and part[2:].isdigit():
                kw["n_rows"] = int(part[2:])
            elif part == "len=rand":
                kw["lengths"] = "random"
            else:
                raise ValueError(f"workload spec {spec!r}: unknown part {part!r} (expected N=ROWS or len=rand)")
        return cls("decode" if int(t) <= 512 else "prefill", int(t), int(h), fmt, **kw)


@dataclass
class Result:
    workload: dict
    ours_us: float
    flashmla_us: float | None
    bytes: int
    flops: int
    gbps: float
    tflops: float
    copy_share: float
    matmul_share: float
    floor_us: float
    extra: dict = field(default_factory=dict)
    torch_us: float | None = None  # the plain-PyTorch baseline (torch_baseline.sparse_mla_torch)
    rel_err: float | None = None  # first tokens of our output against the float64 reference


def decode_workloads(heads, formats=("bf16", "fp8_ds_mla")):
    out = []
    for fmt in formats:
        for h in heads:
            for t in (1, 4, 32, 128, 512):
                out.append(Workload("decode", t, h, fmt))
            out.append(Workload("decode", 128, h, fmt, lengths="random"))
    return out


def prefill_workloads(heads, formats=("bf16", "fp8_ds_mla"), tokens=(4096, 16384)):
    return [Workload("prefill", t, h, fmt, n_rows=n)
            for fmt in formats for n in (32768, 1 << 20) for h in heads for t in tokens]


SLOW_MS = 100.0  # calls slower than this are timed eagerly, three times (only the PyTorch
# baseline on prefill workloads, 66-600 ms on the H200; our kernels and FlashMLA stay below 40 ms)


EAGER_REPS = 10
# Seconds of untimed calls before a prefill call is timed. A prefill row's first timed kernel
# ran 5-9% faster than the same kernel timed after it (H200, runs 160-162: the GPU's clocks fall
# as long prefill calls heat it). Every call a row compares is heated, and their groups are timed
# in turn (:func:`time_in_turn`): run 311 (H100) found FlashMLA, timed unheated after ours and
# the reference check, 10-17% faster than when heated like ours.
HEAT_S = 2.0
# Turns each call a row compares takes (:func:`time_in_turn`), and milliseconds of CUDA-graph
# replays per call and row (decode), shared among its turns.
ROUNDS = 3
REP_MS = 100


def _eager_ms(fn, reps=1, lead=False) -> float:
    """Milliseconds per call of ``reps`` calls queued between two events. With ``lead``, one
    untimed call is queued before the first event, so that the device is busy while the first
    timed call's host work runs (as in serving, where the kernels before it keep the device busy);
    without, that host work lies between the events on an idle device, adding its length over
    ``reps`` to every call."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if lead:
        fn()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def heat(fn, seconds: float = HEAT_S):
    """Calls of ``fn`` for about ``seconds``, untimed (:data:`HEAT_S`), after one that compiles."""
    fn()
    first_ms = _eager_ms(fn)
    for _ in range(max(1, int(seconds * 1e3 / max(first_ms, 1e-3)))):
        fn()
    torch.cuda.synchronize()


def time_in_turn(fns, graph=False) -> list:
    """Microseconds per call of each of ``fns``, the calls a row compares, timed in turn:
    ``ROUNDS`` times each runs once, and each one's median is reported. Eager (``graph=False``,
    prefill: vLLM runs it so) each is first heated for :data:`HEAT_S`, and a turn is a group of
    ``EAGER_REPS`` calls queued behind one untimed call (:func:`_eager_ms`); with ``graph`` a
    turn is :func:`time_us` over ``REP_MS / ROUNDS`` of CUDA-graph replays. Taking turns gives
    every call the same clocks, which fall as the GPU heats."""
    if not graph:
        for fn in fns:
            heat(fn)
    groups = [[] for _ in fns]
    for _ in range(ROUNDS):
        for group, fn in zip(groups, fns):
            group.append(time_us(fn, rep_ms=REP_MS / ROUNDS) if graph
                         else _eager_ms(fn, EAGER_REPS, lead=True) * 1e3)
    return [statistics.median(group) for group in groups]


def time_us(fn, graph=True, rep_ms=None) -> float:
    """Median of CUDA-graph replays (falls back to eager events if capture fails), or with
    ``graph=False`` (prefill: vLLM runs it eagerly, and the fp8 workspace's exact row count
    cannot be captured) eager calls queued back to back, ``EAGER_REPS`` between two events
    behind one untimed call, the median of ``ROUNDS`` such groups: the host's launch work overlaps
    the device's as in serving, except where a call waits for the device itself. A call slower
    than ``SLOW_MS`` (the PyTorch baseline on prefill workloads takes up to a second) is timed
    as the median of three eager calls. ``rep_ms``: milliseconds of replays (default
    :data:`REP_MS`)."""
    fn()  # compiles and warms up
    first = _eager_ms(fn)
    if first > SLOW_MS:
        return statistics.median(_eager_ms(fn) for _ in range(3)) * 1e3
    if not graph:
        return statistics.median(_eager_ms(fn, EAGER_REPS, lead=True) for _ in range(ROUNDS)) * 1e3
    rep = rep_ms or REP_MS
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3
    except Exception:  # noqa: BLE001 - an op that cannot be captured is still timed eagerly
        return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3


def _copy_us(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e3


def measure_ceilings() -> dict:
    """Copy bandwidth (GB/s, read + write) and bf16 matmul rate (TFLOP/s), measured now."""
    copy_us = _copy_us(1 << 30)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_us = triton.testing.do_bench(lambda: x @ y, warmup=25, rep=200, return_mode="median") * 1e3
    return {"copy_GBps": 2 * (1 << 30) / copy_us / 1e3, "matmul_TFLOPs": 2 * 8192**3 / mm_us / 1e6}


class Caches:
    """One random cache per (format, rows), built once and shared by all workloads."""

    def __init__(self):
        self._store = {}

    def get(self, fmt, n_rows):
        key = (fmt, n_rows)
        if key not in self._store:
            rows = torch.randn(n_rows, 576, device="cuda", dtype=torch.bfloat16)
            self._store[key] = quantize_fp8_ds_mla(rows) if fmt == "fp8_ds_mla" else rows
        return self._store[key]


def make_inputs(w: Workload, caches: Caches, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(w.t, w.h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = caches.get(w.fmt, w.n_rows)
    if w.phase == "prefill" and w.n_rows <= 65536:
        # Unique random rows per token (as FlashMLA's own benchmark draws them).
        idx = torch.rand(w.t, w.n_rows, device="cuda", generator=g).argsort(dim=1)[:, :w.k]
        idx = idx.to(torch.int32)
    else:
        idx = torch.randint(0, w.n_rows, (w.t, w.k), device="cuda", dtype=torch.int32, generator=g)
    lengths = None
    if w.lengths == "random":
        lengths = torch.randint(1, w.k + 1, (w.t,), device="cuda", dtype=torch.int32, generator=g)
    return q, kv, idx.contiguous(), lengths


def flashmla_fn(w: Workload, q, kv, idx, lengths, scale):
    """A FlashMLA call on the same inputs, or None when FlashMLA cannot run this workload.

    bf16 uses ``flash_mla_sparse_fwd``; fp8_ds_mla uses sparse ``flash_mla_with_kvcache``.
    FlashMLA takes 64 or 128 heads: fewer are padded to 64 (what vLLM does), and the padded
    call is what is timed.
    """
    try:
        import flash_mla
    except Exception:  # noqa: BLE001 - absent or unloadable: no baseline
        return None
    legacy = torch.cuda.get_device_capability()[0] == 9
    h_pad = 64 if w.h < 64 else w.h
    if h_pad not in (64, 128):
        return None
    qp = q if h_pad == w.h else torch.nn.functional.pad(q, (0, 0, 0, h_pad - w.h))
    if w.fmt == "bf16":
        kv3 = kv[:, None, :]
        idx3 = idx[:, None, :]
        return lambda: flash_mla.flash_mla_sparse_fwd(qp, kv3, idx3, scale, 512, None, lengths,
                                                      use_legacy=legacy)
    cache = kv.view(-1, 64, 1, FP8_ROW_BYTES)
    meta = flash_mla.get_mla_metadata()[0]
    q4 = qp[:, None]  # [b = T, s_q = 1, h, 576]
    idx4 = idx[:, None, :]
    return lambda: flash_mla.flash_mla_with_kvcache(
        q4, cache, None, None, 512, meta, softmax_scale=scale, is_fp8_kvcache=True,
        indices=idx4, topk_length=lengths, use_legacy=legacy)


def reference_error(q, kv, idx, lengths, scale, out, tokens=4) -> float:
    """Relative error (norm) of ``out[:tokens]`` against the float64 reference, which reads only
    the cache rows those tokens select (copied to the host), not the whole cache."""
    t = min(tokens, q.shape[0])
    sel = idx[:t].long()
    valid = valid_entries(sel, kv.shape[0])
    rows = kv[torch.where(valid, sel, 0).reshape(-1)]  # [t * K, C]
    sub_idx = torch.arange(sel.numel(), device=sel.device).view(sel.shape)
    sub_idx = torch.where(valid, sub_idx, -1).to(torch.int32)
    ref, _ = sparse_mla_reference(q[:t], rows, sub_idx, scale,
                                  topk_length=None if lengths is None else lengths[:t])
    err = (out[:t].double().cpu() - ref).norm() / ref.norm().clamp_min(1e-300)
    return err.item()


def _or_none(label: str, w: Workload, fn):
    """``fn()``, or None after reporting its failure (a baseline or check that fails on one
    workload must not end the run)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - report, keep benchmarking
        print(f"  {label} failed on {w.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def run_workload(w: Workload, caches: Caches, ceilings: dict, baseline=True,
                 torch_baseline=True) -> Result:
    q, kv, idx, lengths = make_inputs(w, caches)
    scale = 576 ** -0.5
    out = torch.empty(w.t, w.h, 512, device="cuda", dtype=torch.bfloat16)
    graph = w.phase == "decode"

    def ours():
        sparse_mla_attention(q, kv, idx, scale, topk_length=lengths, out=out)

    fm = flashmla_fn(w, q, kv, idx, lengths, scale) if baseline else None
    if fm is not None and _or_none("FlashMLA", w, lambda: fm() or True) is None:
        fm = None  # (reported; ours is still timed)
    ours_us, fm_us = (time_in_turn([ours, fm], graph) if fm is not None
                      else time_in_turn([ours], graph) + [None])
    rel_err = _or_none("the reference check", w,
                       lambda: reference_error(q, kv, idx, lengths, scale, out))
    torch_us = None
    if torch_baseline:
        torch_us = _or_none("PyTorch", w, lambda: time_us(
            lambda: sparse_mla_torch(q, kv, idx, scale, topk_length=lengths), graph))
    n_valid = int(lengths.sum()) if lengths is not None else w.t * w.k
    nbytes = n_valid * ROW_BYTES[w.fmt] + 2 * q.numel() * 2 + 2 * out.numel()
    flops = 2 * w.h * n_valid * (576 + 512)
    floor_us = max(nbytes / ceilings["copy_GBps"] / 1e3, flops / ceilings["matmul_TFLOPs"] / 1e6)
    return Result(workload=asdict(w) | {"name": w.name}, ours_us=ours_us, flashmla_us=fm_us,
                  bytes=nbytes, flops=flops, gbps=nbytes / ours_us / 1e3,
                  tflops=flops / ours_us / 1e6,
                  copy_share=nbytes / ours_us / 1e3 / ceilings["copy_GBps"],
                  matmul_share=flops / ours_us / 1e6 / ceilings["matmul_TFLOPs"], floor_us=floor_us,
                  torch_us=torch_us, rel_err=rel_err)


def header() -> dict:
    try:
        import flash_mla
        fm_version = getattr(flash_mla, "__version__", "?")
    except Exception:  # noqa: BLE001
        fm_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "flash_mla": fm_version,
    }


def format_row(r: Result) -> str:
    fm = f"{r.flashmla_us:9.1f}" if r.flashmla_us else "        -"
    ratio = f"{r.flashmla_us / r.ours_us:6.2f}" if r.flashmla_us else "     -"
    pt = f"{r.torch_us:9.1f}" if r.torch_us else "        -"
    err = f"{r.rel_err:8.1e}" if r.rel_err is not None else "       -"
    return (f"{r.workload['name']:40} {r.ours_us:9.1f} {fm} {ratio} {pt} {r.floor_us:8.1f} "
            f"{r.gbps:8.0f} {r.tflops:7.1f} {100 * r.copy_share:5.0f}% {100 * r.matmul_share:5.0f}% {err}")


TABLE_HEAD = (f"{'workload':40} {'ours us':>9} {'FlashMLA':>9} {'FM/us':>6} {'torch us':>9} "
              f"{'floor':>8} {'GB/s':>8} {'TFLOP/s':>7} {'copy%':>6} {'mm%':>6} {'rel err':>8}")


def run_bench(workloads, json_path=None, plot_path=None, baseline=True, torch_baseline=True) -> dict:
    head = header()
    print(" ".join(f"{k}={v}" for k, v in head.items()), flush=True)
    ceilings = measure_ceilings()
    print(f"ceilings: copy {ceilings['copy_GBps']:.0f} GB/s, bf16 matmul {ceilings['matmul_TFLOPs']:.0f} TFLOP/s",
          flush=True)
    caches = Caches()
    record = {"header": head, "ceilings": ceilings, "results": []}
    for i, w in enumerate(workloads):
        print(f"[{i + 1}/{len(workloads)}] {w.name}", file=sys.stderr, flush=True)
        record["results"].append(asdict(run_workload(w, caches, ceilings, baseline=baseline,
                                                     torch_baseline=torch_baseline)))
        if json_path:  # after every workload, so an interrupted run keeps what it measured
            with open(json_path, "w") as f:
                json.dump(record, f, indent=1)
    print(TABLE_HEAD)
    for r in record["results"]:
        print(format_row(Result(**r)))
    if plot_path:
        plot_roofline(record, plot_path)
    return record


def plot_roofline(record: dict, path: str):
    """Roofline PNG: achieved TFLOP/s against arithmetic intensity (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw, peak = record["ceilings"]["copy_GBps"], record["ceilings"]["matmul_TFLOPs"]
    fig, ax = plt.subplots(figsize=(7, 5))
    ridge = peak * 1e3 / bw  # FLOP per byte where the copy and matmul ceilings meet
    xs = [0.5, ridge, 2000]
    ax.plot(xs, [min(peak, x * bw / 1e3) for x in xs], "k-", lw=1,
            label="measured ceilings (L2-resident data can pass the copy line)")
    for r in record["results"]:
        ai = r["flops"] / r["bytes"]
        ax.plot(ai, r["tflops"], "o", color="tab:blue", ms=4)
        if r["flashmla_us"]:
            ax.plot(ai, r["flops"] / r["flashmla_us"] / 1e6, "x", color="tab:red", ms=5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"sparse MLA on {record['header']['gpu']} (o ours, x FlashMLA)")
    ax.legend(loc="lower right", fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
