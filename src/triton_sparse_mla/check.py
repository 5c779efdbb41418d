"""Self-check: run the public API on embedded problems and compare with the float64 reference.

On a GPU the problems are decode- and prefill-sized: 4 tokens with 64 heads, 16 tokens with
8, 16 and 32 heads (on SM90 the Gluon tiles: the 64-head ones, which take bf16/fp16 rows with
32 heads too, the other 32 masked, and kernels/gluon_narrow.py's few-head ones, N = 8 up to 8
heads: for fp8_ds_mla rows up to 32 heads, for bf16/fp16 rows up to 16), and 1024 tokens
over 32K rows (the fp8_ds_mla workspace of
:mod:`triton_sparse_mla.workspace`); on a CPU (through Triton's interpreter) they are small.
Then the DSA indexer's scores (:mod:`triton_sparse_mla.indexer`): a causal prefill chunk of two
requests and a decode batch with one draft token per request, 64 heads (8 on a CPU).
One verdict line per format and geometry; the return value says if all passed.
"""

from __future__ import annotations

import os
import time

import torch

from . import configs
from .api import sparse_mla_attention
from .formats import quantize_fp8_ds_mla
from .indexer import (fp8_products, mqa_logits, mqa_logits_reference, pack_indexer_k_cache,
                      paged_mqa_logits, paged_mqa_logits_reference)
from .reference import sparse_mla_reference

# (label, format, D_QK, q dtype); fp8_ds_mla always has the 576 geometry.
GEOMETRIES = [
    ("bf16 rows, D_QK 576", "bf16", 576, torch.bfloat16),
    ("fp8_ds_mla rows, D_QK 576", "fp8_ds_mla", 576, torch.bfloat16),
    ("bf16 rows, D_QK 512 (NoPE)", "bf16", 512, torch.bfloat16),
    ("fp16 rows, D_QK 576", "fp16", 576, torch.float16),
]
TOLERANCE = {"bf16": 2e-2, "fp16": 2e-2, "fp8_ds_mla": 3e-2}
# The indexer's scores, relative error (norm) against float64: fp16 products are exact and sum in
# fp32 (1.3e-7 measured); the fp8 tensor cores' sums keep fewer bits (up to 1.7e-4 measured).
INDEXER_TOLERANCE = {"fp16": 1e-5, "fp8": 1e-3}


