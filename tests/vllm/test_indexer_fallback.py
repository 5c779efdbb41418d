"""The DSA indexer's DeepGEMM calls, served by triton_sparse_mla.indexer where DeepGEMM has no
kernels: installed on SM8x only, and reached through vLLM's own wrappers
(``vllm.utils.deep_gemm``) with the arguments its indexer passes, matching the float64
specification."""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package

from problems import indexer_tolerance  # noqa: E402
from triton_sparse_mla.indexer import (  # noqa: E402
    mqa_logits_reference, pack_indexer_k_cache, paged_mqa_logits_reference)
from triton_sparse_mla.vllm_plugin import indexer_fallback  # noqa: E402

D = 128


@pytest.fixture
def deep_gemm(monkeypatch):
    """vLLM's ``vllm.utils.deep_gemm`` with the three globals restored after the test, and its
    ``_lazy_init`` (which asks the GPU for its capability) recorded instead of run: it sets
    DeepGEMM's own globals, as it would, only where none is set yet."""
    dg = pytest.importorskip("vllm.utils.deep_gemm")
    for name in indexer_fallback.IMPL_GLOBALS:
        monkeypatch.setattr(dg, name, getattr(dg, name))
    dg.init_calls = []

    def lazy_init():
        dg.init_calls.append([getattr(dg, name) for name in indexer_fallback.IMPL_GLOBALS])
        if all(getattr(dg, name) is None for name in indexer_fallback.IMPL_GLOBALS):
            for name in indexer_fallback.IMPL_GLOBALS:
                setattr(dg, name, "DeepGEMM's")

    monkeypatch.setattr(dg, "_lazy_init", lambda: lazy_init())
    yield dg
    del dg.init_calls


def _ours(dg):
    return [getattr(dg, name) for name in indexer_fallback.IMPL_GLOBALS] == [
        indexer_fallback._mqa_logits_impl, indexer_fallback._paged_mqa_logits_impl,
        indexer_fallback._paged_mqa_logits_metadata_impl]


@pytest.mark.parametrize("capability, environ, served", [
    ((8, 0), {}, True),
    ((8, 6), {}, True),
    ((8, 9), {}, True),
    ((8, 9), {"TRITON_SPARSE_MLA_INDEXER": "off"}, False),
    ((9, 0), {}, False),
    ((10, 0), {}, False),
    ((12, 0), {}, False),
    ((9, 0), {"TRITON_SPARSE_MLA_INDEXER": "on"}, True),
])
def test_installed_where_deepgemm_has_no_kernels(deep_gemm, capability, environ, served):
    """Installed after DeepGEMM's own initialisation ran (so that it still resolves its other
    calls), once; elsewhere DeepGEMM's calls are left alone."""
    for name in indexer_fallback.IMPL_GLOBALS:
        setattr(deep_gemm, name, None)
    assert indexer_fallback.install(capability, environ) is served
    assert _ours(deep_gemm) is served
    assert indexer_fallback.install(capability, environ) is served  # idempotent
    assert deep_gemm.init_calls == ([[None, None, None]] if served else [])
    if not served:
        assert [getattr(deep_gemm, n) for n in indexer_fallback.IMPL_GLOBALS] == [None] * 3


def test_bad_setting_is_named():
    with pytest.raises(ValueError, match="TRITON_SPARSE_MLA_INDEXER: expected 'auto', 'off' or 'on'"):
        indexer_fallback.install((8, 9), {"TRITON_SPARSE_MLA_INDEXER": "yes"})


def _assert_matches(got, ref):
    """``got``'s valid columns (those where the float64 ``ref``, on the CPU, is finite) within the
    indexer's tolerance of ``ref``, relative to its largest logit; returns the valid mask."""
    valid = torch.isfinite(ref)
    err = (got.double().cpu()[valid] - ref[valid]).abs().max().item()
    scale = max(ref[valid].abs().max().item(), 1.0)
    assert err <= indexer_tolerance(got.device) * scale, f"max error {err} against max |ref| {scale}"
    return valid


def _fp8(g, *shape):
    return (torch.randn(*shape, generator=g) * 2).to(torch.float8_e4m3fn)


def test_prefill_through_vllms_wrapper(deep_gemm, device):
    """``fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, max_seqlen_k)``: causal
    rows of two requests in one gathered key buffer, compressed logits."""
    assert indexer_fallback.install((8, 9), {})
    g = torch.Generator().manual_seed(0)
    lens = (19, 44)
    ks = torch.tensor([0] * lens[0] + [lens[0]] * lens[1], dtype=torch.int32)
    ke = torch.tensor([p + 1 for p in range(lens[0])] + [lens[0] + p + 1 for p in range(lens[1])],
                      dtype=torch.int32)
    m_rows, n_keys, heads, width = len(ks), sum(lens), 16, max(lens)
    q, k = _fp8(g, m_rows, heads, D), _fp8(g, n_keys, D)
    # the scales as vLLM's gather leaves them: [N, 4] bytes viewed as fp32, squeezed
    k_scale = (torch.rand(n_keys, 1, generator=g) + 0.1).view(torch.uint8).view(torch.float32).squeeze(-1)
    weights = torch.randn(m_rows, heads, generator=g)
    q, k, k_scale, weights, ks, ke = (x.to(device) for x in (q, k, k_scale, weights, ks, ke))
    got = deep_gemm.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, width)
    ref = mqa_logits_reference(q, k, k_scale, weights, ks, ke, width)
    assert got.shape == (m_rows, width) and got.dtype == torch.float32
    valid = _assert_matches(got, ref)
    if "logits_dtype" in inspect.signature(deep_gemm.fp8_fp4_mqa_logits).parameters:  # (0.34)
        got16 = deep_gemm.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, width,
                                             logits_dtype=torch.bfloat16)
        assert got16.dtype == torch.bfloat16
        assert torch.allclose(got16.double().cpu()[valid], ref[valid], rtol=1e-2, atol=1e-1)


