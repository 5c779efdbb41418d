"""Time the DSA indexer's score kernels (triton_sparse_mla.indexer) at the models' shapes.

Prefill (``mqa_logits``): causal chunks of one request, T new tokens after a context of C
tokens (row i sees keys [0, C + i + 1)), H in {64 (DeepSeek-V3.2), 32 (GLM-5)}, D = 128.
FLOPs counted: 2 H D per (row, key) pair. Decode (``paged_mqa_logits``): B requests of a
context of L tokens each (random block tables over a cache of exactly their blocks), next_n
in {1, 2}; bytes counted: each request's cache blocks (132 bytes per token) read once, plus q,
weights and the logits written. Each figure is set beside the ceilings measured in the same
run (bf16 matmul rate, copy bandwidth), and, where DeepGEMM imports (``deep_gemm``, or vLLM's
vendored ``vllm.third_party.deep_gemm``) and runs on this GPU, beside DeepGEMM's time on the
same inputs with vLLM 0.33's calling convention. Every workload's first rows are checked
against the float64 reference first.

Usage (GPU): python benchmarks/indexer_bench.py OUT.json [prefill|decode]
"""

import json
import sys

import torch

from triton_sparse_mla.bench import header, heat, measure_ceilings, time_us
from triton_sparse_mla.indexer import flat
from triton_sparse_mla.indexer import (mqa_logits, mqa_logits_reference, pack_indexer_k_cache,
                                       paged_mqa_logits, paged_mqa_logits_reference)

D = 128
BLOCK = 64


def _fp8(*shape):
    return (torch.randn(*shape, device="cuda") * 2).to(torch.float8_e4m3fn)


def prefill_inputs(t, ctx, heads):
    n = ctx + t
    starts = torch.zeros(t, dtype=torch.int32, device="cuda")
    ends = torch.arange(ctx + 1, n + 1, dtype=torch.int32, device="cuda")
    return (_fp8(t, heads, D), _fp8(n, D), torch.rand(n, device="cuda") + 0.1,
            torch.randn(t, heads, device="cuda"), starts, ends, n)


def decode_inputs(batch, ctx, next_n, heads):
    per = -(-ctx // BLOCK)
    cache = pack_indexer_k_cache(_fp8(batch * per, BLOCK, D),
                                 torch.rand(batch * per, BLOCK, device="cuda") + 0.1)
    tables = torch.randperm(batch * per, device="cuda").int().reshape(batch, per)
    lens = (ctx - next_n + 1 + torch.arange(next_n, device="cuda")).int().expand(batch, next_n).contiguous()
    width = per * BLOCK
    return (_fp8(batch, next_n, heads, D), cache, torch.randn(batch * next_n, heads, device="cuda"),
            lens, tables, width)


def _deep_gemm():
    for name in ("deep_gemm", "vllm.third_party.deep_gemm"):
        try:
            return __import__(name, fromlist=["_"]), name
        except Exception as exc:  # noqa: BLE001 - any failure means no baseline
            err = f"{name}: {type(exc).__name__}: {exc}"
    return None, err


def deepgemm_prefill(dg, args):
    q, k, k_scale, w, starts, ends, width = args
    return lambda: dg.fp8_fp4_mqa_logits((q, None), (k, k_scale), w, starts, ends, width)


def deepgemm_decode(dg, args):
    q, cache, w, lens, tables, width = args
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    schedule = dg.get_paged_mqa_logits_metadata(lens, BLOCK, sms)
    return lambda: dg.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens, tables, schedule, width)


def _first_rows_error(got, ref_fn, rows):
    ref = ref_fn(rows)
    valid = torch.isfinite(ref)
    got = got[: ref.shape[0]].double().cpu()[valid]
    return ((got - ref[valid]).norm() / ref[valid].norm()).item()


