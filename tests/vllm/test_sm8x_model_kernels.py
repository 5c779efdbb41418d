"""vLLM's fp8 DSA-layer kernels, replaced below SM89 (vllm_plugin/sm8x_model_kernels.py),
against vLLM's own kernels run in Triton's interpreter.

Where the fp8 bytes differ, ours must be the better rounding of the same value: Triton 3.8's
interpreter converts fp32 to e4m3 with ties away from zero and drops the carry into the
exponent (127.4 becomes 64, not 128), which the GPU's conversion does not. And vLLM's
``fused_norm_rope``, called as the replacement calls it, must compile for sm80 where its
fused form cannot (a compile probe, without the interpreter, in a subprocess).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package
K = pytest.importorskip("vllm.models.deepseek_v32.common.kernels")

from problems import rope_reference  # noqa: E402
from triton_sparse_mla.formats import dequantize_fp8_ds_mla  # noqa: E402
from triton_sparse_mla.indexer import unpack_indexer_k_cache  # noqa: E402
from triton_sparse_mla.vllm_plugin import sm8x_model_kernels as sm8x  # noqa: E402

FP8 = torch.float8_e4m3fn
P = 64  # rope positions


@pytest.fixture(autouse=True)
def _no_device_queries(monkeypatch):
    """vLLM's wrappers ask the platform for PDL and SM100 scales: a CPU answers no."""
    monkeypatch.setattr(K.current_platform, "is_arch_support_pdl", lambda: False)
    monkeypatch.setattr(K, "mqa_logits_use_mx_scales", lambda: False)


def _no_worse(ours: torch.Tensor, theirs: torch.Tensor, truth: torch.Tensor, scale=1.0):
    """fp8 ``ours`` and ``theirs`` (dequantized with ``scale``) agree on most elements, and where
    they differ ours is at least as close to ``truth``."""
    a, b = ours.float() * scale, theirs.float() * scale
    differ = ours.view(torch.uint8) != theirs.view(torch.uint8)
    assert differ.float().mean() < 0.1, f"{differ.float().mean():.1%} of the fp8 values differ"
    t = truth.float()
    assert ((a - t).abs() <= (b - t).abs() + 1e-6)[differ].all()


