"""Time the DSA indexer's score kernels at the models' shapes (``triton-sparse-mla bench --phase
indexer``; ``benchmarks/indexer_bench.py`` on the GPU machine).

Prefill (:func:`~triton_sparse_mla.indexer.mqa_logits`): causal chunks of one request, ``t`` new
tokens after a context of ``ctx`` (row ``i`` sees keys ``[0, ctx + i + 1)``); FLOPs counted:
``2 H D`` per (row, key) pair. Decode (:func:`~triton_sparse_mla.indexer.paged_mqa_logits`):
``batch`` requests of ``ctx`` tokens each over a cache of exactly their blocks (random block
tables), ``next_n`` rows each; bytes counted: each request's blocks (``D + 4`` bytes a token)
read once, q, the weights, and the logits written. Heads: 64 (DeepSeek-V3.2's indexer) and 32
(GLM-5's), ``D`` 128, blocks of 64 tokens. Each figure is set beside the copy and bf16 matmul
ceilings measured in the same run and, where DeepGEMM imports (``deep_gemm``, or vLLM's vendored
``vllm.third_party.deep_gemm``) and runs on this GPU, beside DeepGEMM's time on the same inputs,
called as vLLM 0.33 calls it. Every workload's first rows are checked against the float64
reference before it is timed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

import torch

from .. import boundary
from . import flat, flat_heads, paged
from .api import mqa_logits, paged_mqa_logits
from .cache_layout import pack_indexer_k_cache
from .reference import mqa_logits_reference, paged_mqa_logits_reference

D = 128
BLOCK = 64  # cache block (tokens), vLLM's for the indexer
CHECK_ROWS = 16  # prefill rows (from the first) checked against float64


@dataclass(frozen=True)
class Workload:
    """A prefill chunk (``t`` new tokens after ``ctx``) or a decode batch (``batch`` requests of
    ``ctx`` tokens, ``next_n`` rows each), at ``heads`` indexer heads."""

    phase: str
    heads: int
    ctx: int
    t: int = 0
    batch: int = 0
    next_n: int = 1

    @property
    def name(self) -> str:
        if self.phase == "prefill":
            return f"prefill {self.t} after {self.ctx} H={self.heads}"
        return f"decode {self.batch}x{self.ctx} next_n={self.next_n} H={self.heads}"

    @property
    def flops(self) -> int:
        if self.phase == "prefill":
            pairs = self.t * self.ctx + self.t * (self.t + 1) // 2
            return 2 * self.heads * D * pairs
        return 2 * self.heads * D * self.batch * self.next_n * self.ctx

    @property
    def nbytes(self) -> int | None:
        """Decode: the bytes a call must move; prefill: None (it is bound by its products)."""
        if self.phase == "prefill":
            return None
        rows = self.batch * self.next_n
        blocks = self.batch * -(-self.ctx // BLOCK)
        return blocks * BLOCK * (D + 4) + rows * self.heads * (D + 4) + 4 * rows * self.ctx


def workloads(heads=(64, 32)) -> list[Workload]:
    """The default set: per head count, three prefill chunks and five decode batches."""
    out = []
    for h in heads:
        out += [Workload("prefill", h, ctx, t=t) for t, ctx in ((4096, 0), (8192, 0), (2048, 30720))]
        out += [Workload("decode", h, ctx, batch=b, next_n=n)
                for b, ctx, n in ((1, 32768, 1), (32, 8192, 1), (32, 8192, 2), (128, 32768, 1),
                                  (8, 131072, 2))]
    return out


def make_inputs(w: Workload, device, seed: int = 0) -> tuple:
    """The call's arguments, in the order :func:`mqa_logits` (prefill) or
    :func:`paged_mqa_logits` (decode) takes them: random (q and keys 2 N(0, 1) in e4m3), made on
    ``device`` by a generator seeded there."""
    g = torch.Generator(device=device).manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g, device=device)  # noqa: E731
    rand = lambda *shape: torch.rand(*shape, generator=g, device=device)  # noqa: E731
    fp8 = lambda *shape: (randn(*shape) * 2).to(torch.float8_e4m3fn)  # noqa: E731
    if w.phase == "prefill":
        n = w.ctx + w.t
        return (fp8(w.t, w.heads, D), fp8(n, D), rand(n) + 0.1, randn(w.t, w.heads),
                torch.zeros(w.t, dtype=torch.int32, device=device),
                torch.arange(w.ctx + 1, n + 1, dtype=torch.int32, device=device), n)
    per = -(-w.ctx // BLOCK)
    cache = pack_indexer_k_cache(fp8(w.batch * per, BLOCK, D), rand(w.batch * per, BLOCK) + 0.1)
    tables = torch.randperm(w.batch * per, generator=g, device=device).int().reshape(w.batch, per)
    lens = w.ctx - w.next_n + 1 + torch.arange(w.next_n, dtype=torch.int32, device=device)
    return (fp8(w.batch, w.next_n, w.heads, D), cache, randn(w.batch * w.next_n, w.heads),
            lens.expand(w.batch, w.next_n).contiguous(), tables, per * BLOCK)


def ours(w: Workload, args: tuple):
    """A call of ours on ``args`` (:func:`make_inputs`)."""
    fn = mqa_logits if w.phase == "prefill" else paged_mqa_logits
    return lambda: fn(*args)


def reference_error(w: Workload, args: tuple, out: torch.Tensor) -> float:
    """Relative (norm) error of ``out``'s first rows against the float64 reference: the first
    :data:`CHECK_ROWS` prefill rows, or the first request's rows; columns the reference leaves
    at -inf are not compared."""
    if w.phase == "prefill":
        n = CHECK_ROWS
        a = [x.cpu() if isinstance(x, torch.Tensor) else x for x in args]
        ref = mqa_logits_reference(a[0][:n], a[1], a[2], a[3][:n], a[4][:n], a[5][:n], a[6])
    else:  # the first request, over its own blocks only (not the whole cache to the host)
        q, cache, weights, lens, tables, width = args
        blocks = tables[0].long()
        ref = paged_mqa_logits_reference(
            q[:1].cpu(), cache[blocks].cpu(), weights[: q.shape[1]].cpu(), lens[:1].cpu(),
            torch.arange(blocks.numel(), dtype=torch.int32)[None, :], width)
    valid = torch.isfinite(ref)
    got = out[: ref.shape[0]].double().cpu()[valid]
    return ((got - ref[valid]).norm() / ref[valid].norm().clamp_min(1e-30)).item()


def deep_gemm():
    """``(module, name)`` of DeepGEMM where it imports, else ``(None, why not)``."""
    why = ""
    for name in ("deep_gemm", "vllm.third_party.deep_gemm"):
        try:
            return __import__(name, fromlist=["_"]), name
        except Exception as exc:  # noqa: BLE001 - any failure means no baseline
            why = f"{name}: {type(exc).__name__}: {exc}"
    return None, why


def deep_gemm_call(dg, w: Workload, args: tuple):
    """DeepGEMM's call on the same inputs, as vLLM 0.33's indexer makes it."""
    if w.phase == "prefill":
        q, k, k_scale, weights, starts, ends, width = args
        return lambda: dg.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, starts, ends, width)
    q, cache, weights, lens, tables, width = args
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    schedule = dg.get_paged_mqa_logits_metadata(lens, BLOCK, sms)
    return lambda: dg.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, tables, schedule,
                                               width)


def run(work: list[Workload], json_path: str | None = None, device="cuda") -> dict:
    """Check and time each workload on ``device`` (a GPU); print a header, a progress line per
    workload (stderr) and a table; write everything to ``json_path`` after each workload."""
    from ..bench import header, heat, measure_ceilings, time_us

    device = torch.device(device)
    dg, dg_name = deep_gemm()
    on_fp8 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
    head = header() | {"deep_gemm": dg_name if dg is not None else None,
                       "fp8_products": flat.FP8_DOT and on_fp8}
    family = boundary.device_traits(device, "device")[0]
    if flat.HEADS_ALONG_N[family]:  # the prefill kernel's tile
        head["tile"] = dict(heads_along_n=list(flat_heads.TILE))
    else:
        head["tile"] = dict(per_head=list(flat.tile(head["fp8_products"])))
    head["paged"] = dict(programs_per_sm=paged.PROGRAMS_PER_SM or dict(resident=paged.RESIDENT),
                         num_warps=paged.NUM_WARPS, num_stages=paged.NUM_STAGES[family])
    print(" ".join(f"{k}={v}" for k, v in head.items()), flush=True)
    ceil = measure_ceilings()
    print(f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s",
          flush=True)
    record = {"header": head, "ceilings": ceil, "rows": []}
    for i, w in enumerate(work):
        print(f"[{i + 1}/{len(work)}] {w.name}", file=sys.stderr, flush=True)
        args = make_inputs(w, device)
        fn = ours(w, args)
        err = reference_error(w, args, fn())
        heat(fn, 1.0)
        us = time_us(fn, graph=w.phase == "decode")
        row = asdict(w) | dict(us=us, rel_err=err, TFLOPs=w.flops / us / 1e6,
                               matmul_share=w.flops / us / 1e6 / ceil["matmul_TFLOPs"])
        if w.nbytes is not None:
            row.update(GBps=w.nbytes / us / 1e3, copy_share=w.nbytes / us / 1e3 / ceil["copy_GBps"])
        if dg is not None:
            try:
                base = deep_gemm_call(dg, w, args)
                heat(base, 1.0)
                row["deep_gemm_us"] = time_us(base, graph=w.phase == "decode")
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                row["deep_gemm_error"] = f"{type(exc).__name__}: {exc}"[:300]
        record["rows"].append(row)
        if json_path:  # after every workload, so an interrupted run keeps what it measured
            with open(json_path, "w") as f:
                json.dump(record, f, indent=1)
    print(TABLE_HEAD)
    for row in record["rows"]:
        print(format_row(row))
    return record


TABLE_HEAD = (f"{'workload':40} {'ours us':>9} {'TFLOP/s':>8} {'share':>14} {'DeepGEMM':>9} "
              f"{'DG/ours':>7} {'rel err':>8}")


def format_row(row: dict) -> str:
    """One table line of a :func:`run` row."""
    w = Workload(**{k: row[k] for k in ("phase", "heads", "ctx", "t", "batch", "next_n")})
    share = (f"{100 * row['copy_share']:.0f}% of copy" if "copy_share" in row
             else f"{100 * row['matmul_share']:.0f}% of matmul")
    dg = row.get("deep_gemm_us")
    dg_text = f"{dg:9.1f} {dg / row['us']:7.2f}" if dg else f"{'-':>9} {'-':>7}"
    return (f"{w.name:40} {row['us']:9.1f} {row['TFLOPs']:8.1f} {share:>14} {dg_text} "
            f"{row['rel_err']:8.1e}")