def main(out_path, phase_only=None):
    record = {"header": header(), "ceilings": measure_ceilings(), "rows": []}
    dg, dg_name = _deep_gemm()
    record["header"]["deep_gemm"] = dg_name if dg is not None else None
    # the products on the fp8 tensor cores (SM89 and newer unless TSM_INDEXER_FP8_DOT=0)
    record["header"]["fp8_dot"] = flat.FP8_DOT and torch.cuda.get_device_capability() >= (8, 9)
    record["header"]["tile"] = list(flat.tile(record["header"]["fp8_dot"]))
    ceil = record["ceilings"]
    print(json.dumps(record["header"]), json.dumps(ceil), flush=True)
    work = []
    for heads in (64, 32):
        for t, ctx in ((4096, 0), (8192, 0), (2048, 30720)):
            work.append(("prefill", dict(t=t, ctx=ctx, heads=heads)))
        for batch, ctx, next_n in ((1, 32768, 1), (32, 8192, 1), (32, 8192, 2), (128, 32768, 1),
                                   (8, 131072, 2)):
            work.append(("decode", dict(batch=batch, ctx=ctx, next_n=next_n, heads=heads)))
    for phase, p in work:
        if phase_only not in (None, phase):
            continue
        torch.manual_seed(0)
        if phase == "prefill":
            args = prefill_inputs(**p)
            ours = lambda a=args: mqa_logits(*a)  # noqa: E731
            rows = [x.cpu() if isinstance(x, torch.Tensor) else x for x in args]
            check = lambda n: mqa_logits_reference(rows[0][:n], rows[1], rows[2], rows[3][:n],  # noqa: E731
                                                   rows[4][:n], rows[5][:n], rows[6])
            pairs = sum(range(p["ctx"] + 1, p["ctx"] + p["t"] + 1))
            flops, nbytes = 2 * p["heads"] * D * pairs, None
            baseline = deepgemm_prefill
        else:
            args = decode_inputs(**p)
            ours = lambda a=args: paged_mqa_logits(*a)  # noqa: E731
            q, cache, w, lens, tables, width = [x.cpu() if isinstance(x, torch.Tensor) else x for x in args]
            per = tables.shape[1]
            check = lambda n: paged_mqa_logits_reference(  # noqa: E731
                q[:1], cache, w[: q.shape[1]], lens[:1], tables[:1], width)
            rows_out = p["batch"] * p["next_n"]
            flops = 2 * p["heads"] * D * rows_out * p["ctx"]
            nbytes = (p["batch"] * per * BLOCK * (D + 4) + q.numel() + 4 * w.numel()
                      + 4 * rows_out * p["ctx"])
            baseline = deepgemm_decode
        err = _first_rows_error(ours(), check, 16)
        heat(ours, 1.0)
        us = time_us(ours, graph=phase == "decode")
        row = dict(phase=phase, **p, us=us, rel_err=err, TFLOPs=flops / us / 1e6,
                   matmul_share=flops / us / 1e6 / ceil["matmul_TFLOPs"])
        if nbytes is not None:
            row.update(GBps=nbytes / us / 1e3, copy_share=nbytes / us / 1e3 / ceil["copy_GBps"])
        if dg is not None:
            try:
                fn = baseline(dg, args)
                heat(fn, 1.0)
                row["deep_gemm_us"] = time_us(fn, graph=phase == "decode")
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                row["deep_gemm_error"] = f"{type(exc).__name__}: {exc}"[:300]
        record["rows"].append(row)
        dg_text = (f"DeepGEMM {row['deep_gemm_us']:.1f} us" if "deep_gemm_us" in row
                   else "DeepGEMM -")
        share = (f"{100 * row['copy_share']:.0f}% of copy" if nbytes is not None
                 else f"{100 * row['matmul_share']:.0f}% of bf16 matmul")
        print(f"INDEXER {phase:7} {json.dumps(p):60} {us:10.1f} us  {row['TFLOPs']:6.1f} TFLOP/s  "
              f"{share}  {dg_text}  err {err:.1e}", flush=True)
        with open(out_path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