def _on(args, device):
    """``args`` with its tensors on ``device`` (built on the CPU from a seeded generator)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _q_args(g, interleave):
    t, hq, hi = 5, 4, 8
    return dict(
        positions=torch.randint(0, P, (t,), generator=g),
        q_pe=torch.randn(t, hq, 64, generator=g).bfloat16(),
        q_pe_cos_sin_cache=torch.randn(P, 64, generator=g),
        index_q=(torch.randn(t, hi, 128, generator=g) * 3).bfloat16(),
        index_q_cos_sin_cache=torch.randn(P, 64, generator=g),
        ql_nope=torch.randn(t, hq, 512, generator=g).bfloat16(),
        q_scale=torch.ones(1),
        index_weights=torch.randn(t, hi, generator=g).bfloat16(),
        index_weights_softmax_scale=128 ** -0.5, index_weights_head_scale=hi ** -0.5,
        has_indexer=True, index_rope_interleave=interleave, quantize_mqa=False)


@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "interleaved"])
def test_fused_q_matches_vllms(interleave, device):
    args = _on(_q_args(torch.Generator().manual_seed(int(interleave)), interleave), device)
    q8_ref, w_ref, q_pe_ref = K.fused_q(**args)
    q8, w, q_pe = sm8x._fused_q(K.fused_q)(**args)
    assert torch.allclose(q_pe.float(), q_pe_ref.float(), rtol=2 ** -7, atol=1e-6)
    assert torch.equal(w, w_ref)  # the same power-of-two scales, the same products
    roped = rope_reference(args["index_q"], args["index_q_cos_sin_cache"], args["positions"], interleave)
    scale = torch.exp2(torch.ceil(torch.log2(roped.abs().amax(-1).clamp_min(1e-4) / 448)))[..., None]
    _no_worse(q8, q8_ref, roped, scale)
    _rounded_once(q8.view(torch.uint8), roped, scale)
    # a shared layer (no indexer) only ropes the MLA query
    shared = dict(args, has_indexer=False, index_q=None, index_q_cos_sin_cache=None, index_weights=None)
    assert torch.equal(sm8x._fused_q(K.fused_q)(**shared)[2], q_pe)


def test_fp8_mla_queries_are_refused():
    args = _q_args(torch.Generator().manual_seed(0), False)
    with pytest.raises(NotImplementedError, match="quantize_mqa"):
        sm8x._fused_q(K.fused_q)(**dict(args, quantize_mqa=True))


def _norm_rope_args(g, mla_dtype, interleave):
    t, blocks, bs = 6, 3, 16
    slots = torch.tensor([17, 3, -1, 40, 0, 31])  # -1: a padding token
    mla_cache = (torch.zeros(blocks, bs, 656, dtype=torch.uint8) if mla_dtype == "fp8_ds_mla"
                 else torch.zeros(blocks, bs, 576, dtype=torch.bfloat16))
    kv_c, k_pe = (torch.randn(t, 512, generator=g) * 2).bfloat16(), torch.randn(t, 64, generator=g).bfloat16()
    return dict(
        positions=torch.randint(0, P, (t,), generator=g),
        q_c=torch.randn(t, 96, generator=g).bfloat16(), q_rms_norm_w=torch.rand(96, generator=g) + 0.5,
        q_rms_eps=1e-6, kv_c=kv_c, kv_rms_norm_w=torch.rand(512, generator=g) + 0.5, kv_rms_eps=1e-6,
        k_pe=k_pe, k_rope_cos_sin_cache=torch.randn(P, 64, generator=g),
        index_k=(torch.randn(t, 128, generator=g) * 3).bfloat16(),
        index_k_layer_norm_w=torch.rand(128, generator=g) + 0.5,
        index_k_layer_norm_bias=torch.randn(128, generator=g) * 0.1, index_k_layer_norm_eps=1e-6,
        index_k_rope_cos_sin_cache=torch.randn(P, 64, generator=g),
        topk_indices_buffer=torch.zeros(t, 16, dtype=torch.int32),
        slot_mapping=slots, indexer_slot_mapping=slots,
        indexer_k_cache=torch.zeros(blocks, bs, 132, dtype=torch.uint8),
        mla_kv_cache=mla_cache, mla_kv_cache_dtype=mla_dtype, has_indexer=True,
        index_rope_interleave=interleave, kv_c_out=torch.empty_like(kv_c), k_pe_out=torch.empty_like(k_pe))


def _fresh(args):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _exact_rows(args):
    """The rows the caches quantize, in float64 from the inputs by vLLM's formulas: the MLA
    latent after its RMS norm, and the indexer key after its LayerNorm and rope."""
    x = args["kv_c"].double()
    latent = (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + args["kv_rms_eps"])
              * args["kv_rms_norm_w"].double())
    k = args["index_k"].double()
    centred = k - k.mean(-1, keepdim=True)
    k = (centred * torch.rsqrt((centred * centred).mean(-1, keepdim=True) + args["index_k_layer_norm_eps"])
         * args["index_k_layer_norm_w"].double() + args["index_k_layer_norm_bias"].double())
    keys = rope_reference(k, args["index_k_rope_cos_sin_cache"], args["positions"],
                          args["index_rope_interleave"])
    return latent, keys


def _rounded_once(ours: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor):
    """fp8 ``ours`` is the exact values divided by ``scale``, rounded to fp8 once, but for at
    most a few values (fp32's rounding of the inputs' arithmetic can cross an fp8 midpoint). A
    rounding to bf16 first moves about one value in thirty."""
    differ = ours.view(torch.uint8) != (exact / scale).to(FP8).view(torch.uint8)
    assert differ.sum() <= max(2, differ.numel() // 200), f"{int(differ.sum())} of {differ.numel()} differ"


@pytest.mark.parametrize("mla_dtype", ["auto", "fp8_ds_mla"])
@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "interleaved"])
def test_fused_norm_rope_matches_vllms(mla_dtype, interleave, device):
    args = _on(_norm_rope_args(torch.Generator().manual_seed(7), mla_dtype, interleave), device)
    ref, ours = _fresh(args), _fresh(args)
    q_ref = K.fused_norm_rope(**ref)
    q_ours = sm8x._fused_norm_rope(K.fused_norm_rope)(**ours)
    assert torch.equal(q_ours, q_ref)
    assert torch.equal(ours["topk_indices_buffer"], ref["topk_indices_buffer"])
    latent, keys_exact = _exact_rows(args)
    keys, scales = unpack_indexer_k_cache(ours["indexer_k_cache"][:, :, None])
    keys_ref, scales_ref = unpack_indexer_k_cache(ref["indexer_k_cache"][:, :, None])
    slots = args["slot_mapping"]
    live = slots >= 0
    assert torch.equal(scales.reshape(-1)[slots[live]], scales_ref.reshape(-1)[slots[live]])
    assert (scales.reshape(-1)[slots[live]] > 0).all()
    flat, flat_ref = keys.reshape(-1, 128)[slots[live]], keys_ref.reshape(-1, 128)[slots[live]]
    row_scale = scales.reshape(-1)[slots[live]][:, None]
    _no_worse(flat, flat_ref, keys_exact[live], row_scale)
    _rounded_once(flat, keys_exact[live], row_scale)
    written = torch.zeros(48, dtype=torch.bool, device=device)
    written[slots[live]] = True
    assert (keys.reshape(-1, 128)[~written].view(torch.uint8) == 0).all()  # the padding token wrote nothing
    mla, mla_ref = ours["mla_kv_cache"].reshape(48, -1), ref["mla_kv_cache"].reshape(48, -1)
    if mla_dtype == "auto":
        assert torch.equal(mla, mla_ref)
        return
    assert (mla[~written] == 0).all()
    assert torch.equal(mla[slots[live], 512:], mla_ref[slots[live], 512:])  # scales and bf16 rope
    tile_scale = mla[slots[live], 512:528].view(torch.float32).repeat_interleave(128, dim=1)
    values, values_ref = mla[slots[live], :512].view(FP8), mla_ref[slots[live], :512].view(FP8)
    _no_worse(values, values_ref, latent[live], tile_scale)
    _rounded_once(values, latent[live], tile_scale)
    # and the rows read back as the normed kv_c and the roped k_pe (vLLM's bf16 output), to
    # fp8's precision
    roped = dict(_fresh(args), indexer_k_cache=None, mla_kv_cache=None,
                 k_pe_out=torch.empty_like(args["k_pe"]))
    K.fused_norm_rope(**roped)
    rows = dequantize_fp8_ds_mla(mla[slots[live]])
    truth_rows = torch.cat([latent.float(), roped["k_pe_out"].float()], dim=-1)[live]
    assert torch.allclose(rows, truth_rows, rtol=2 ** -4, atol=tile_scale.max().item() * 2 ** -9)


PROBE = textwrap.dedent(r"""
    import json, sys
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import vllm.models.deepseek_v32.common.kernels as K
    sys.path[:0] = [sys.argv[2], sys.argv[2].rstrip("/").rsplit("/", 1)[0]]  # tests/vllm, tests
    import test_sm8x_model_kernels as T
    from triton_sparse_mla.vllm_plugin import sm8x_model_kernels as sm8x

    K.current_platform.is_arch_support_pdl = lambda: False
    K.mqa_logits_use_mx_scales = lambda: False
    kernel = K._fused_norm_rope_kernel
    launches = []

    class Stop(Exception):
        pass

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((args, kwargs))
                raise Stop
            return launch

    K._fused_norm_rope_kernel = Recorder()
    TYPES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64",
             torch.uint8: "u8", torch.float8_e4m3fn: "fp8e4nv", torch.float16: "fp16"}

    def compile_for_sm80(args, kwargs, kernel=kernel):
        fn = kernel if hasattr(kernel, "arg_names") else kernel.fn
        values = dict(zip(fn.arg_names, args)) | kwargs
        signature, constexprs = {}, {}
        for p in fn.params:
            v = values[p.name]
            if p.is_constexpr or v is None:
                signature[p.name], constexprs[p.name] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                signature[p.name] = "*" + TYPES[v.dtype]
            elif isinstance(v, bool):
                signature[p.name] = "i1"
            elif isinstance(v, int):
                signature[p.name] = "i32" if abs(v) < 2**31 else "i64"
            else:
                signature[p.name] = "fp32"
        try:
            triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 80, 32))
            return "ok"
        except Exception as exc:
            return str(exc).splitlines()[-1][:200]

    out = {}
    for dtype in ("auto", "fp8_ds_mla"):
        args = T._norm_rope_args(torch.Generator().manual_seed(0), dtype, False)
        for name, call in (("vllm", K.fused_norm_rope), ("ours", sm8x._fused_norm_rope(K.fused_norm_rope))):
            launches.clear()
            try:
                call(**T._fresh(args))
            except Stop:
                pass
            out[f"{name}/{dtype}"] = compile_for_sm80(*launches[0])

    # vLLM's sequence packer, compiled at start-up for the key its indexer registers
    from vllm.v1.attention.ops.common import _PACK_SEQ_TRITON_KERNEL as packer
    keys = {"vllm": packer.get_warmup_keys}
    keys["ours"] = sm8x._pack_warmup_keys(packer.get_warmup_keys)
    for name, get_keys in keys.items():
        (key,) = get_keys(dtype=torch.float8_e4m3fn, pad_value=-float("inf"))
        x = torch.empty(1, dtype=key.dtype)
        launch = dict(x_ptr=x, out_ptr=x, lengths_ptr=torch.empty(1, dtype=torch.int32), N=1, D=1,
                      Lmax=1, PAD_VALUE=key.pad_value, PAD_IS_UINT8=key.pad_is_uint8,
                      BLOCK_T=key.block_t, BLOCK_D=key.block_d)
        out[f"{name}/packer"] = compile_for_sm80((), launch, packer.kernel)
    json.dump(out, open(sys.argv[1], "w"))
