"""End-to-end check through vLLM's ``LLM`` engine: TRITON_MLA_SPARSE against FLASHMLA_SPARSE.

A tiny, randomly initialised DeepSeek-V3.2 model (real MLA and indexer geometry, everything
else shrunk, dense layers only) runs greedy decoding once per attention backend, each in a
fresh process, on the same seeded dummy weights. Prints per-prompt tokens and logprobs, a
verdict, and writes everything as JSON.

Needs a Hopper/Blackwell GPU (N of them with ``--tp N``), vLLM 0.33 or 0.34 (both run on an
H100: docs/gpu-runs.md, runs 288 and 304-306) with DeepGEMM (the DSA indexer uses it) and this
project's plugin. On the device machine:

    bash benchmarks/vllm_device_setup.sh python3 benchmarks/vllm_e2e.py OUT.json

Usage: vllm_e2e.py OUT.json [--timeout S] [--kv-cache-dtype auto|bfloat16|fp8_ds_mla|fp8|fp8_e4m3] [--max-tokens N]
       [--index-topk N] [--long] [--control] [--tp N] [--shard-q on|off] [--indexer ours]
       [--cuda-graphs] [--config-only DIR]

``--indexer ours``: our engine also scores the DSA indexer with triton_sparse_mla.indexer
and replaces vLLM's fp8 DSA-layer kernels (``TRITON_SPARSE_MLA_INDEXER=on``: what SM80/86 get
by default; SM89 gets the indexer only), while the reference keeps DeepGEMM and vLLM's
kernels; the first indexer calls of each kind are checked against the float64 reference in
the engine (``indexer_checks``). Run on an H100 and an H200 (docs/gpu-runs.md, runs 263-276).

``--long``: prompts of 300-1100 tokens (2900 in all) with 2048 tokens per engine step, so a
prefill call has 2048 query tokens and fp8_ds_mla rows go through the workspace of distinct rows
(``triton_sparse_mla.workspace``); the report counts the calls that took it.

``--tp N``: tensor parallelism over N GPUs (8 of the model's 16 heads per rank at N=2), the
workers forked so that this script's patches (dummy weights, the in-engine checks) reach them;
each process writes its checks to a file the engine's process merges. ``--shard-q on|off``
sets vLLM 0.34's ``sparse_mla_shard_q`` (default: vLLM's, on): with ``--long`` and N > 1 its
first step (2048 prompt tokens) runs sharded by token, and the checked calls then carry all 16
heads (the report lists the head counts seen). Not run yet (written 2026-12-05 without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OURS = "TRITON_MLA_SPARSE"
REFERENCE = "FLASHMLA_SPARSE"

MODEL = dict(
    model_type="deepseek_v32",
    architectures=["DeepseekV32ForCausalLM"],
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    first_k_dense_replace=2,  # every layer dense: no fused-MoE kernels needed
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    q_lora_rank=64,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    num_attention_heads=16,  # DeepSeek-V3.2 at TP8
    num_key_value_heads=16,
    index_n_heads=64,  # DeepGEMM's indexer kernels take 32 or 64 heads of 128
    index_head_dim=128,
    index_topk=128,
    max_position_embeddings=4096,
    rope_scaling=None,
    torch_dtype="bfloat16",
    bos_token_id=0,
    eos_token_id=1,
)

PROMPT_LENGTHS = (7, 100, 200, 333)  # two longer than index_topk, so the indexer selects
LONG_PROMPT_LENGTHS = (300, 600, 900, 1100)  # --long: a first engine step of 2048 prompt tokens
ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in this process: the loader patch applies
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_DEEP_GEMM_WARMUP": "skip",
    "DG_JIT_CACHE_DIR": "/tmp/dg",  # shared, so the second engine reuses DeepGEMM's builds
}


def write_model_dir(root: Path) -> Path:
    """Write the tiny model's ``config.json`` under ``root/deepseek_v32_tiny``."""
    path = root / "deepseek_v32_tiny"
    path.mkdir(parents=True, exist_ok=True)
    spec = dict(MODEL)
    try:
        from transformers import AutoConfig

        model_type = spec.pop("model_type")
        AutoConfig.for_model(model_type, **spec).save_pretrained(path)
        written = json.loads((path / "config.json").read_text())
        assert written["model_type"] == model_type and written["index_n_heads"] == MODEL["index_n_heads"]
    except Exception as exc:  # transformers without this model type: vLLM reads plain JSON too
        print(f"config via transformers failed ({exc!r}); writing plain JSON")
        (path / "config.json").write_text(json.dumps(MODEL, indent=2))
    return path