def _problem(fmt, d_qk, dtype, t, h, k, n, device, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, d_qk, generator=g).to(dtype)
    rows = torch.randn(n, d_qk, generator=g)
    kv = quantize_fp8_ds_mla(rows) if fmt == "fp8_ds_mla" else rows.to(dtype)
    idx = torch.randint(0, n, (t, k), generator=g, dtype=torch.int32)
    idx[:, ::7] = -1  # invalid entries scattered through each row
    lengths = torch.randint(k // 2, k + 1, (t,), generator=g, dtype=torch.int32)
    sink = torch.randn(h, generator=g)
    return [x.to(device) for x in (q, kv, idx, lengths, sink)]


def _timed(call, device: torch.device):
    """``(call(), seconds)``, the device synchronized before the clock stops."""
    start = time.perf_counter()
    result = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def run_check(device: torch.device, *, verbose=print) -> bool:
    """Run every geometry at the device's sizes; print one verdict each; True if all passed."""
    on_gpu = device.type == "cuda"
    # (label, T, H, K, N): decode-sized (split top-k) and, on a GPU, prefill-sized problems.
    sizes = ([("decode", 4, 64, 2048, 65536), ("8-head", 16, 8, 2048, 65536),
              ("few-head", 16, 16, 2048, 65536), ("32-head", 16, 32, 2048, 65536),
              ("prefill", 1024, 16, 512, 32768)] if on_gpu
             else [("decode", 2, 16, 128, 512)])
    if on_gpu:
        name = torch.cuda.get_device_name(device)
        cap = torch.cuda.get_device_capability(device)
        decode = ("the hardware conversion" if configs.fp8_cvt_level(cap) else
                  "bit moves (no e4m3 conversion below SM89)")
        verbose(f"device: {name} (sm{cap[0]}{cap[1]}); fp8 decoded by {decode}")
    else:
        verbose("device: CPU through the Triton interpreter (small problems)")
    all_ok = True
    for label, fmt, d_qk, dtype in GEOMETRIES:
        for size_label, t, h, k, n in sizes:
            q, kv, idx, lengths, sink = _problem(fmt, d_qk, dtype, t, h, k, n, device, seed=t + h)
            scale = d_qk ** -0.5
            try:
                (out, lse), elapsed = _timed(lambda: sparse_mla_attention(
                    q, kv, idx, scale, topk_length=lengths, attn_sink=sink, return_lse=True), device)
            except Exception as exc:  # the verdict line reports it; the exit status says failed
                verbose(f"FAIL  {label:28} {size_label:8} raised {type(exc).__name__}: {exc}")
                all_ok = False
                continue
            ref_out, ref_lse = sparse_mla_reference(q, kv, idx, scale, topk_length=lengths,
                                                    attn_sink=sink)
            out64 = out.double().cpu()
            finite = bool(torch.isfinite(out64).all()) and not bool(torch.isnan(lse).any())
            rel = ((out64 - ref_out).norm() / ref_out.norm()).item()
            lse_err = (lse.double().cpu() - ref_lse).abs().max().item()
            ok = finite and rel < TOLERANCE[fmt] and lse_err < 2e-2
            all_ok &= ok
            verbose(f"{'ok   ' if ok else 'FAIL '} {label:28} {size_label:8} T={t} H={h} K={k}: "
                    f"rel err {rel:.2e}, lse err {lse_err:.1e}, {elapsed * 1e3:.0f} ms")
    return _check_indexer(device, verbose) and all_ok


def _indexer_problems(on_gpu: bool):
    """``(label, function, its float64 reference, arguments)``: a causal prefill chunk of two
    requests and a decode batch of requests with one draft token each (2-D lengths, as vLLM
    passes them)."""
    g = torch.Generator().manual_seed(7)
    heads, d = (64, 128) if on_gpu else (8, 128)
    fp8 = lambda *shape: (torch.randn(*shape, generator=g) * 2).to(torch.float8_e4m3fn)  # noqa: E731
    lens = (300, 724) if on_gpu else (9, 30)
    starts = torch.cat([torch.full((n,), sum(lens[:i]), dtype=torch.int32) for i, n in enumerate(lens)])
    ends = torch.cat([sum(lens[:i]) + torch.arange(1, n + 1, dtype=torch.int32) for i, n in enumerate(lens)])
    k = fp8(sum(lens), d)
    prefill = (fp8(len(starts), heads, d), k, torch.rand(len(k), generator=g) + 0.1,
               torch.randn(len(starts), heads, generator=g), starts, ends, max(lens))
    batch, block, seq = (32, 64, 8000) if on_gpu else (2, 16, 70)
    n_blocks = batch * -(-seq // block)
    cache = pack_indexer_k_cache(fp8(n_blocks, block, d), torch.rand(n_blocks, block, generator=g) + 0.1)
    tables = torch.randperm(n_blocks, generator=g).int().reshape(batch, -1)
    seq_lens = torch.randint(1, seq + 1, (batch,), generator=g)
    lens2 = (seq_lens[:, None] - 1 + torch.arange(2)[None, :]).clamp_min(0).int()
    decode = (fp8(batch, 2, heads, d), cache, torch.randn(batch * 2, heads, generator=g), lens2,
              tables, seq)
    return [(f"indexer prefill H={heads}, {len(starts)} rows", mqa_logits, mqa_logits_reference, prefill),
            (f"indexer decode  H={heads}, {batch}x2 rows", paged_mqa_logits, paged_mqa_logits_reference,
             decode)]


def _check_indexer(device: torch.device, verbose) -> bool:
    """The indexer's two score kernels against their float64 reference; True if both passed."""
    all_ok = True
    products = "fp8" if fp8_products(device) else "fp16"
    bound = INDEXER_TOLERANCE[products]
    for label, fn, reference, args in _indexer_problems(device.type == "cuda"):
        try:
            got, elapsed = _timed(
                lambda: fn(*[x.to(device) if isinstance(x, torch.Tensor) else x for x in args]), device)
        except Exception as exc:  # the verdict line reports it; the exit status says failed
            verbose(f"FAIL  {label:37} raised {type(exc).__name__}: {exc}")
            all_ok = False
            continue
        ref = reference(*args)
        valid = torch.isfinite(ref)
        got = got.double().cpu()[valid]
        rel = ((got - ref[valid]).norm() / ref[valid].norm()).item()
        ok = bool(torch.isfinite(got).all()) and rel < bound
        all_ok &= ok
        verbose(f"{'ok   ' if ok else 'FAIL '} {label:37}: rel err {rel:.2e} ({products} products, "
                f"bound {bound:.0e}), {elapsed * 1e3:.0f} ms")
    return all_ok


def default_device() -> torch.device:
    """The first GPU, else the CPU with the interpreter switched on (before any kernel runs)."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    os.environ["TRITON_INTERPRET"] = "1"
    return torch.device("cpu")