""")


def test_vllms_kernel_compiles_for_sm80_as_called(tmp_path):
    """Called as the replacement calls it (no fp8 cache), vLLM's kernel compiles for sm80; its
    fused form does not (fp8 tensors, which Triton refuses below SM89). The same for the
    sequence packer's start-up compile that vLLM's indexer registers (fp8) and the one the
    replacement registers instead (bytes)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out), os.path.dirname(__file__)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ours/auto"] == "ok" and result["ours/fp8_ds_mla"] == "ok", result
    assert "fp8e4nv not supported" in result["vllm/auto"], result
    assert "fp8e4nv not supported" in result["vllm/fp8_ds_mla"], result
    assert result["ours/packer"] == "ok" and "fp8e4nv not supported" in result["vllm/packer"], result


@pytest.fixture
def modules(monkeypatch):
    """vLLM's DSA attention and indexer modules and its sequence packer, the four names the
    replacements take restored after the test."""
    import importlib

    attention = importlib.import_module(sm8x.ATTENTION_MODULE)
    indexer = importlib.import_module(sm8x.INDEXER_MODULE)
    packer = importlib.import_module(sm8x.PACKER_MODULE)._PACK_SEQ_TRITON_KERNEL
    for module, name in ((attention, "fused_norm_rope"), (attention, "fused_q"),
                         (indexer, "pack_seq_triton"), (packer, "get_warmup_keys")):
        monkeypatch.setattr(module, name, getattr(module, name))
    return attention, indexer, packer