def prompts(lengths=PROMPT_LENGTHS) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(2, MODEL["vocab_size"]) for _ in range(n)] for n in lengths]


# ---------------------------------------------------------------- worker (one engine per process)


def _patch_dummy_loader() -> None:
    """Dummy weights of a usable scale, identical in every process.

    vLLM's dummy loader fills every tensor with U(-1e-3, 1e-3), which makes all logits
    nearly equal (greedy tokens become noise). Here: norms 1 (bias 0), matrices
    U(-b, b) with b = sqrt(3 / fan_in), seeded by the tensor's full name.
    """
    import zlib

    import torch
    from vllm.model_executor.model_loader import dummy_loader

    def load_weights(self, model, model_config):
        for mname, layer in model.named_modules():
            is_norm = "norm" in type(layer).__name__.lower()
            skip = getattr(layer, "_non_persistent_buffers_set", set())
            tensors = list(layer.named_parameters(recurse=False)) + list(layer.named_buffers(recurse=False))
            for pname, t in tensors:
                if pname in skip or not torch.is_floating_point(t) or t.numel() <= 1 or "scale" in pname:
                    continue
                if is_norm:
                    t.data.fill_(1.0 if pname == "weight" else 0.0)
                    continue
                gen = torch.Generator(device=t.device)
                gen.manual_seed(zlib.crc32(f"{mname}.{pname}".encode()))
                bound = (3.0 / t.shape[-1]) ** 0.5 if t.dim() >= 2 else 0.02
                tmp = torch.empty(t.shape, dtype=torch.float32, device=t.device)
                tmp.uniform_(-bound, bound, generator=gen)
                t.data.copy_(tmp)

    dummy_loader.DummyModelLoader.load_weights = load_weights


def _attention_backends(model) -> dict:
    out = {}
    for name, module in model.named_modules():
        impl = getattr(module, "impl", None)
        if impl is None:
            continue
        backend = getattr(module, "attn_backend", None)
        bname = backend.get_name() if backend is not None and hasattr(backend, "get_name") else None
        out[name] = f"{bname}:{type(impl).__name__}"
    return out


REFERENCE_CHECKS = 64  # attention calls of ours checked against the float64 reference


def reference_error(q, kv, indices, sm_scale, topk_length, out) -> dict:
    """Relative error of one attention call's output against the float64 reference.

    Only the rows the call can read are copied to the CPU (the engine's cache is large).
    """
    from triton_sparse_mla.reference import sparse_mla_reference

    import torch

    idx = indices.long()
    valid = (idx >= 0) & (idx < kv.shape[0])
    if topk_length is not None:
        valid &= torch.arange(idx.shape[1], device=idx.device)[None, :] < topk_length.long()[:, None]
    heads = (q[0] if isinstance(q, tuple) else q).shape[1]
    rows, inverse = torch.unique(idx[valid], return_inverse=True)
    local = torch.full_like(idx, -1)
    local[valid] = inverse
    ref, _ = sparse_mla_reference(q, kv[rows], local, sm_scale)
    got = out.double().cpu()
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return dict(tokens=int(idx.shape[0]), heads=int(heads), max_valid=int(valid.sum(1).max().item()),
                rel_err=err)