@pytest.mark.parametrize("next_n", [1, 2])
def test_decode_through_vllms_wrappers(deep_gemm, monkeypatch, next_n, device):
    """The metadata and paged calls as vLLM's decode makes them: 2-D context lengths (row j of
    a request sees ``L - next_n + j + 1`` positions), a ``[num_blocks, 64, 1, 132]`` cache, a
    block table wider than needed."""
    assert indexer_fallback.install((8, 9), {})
    # The metadata wrapper asks the platform for SM90 (it halves its slots there): an SM89
    # device answers no. (Without a GPU the stub driver would crash on the question.)
    monkeypatch.setattr(deep_gemm.current_platform, "is_device_capability_family",
                        lambda *args, **kwargs: False)
    g = torch.Generator().manual_seed(next_n)
    heads, block_size, max_model_len, num_sms = 32, 64, 300, 6
    seq = torch.tensor([1, 130, 190], dtype=torch.int32)  # 1, 3 and 3 blocks of 64
    lens = (seq[:, None] - next_n + 1 + torch.arange(next_n)[None, :]).clamp_min(0).int()
    n_blocks = 12
    cache = pack_indexer_k_cache(_fp8(g, n_blocks, block_size, D),
                                 torch.rand(n_blocks, block_size, generator=g) + 0.1)
    tables = torch.randperm(n_blocks, generator=g)[:9].reshape(3, 3).int()
    tables = torch.cat([tables, torch.full((3, 2), 7777, dtype=torch.int32)], dim=1)
    q = _fp8(g, 3, next_n, heads, D)
    weights = torch.randn(3 * next_n, heads, generator=g)
    lens, cache, tables, q, weights = (x.to(device) for x in (lens, cache, tables, q, weights))
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, block_size, num_sms)
    assert schedule.shape == (num_sms + 1, 2) and schedule.dtype == torch.int32
    got = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, tables, schedule,
                                             max_model_len)
    ref = paged_mqa_logits_reference(q, cache, weights, lens, tables, max_model_len)
    assert got.shape == (3 * next_n, max_model_len) and got.dtype == torch.float32
    assert got.stride(0) % indexer_fallback.LOGITS_ROW_ALIGN == 0
    _assert_matches(got, ref)


def test_fp4_queries_are_refused(deep_gemm):
    assert indexer_fallback.install((8, 9), {})
    q = torch.zeros(2, 4, D // 2, dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="fp4 indexer queries"):
        deep_gemm.fp8_fp4_mqa_logits((q, torch.zeros(2, 4, dtype=torch.int32)),
                                     (torch.zeros(3, D // 2, dtype=torch.int8), torch.zeros(3)),
                                     torch.zeros(2, 4), torch.zeros(2, dtype=torch.int32),
                                     torch.zeros(2, dtype=torch.int32), 3)


def test_warm_up_compiles_once_per_geometry(monkeypatch):
    """Layers warm the indexer kernels up once per (device, heads, head_dim); a model config
    without the indexer's geometry leaves them to compile on first use."""
    calls = []
    monkeypatch.setattr(indexer_fallback.indexer, "warmup", lambda *args: calls.append(args))
    monkeypatch.setattr(indexer_fallback, "_WARMED", set())
    cpu = torch.device("cpu")
    for _ in range(3):
        indexer_fallback.warm_up(cpu, 64, 128)
    indexer_fallback.warm_up(cpu, 32, 128)
    indexer_fallback.warm_up(cpu, None, 128)
    assert calls == [(cpu, 64, 128), (cpu, 32, 128)]


@pytest.mark.parametrize("capability, environ, phrase", [
    ((8, 9), {}, "triton_sparse_mla.indexer (DeepGEMM has no kernels here)"),
    ((8, 0), {}, "vLLM's fp8 kernels of the DSA layers (fused_norm_rope, fused_q)"),
    ((8, 9), {"TRITON_SPARSE_MLA_INDEXER": "off"}, "DSA models fail"),
    ((9, 0), {}, "DeepGEMM"),
])
def test_described_as_installed(capability, environ, phrase):
    """``triton-sparse-mla vllm`` says who scores the indexer, as :func:`install` decides."""
    text = indexer_fallback.describe(capability, environ)
    assert phrase in text
    assert text.startswith("triton_sparse_mla") is (capability[0] == 8 and environ == {})