@pytest.mark.parametrize("capability, setting, served", [
    ((8, 0), "auto", True), ((8, 6), "auto", True), ((8, 9), "auto", False), ((9, 0), "auto", False),
    ((8, 0), "off", False), ((9, 0), "on", True)])
def test_installed_below_sm89(modules, capability, setting, served):
    attention, indexer, packer = modules

    def names():
        return (attention.fused_norm_rope, attention.fused_q, indexer.pack_seq_triton,
                packer.get_warmup_keys)

    before = names()
    assert sm8x.install(capability, setting) is served
    after = names()
    assert [a != b for a, b in zip(after, before)] == [served] * 4
    sm8x.install(capability, setting)  # idempotent: not wrapped twice
    assert names() == after
    if served:
        assert attention.fused_norm_rope.__wrapped__ is before[0]


def test_fp8_packer_warmed_up_as_bytes(modules):
    """vLLM's indexer registers the packer's start-up compile for fp8 queries, which fails
    below SM89; once replaced, that registration compiles the byte kernel the packing runs."""
    _, _, packer = modules
    fp8_key = dict(dtype=FP8, pad_value=-float("inf"))
    (theirs,) = packer.get_warmup_keys(**fp8_key)
    sm8x.install((8, 6), "auto")
    (ours,) = packer.get_warmup_keys(**fp8_key)
    assert theirs.dtype == FP8 and (ours.dtype, ours.pad_value, ours.pad_is_uint8) == (torch.uint8, 0, True)
    assert (ours.block_t, ours.block_d) == (theirs.block_t, theirs.block_d)
    assert packer.get_warmup_keys(dtype=torch.uint8, pad_value=3) == packer.__class__.get_warmup_keys(
        packer, dtype=torch.uint8, pad_value=3)  # other keys unchanged


def test_fp8_queries_packed_as_bytes(modules, device):
    """The decode packer vLLM uses on ragged batches takes fp8 queries as bytes (pads 0)."""
    _, indexer, _ = modules
    original = indexer.pack_seq_triton
    sm8x.install((8, 0), "auto")
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(5, 4, 128, generator=g) * 3).to(FP8).to(device)
    lens = torch.tensor([2, 3], dtype=torch.int32, device=device)
    packed = indexer.pack_seq_triton(q, lens)
    assert packed.dtype == FP8 and packed.shape[:2] == (2, 3)
    assert torch.equal(packed[0, :2].view(torch.uint8), q[:2].view(torch.uint8))
    assert torch.equal(packed[1].view(torch.uint8), q[2:].view(torch.uint8))
    assert (packed[0, 2].view(torch.uint8) == 0).all()
    other = torch.randn(5, 4, 8, generator=g).to(device)  # other dtypes go to vLLM's packer unchanged
    assert torch.equal(indexer.pack_seq_triton(other, lens), original(other, lens))