def _check_ours_against_reference(sink: str) -> None:
    """Wrap the attention call of our impl: each of the first calls is also run in float64.
    Also count the calls that took the fp8 workspace (``workspace_calls``: their token counts).
    Each process (the engine's, and with ``--tp`` each forked worker) writes both lists to
    ``sink.<pid>`` after every record; :func:`_merge_checks` reads them back."""
    import triton_sparse_mla.vllm_plugin.impl as impl
    from triton_sparse_mla import workspace

    checks: list = []
    workspace_calls: list = []
    indexer_checks: list = []
    build = workspace.build

    def save():
        Path(f"{sink}.{os.getpid()}").write_text(json.dumps(dict(
            checks=checks, workspace_calls=workspace_calls, indexer_checks=indexer_checks)))

    def counted_build(kv, indices, *args, **kwargs):
        built = build(kv, indices, *args, **kwargs)
        if built is not None:
            workspace_calls.append(int(indices.shape[0]))
            save()
        return built

    workspace.build = counted_build
    real = impl.sparse_mla_attention

    def checked(q, kv, indices, sm_scale, **kwargs):
        res = real(q, kv, indices, sm_scale, **kwargs)
        if len(checks) < REFERENCE_CHECKS and not _capturing():
            out = res[0] if isinstance(res, tuple) else res
            checks.append(reference_error(q, kv, indices, sm_scale, kwargs.get("topk_length"), out))
            save()
        return res

    impl.sparse_mla_attention = checked
    _check_indexer_against_reference(indexer_checks, save)


INDEXER_CHECKS = 8  # indexer calls of each kind (prefill, decode) checked against float64


def _capturing() -> bool:
    """Whether a CUDA graph is being captured (``--cuda-graphs``): no checks then, as they copy
    to the host."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _check_indexer_against_reference(indexer_checks: list, save) -> None:
    """Where our indexer serves the engine (``TRITON_SPARSE_MLA_INDEXER=on``), wrap its two calls
    as the plugin makes them: each of the first calls of a kind is also run in float64 (a
    prefill call: its last 64 rows; a decode call: its first request)."""
    import torch

    from triton_sparse_mla import indexer
    from triton_sparse_mla.vllm_plugin import indexer_fallback as fallback

    def record(kind, got, ref):
        valid = torch.isfinite(ref)
        got = got[: ref.shape[0]].double().cpu()[valid]
        err = ((got - ref[valid]).norm() / ref[valid].norm().clamp_min(1e-30)).item()
        indexer_checks.append(dict(kind=kind, rows=int(ref.shape[0]), rel_err=err))
        save()

    mqa, paged = fallback.mqa_logits, fallback.paged_mqa_logits

    def mqa_checked(q, k, k_scale, weights, starts, ends, width, **kw):
        out = mqa(q, k, k_scale, weights, starts, ends, width, **kw)
        if (sum(c["kind"] == "prefill" for c in indexer_checks) < INDEXER_CHECKS and q.shape[0] > 0
                and not _capturing()):
            n = min(64, q.shape[0])  # the last rows: the longest key ranges
            record("prefill", out[-n:], indexer.mqa_logits_reference(
                q[-n:], k, k_scale, weights[-n:], starts[-n:], ends[-n:], width))
        return out

    def paged_checked(q, kv_cache, weights, context_lens, block_tables, width, **kw):
        out = paged(q, kv_cache, weights, context_lens, block_tables, width, **kw)
        if (sum(c["kind"] == "decode" for c in indexer_checks) < INDEXER_CHECKS and q.shape[0] > 0
                and not _capturing()):
            record("decode", out, indexer.paged_mqa_logits_reference(
                q[:1], kv_cache, weights[: q.shape[1]], context_lens[:1], block_tables[:1], width))
        return out

    fallback.mqa_logits, fallback.paged_mqa_logits = mqa_checked, paged_checked


def _merge_checks(sink: str) -> tuple[list, list, list]:
    """Every process's checks, workspace calls and indexer checks
    (:func:`_check_ours_against_reference`)."""
    checks, workspace_calls, indexer_checks = [], [], []
    for path in sorted(Path(sink).parent.glob(Path(sink).name + ".*")):
        part = json.loads(path.read_text())
        checks += part["checks"]
        workspace_calls += part["workspace_calls"]
        indexer_checks += part.get("indexer_checks", [])
    return checks, workspace_calls, indexer_checks


PERTURBED = OURS + "_NUDGED"
"""The control: our backend with every attention output nudged by about one bf16 step."""


def _perturb_ours() -> None:
    """Multiply each attention output element of ours by 1 +- 2**-7 (random sign, seeded).

    That is about one bf16 step, the size of the rounding difference between two correct
    bf16 kernels. Comparing ours with this control shows how far the model amplifies such a
    difference on its own (for example through the indexer's top-k choice in later layers).
    """
    import torch

    import triton_sparse_mla.vllm_plugin.impl as impl

    real = impl.sparse_mla_attention
    gen = torch.Generator(device="cuda").manual_seed(1234)

    def nudged(*args, **kwargs):
        res = real(*args, **kwargs)
        out = res[0] if isinstance(res, tuple) else res
        sign = torch.randint(0, 2, out.shape, device=out.device, generator=gen).to(torch.float32) * 2 - 1
        out.copy_(out.float() * (1 + sign * 2.0**-7))
        return res

    impl.sparse_mla_attention = nudged


def run_worker(backend: str, model_dir: str, result: str, kv_cache_dtype: str, max_tokens: int,
               long: bool = False, tp: int = 1, shard_q: str | None = None,
               cuda_graphs: bool = False) -> None:
    from vllm import LLM, SamplingParams

    _patch_dummy_loader()
    sink = result + ".checks"
    if backend == OURS:  # the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        _check_ours_against_reference(sink)
    elif backend == PERTURBED:
        _perturb_ours()
    kwargs = dict(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=not cuda_graphs,
        # CompilationMode.NONE: no torch.compile; with --cuda-graphs, whole decode steps captured
        compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"} if cuda_graphs else 0,
        max_model_len=2048 if long else 1024,
        max_num_batched_tokens=2048 if long else 1024,
        block_size=64,
        max_num_seqs=4,
        gpu_memory_utilization=0.3,
        seed=0,
        tensor_parallel_size=tp,
    )
    # Both backends take the top-k (MQA) path for every prefill. Ours has no other; FlashMLA's
    # would switch prompts no longer than index_topk to dense MHA through flash-attention,
    # which is a different computation (and whose extensions are not carried to the device).
    kwargs["attention_config"] = {"sparse_mla_force_mqa": True}
    if backend == REFERENCE:
        kwargs["attention_config"]["backend"] = REFERENCE
    if shard_q is not None:
        kwargs["attention_config"]["sparse_mla_shard_q"] = shard_q == "on"
    t0 = time.time()
    llm = LLM(**kwargs)
    t_init = time.time() - t0
    try:
        layers = llm.apply_model(_attention_backends)[0]
    except Exception as exc:
        layers = {"error": repr(exc)}
    # Compiles of this project's kernels while generating: none, if the layers' warm-up
    # (TRITON_SPARSE_MLA_WARMUP, on by default) covered every call the engine made.
    from triton import knobs

    serving_compiles = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: serving_compiles.append(kw["repr"]) if (
        "triton_sparse_mla" in str(kw["fn"].module)) else None
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=2, prompt_logprobs=0, ignore_eos=True, detokenize=False
    )
    t0 = time.time()
    lengths = LONG_PROMPT_LENGTHS if long else PROMPT_LENGTHS
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts(lengths)], params, use_tqdm=False)
    t_gen = time.time() - t0
    knobs.runtime.jit_post_compile_hook = None
    checks, workspace_calls, indexer_checks = _merge_checks(sink)
    seqs = []
    for o in outs:
        c = o.outputs[0]
        tokens = list(c.token_ids)
        lps, gaps = [], []
        for tok, d in zip(tokens, c.logprobs or []):
            lps.append(float(d[tok].logprob))
            ranked = sorted((float(v.logprob) for v in d.values()), reverse=True)
            gaps.append(ranked[0] - ranked[1] if len(ranked) > 1 else None)
        plps = [None if d is None else float(next(iter(d.values())).logprob) for d in (o.prompt_logprobs or [])]
        seqs.append(dict(prompt_len=len(o.prompt_token_ids), tokens=tokens, logprobs=lps, top2_gap=gaps,
                         prompt_logprobs=plps))
    Path(result).write_text(json.dumps(dict(backend=backend, layers=layers, init_s=t_init, generate_s=t_gen,
                                            seqs=seqs, reference_checks=checks,
                                            workspace_calls=workspace_calls,
                                            indexer_checks=indexer_checks,
                                            serving_compiles=[r[:120] for r in serving_compiles])))


# ---------------------------------------------------------------- driver


def run_engine(backend: str, model_dir: Path, work: Path, log_path: Path, args, timeout: float) -> dict:
    result = work / f"{backend}.json"
    env = dict(os.environ)
    for k, v in ENV.items():
        env.setdefault(k, v)
    if args.tp > 1:  # the workers inherit this script's patches only when forked
        env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    # force: our backend ranks first; off: vLLM's own selection (the reference is also named explicitly)
    kernel = OURS if backend == PERTURBED else backend
    env["TRITON_SPARSE_MLA_SELECT"] = "force" if kernel == OURS else "off"
    env["TRITON_SPARSE_MLA_INDEXER"] = "on" if kernel == OURS and args.indexer == "ours" else "off"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", backend, str(model_dir), str(result),
           "--kv-cache-dtype", args.kv_cache_dtype, "--max-tokens", str(args.max_tokens)] + (
               ["--long"] if args.long else []) + ["--tp", str(args.tp)] + (
               ["--shard-q", args.shard_q] if args.shard_q else []) + (
               ["--cuda-graphs"] if args.cuda_graphs else [])
    t0 = time.time()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.time() - t0
    log_text = log_path.read_text(errors="replace")
    info = dict(rc=rc, wall_s=round(wall, 1), log=str(log_path))
    info["selection_log"] = [ln.strip()[-300:] for ln in log_text.splitlines()
                             if "triton-sparse-mla" in ln or "attention backend" in ln or "Using " in ln][:10]
    if result.exists():  # written before teardown, so a late hang does not lose it
        info.update(json.loads(result.read_text()))
    else:
        info["log_tail"] = log_text.splitlines()[-40:]
    names = set(info.get("layers", {}).values()) if isinstance(info.get("layers"), dict) else set()
    info["selected"] = sorted(names)
    other = REFERENCE if kernel == OURS else OURS  # (the indexer's cache layer has its own backend)
    info["selected_ok"] = any(n.startswith(kernel + ":") for n in names) and not any(
        n.startswith(other + ":") for n in names)
    print(f"== {backend}: rc={rc} wall={wall:.0f}s selected={sorted(names)} ok={info['selected_ok']}")
    for ln in info["selection_log"]:
        print("   log:", ln)
    if "log_tail" in info:
        print("   --- log tail ---")
        for ln in info["log_tail"][-25:]:
            print("  ", ln[:300])
    if info.get("reference_checks"):
        errs = [c["rel_err"] for c in info["reference_checks"]]
        heads = sorted({c["heads"] for c in info["reference_checks"]})
        print(f"   float64 reference, {len(errs)} attention calls in the engine: max rel err {max(errs):.2e}"
              f" (heads per call: {heads})")
    if info.get("indexer_checks"):
        by_kind = {}
        for c in info["indexer_checks"]:
            by_kind.setdefault(c["kind"], []).append(c["rel_err"])
        for kind, errs in sorted(by_kind.items()):
            print(f"   our indexer ({kind}) against float64, {len(errs)} engine calls: "
                  f"max rel err {max(errs):.2e}")
    if backend == OURS:
        print(f"   fp8 workspace taken by {len(info.get('workspace_calls', []))} calls "
              f"(query tokens {info.get('workspace_calls', [])[:8]})")
    if "serving_compiles" in info:
        print(f"   triton_sparse_mla kernels compiled while generating: {len(info['serving_compiles'])} "
              f"{info['serving_compiles'][:4]}")
    for s in info.get("seqs", []):
        lp = " ".join(f"{x:.3f}" for x in s["logprobs"])
        print(f"   prompt {s['prompt_len']:4d}: tokens {s['tokens']}  logprobs [{lp}]")
    return info


def _max_abs_diff(a, b):
    d = [abs(x - y) for x, y in zip(a, b) if x is not None and y is not None]
    return max(d) if d else None


def compare(ours: dict, ref: dict, tol: float) -> dict:
    """Tokens, logprobs and where the greedy paths split.

    Two correct bf16 implementations differ by about one bf16 step of the logits, so greedy
    decoding may pick differently wherever the top two candidates are that close. A split is
    a near tie when either engine's top-2 logprob gap at that step is at most ``tol``; after
    it the sequences are no longer comparable, so logprobs are compared up to and including
    the split. A split with a clear margin is a failure.
    """
    per = []
    for so, sr in zip(ours["seqs"], ref["seqs"]):
        to, tr = so["tokens"], sr["tokens"]
        first = next((i for i, (x, y) in enumerate(zip(to, tr)) if x != y), None)
        n = len(to) if first is None else first + 1
        gaps = None if first is None else (sr["top2_gap"][first], so["top2_gap"][first])
        near_tie = gaps is not None and min((g for g in gaps if g is not None), default=float("inf")) <= tol
        per.append(dict(prompt_len=so["prompt_len"], tokens_match=to == tr, first_divergence=first,
                        top2_gap_at_divergence=gaps, divergence_is_near_tie=near_tie,
                        max_logprob_diff=_max_abs_diff(so["logprobs"][:n], sr["logprobs"][:n]),
                        max_prompt_logprob_diff=_max_abs_diff(so["prompt_logprobs"], sr["prompt_logprobs"])))
    return dict(per_prompt=per, all_tokens_match=all(p["tokens_match"] for p in per),
                splits_only_at_near_ties=all(p["tokens_match"] or p["divergence_is_near_tie"] for p in per),
                max_logprob_diff=max((p["max_logprob_diff"] or 0.0) for p in per),
                max_prompt_logprob_diff=max((p["max_prompt_logprob_diff"] or 0.0) for p in per))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_json", nargs="?")
    ap.add_argument("--timeout", type=float, default=200.0,
                    help="seconds per engine process; the first gets 1.5x (DeepGEMM's nvcc builds)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bfloat16", "fp8_ds_mla", "fp8", "fp8_e4m3"])
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--index-topk", type=int, default=MODEL["index_topk"],
                    help="rows the DSA indexer keeps; at least the longest prompt (e.g. 512) makes "
                         "every layer attend to every token, which takes the indexer's choice out")
    ap.add_argument("--long", action="store_true",
                    help="prompts of 300-1100 tokens, 2048 per engine step (prefill calls of 2048 tokens)")
    ap.add_argument("--tol", type=float, default=0.05, help="max logprob difference for a pass")
    ap.add_argument("--control", action="store_true",
                    help=f"also run {PERTURBED} (ours, outputs nudged by one bf16 step) and report how far "
                         "the model alone amplifies such a difference")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallelism (GPUs)")
    ap.add_argument("--shard-q", choices=["on", "off"],
                    help="vLLM 0.34's sparse_mla_shard_q (default: vLLM's own, on)")
    ap.add_argument("--indexer", choices=["ours", "deepgemm"], default="deepgemm",
                    help="who scores the DSA indexer in our engine (the reference keeps DeepGEMM)")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="capture decode steps in CUDA graphs (FULL_DECODE_ONLY, no torch.compile) "
                         "instead of running eagerly; the report's compiles-while-generating then "
                         "say whether vLLM's warm-up reached every kernel of ours")
    ap.add_argument("--config-only", metavar="DIR", help="write the model config under DIR and stop")
    ap.add_argument("--worker", nargs=3, metavar=("BACKEND", "MODEL_DIR", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.control and args.cuda_graphs:  # (the nudge draws random signs, not graph-safe)
        ap.error("--control runs eagerly only: leave out --cuda-graphs")
    if args.worker:
        run_worker(*args.worker, args.kv_cache_dtype, args.max_tokens, args.long, args.tp, args.shard_q,
                   args.cuda_graphs)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the result is written: skip engine teardown, which can hang
    MODEL["index_topk"] = args.index_topk
    if args.config_only:
        print(write_model_dir(Path(args.config_only)))
        return 0
    if not args.out_json:
        ap.error("out_json is required")
    out = Path(args.out_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = dict(kv_cache_dtype=args.kv_cache_dtype, max_tokens=args.max_tokens, tp=args.tp,
                  cuda_graphs=args.cuda_graphs,
                  shard_q=args.shard_q, indexer=args.indexer, model=MODEL,
                  prompt_lengths=list(LONG_PROMPT_LENGTHS if args.long else PROMPT_LENGTHS))
    with tempfile.TemporaryDirectory(prefix="vllm_e2e_") as tmp:
        model_dir = write_model_dir(Path(tmp))
        engines = (OURS, REFERENCE) + ((PERTURBED,) if args.control else ())
        for i, backend in enumerate(engines):  # ours first: it matters most if time runs out
            log_path = out.with_name(f"{out.stem}.{backend}.log")
            timeout = args.timeout * (1.5 if i == 0 else 1.0)
            report[backend] = run_engine(backend, model_dir, Path(tmp), log_path, args, timeout)
            out.write_text(json.dumps(report, indent=1))
    ours, ref = report[OURS], report[REFERENCE]
    if ours.get("seqs") and ref.get("seqs"):
        cmp = compare(ours, ref, args.tol)
        report["compare"] = cmp
        for p in cmp["per_prompt"]:
            split = "" if p["tokens_match"] else (
                f" split at step {p['first_divergence']}, top-2 gaps (ref, ours) {p['top2_gap_at_divergence']}"
                f" near tie={p['divergence_is_near_tie']}")
            print(f"   prompt {p['prompt_len']:4d}: tokens_match={p['tokens_match']}{split} "
                  f"max|dlogprob|={p['max_logprob_diff']:.4f} "
                  f"max|dprompt_logprob|={p['max_prompt_logprob_diff'] or 0.0:.4f}")
        passed = ours["selected_ok"] and ref["selected_ok"] and cmp["splits_only_at_near_ties"] and \
            cmp["max_logprob_diff"] <= args.tol and cmp["max_prompt_logprob_diff"] <= args.tol
        verdict = "PASS" if passed else "FAIL"
        report["verdict"] = verdict
        errs = [c["rel_err"] for c in ours.get("reference_checks", [])]
        if errs:
            print(f"IN-ENGINE CHECK: our attention against float64 on {len(errs)} engine calls: "
                  f"max rel err {max(errs):.2e} (bf16 kernels land near 5e-3)")
        print(f"VERDICT {verdict}: ours selected={ours['selected_ok']} ref selected={ref['selected_ok']} "
              f"tokens match={cmp['all_tokens_match']} splits only at near ties={cmp['splits_only_at_near_ties']} "
              f"max|dlogprob|={cmp['max_logprob_diff']:.4f} "
              f"max|dprompt_logprob|={cmp['max_prompt_logprob_diff']:.4f} (tol {args.tol})")
    else:
        report["verdict"] = "INCOMPLETE"
        print(f"VERDICT INCOMPLETE: {OURS} rc={ours['rc']}, {REFERENCE} rc={ref['rc']} (see the logs)")
    control = report.get(PERTURBED, {})
    if ours.get("seqs") and control.get("seqs"):
        ctl = compare(ours, control, args.tol)
        report["control"] = ctl
        print(f"CONTROL {OURS} against {PERTURBED}: tokens match={ctl['all_tokens_match']} "
              f"splits only at near ties={ctl['splits_only_at_near_ties']} "
              f"max|dlogprob|={ctl['max_logprob_diff']:.4f} max|dprompt_logprob|={ctl['max_prompt_logprob_diff']:.4f}")
    out.write_text(json.dumps(report, indent=1))
    return 0 if report["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
