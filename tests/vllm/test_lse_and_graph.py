"""LSE on request, and (GPU only) a CUDA graph around the impl's forward replays correctly."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package

import torch  # noqa: E402

from conftest import make_vllm_config  # noqa: E402
from plugin_paged import build_batch, build_builder, build_layer, paged_cache, physical_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU runs need TRITON_INTERPRET=1", allow_module_level=True)

TOPK = 128
NUM_BLOCKS = 12


def _setup(model_dirs, kv_dtype, name):
    config = make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype=kv_dtype)
    layer, topk_buffer = build_layer(config, num_heads=4, topk=TOPK, device=DEVICE, name=name)
    builder = build_builder(config, layer, device=DEVICE)
    batch = build_batch([1, 1, 1, 0], [100, 30, 129, 0], num_blocks=NUM_BLOCKS, pad_tokens=1, device=DEVICE)
    cache_dtype = torch.uint8 if kv_dtype == "fp8_ds_mla" else torch.bfloat16
    kv_cache, _ = paged_cache(batch, num_blocks=NUM_BLOCKS, width=576, dtype=cache_dtype, device=DEVICE)
    if DEVICE == "cpu":
        layer.impl.group_conversion_decode_only = True  # see test_forward.py
    return config, layer, topk_buffer, builder.build(0, batch.common), batch, kv_cache


def _fill_topk(topk_buffer, batch, seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.full((batch.num_tokens, TOPK), -1, dtype=torch.int32)
    for t, seq_len in enumerate(batch.seq_lens[:3]):
        take = int(torch.randint(1, min(seq_len, TOPK) + 1, (1,), generator=g))
        rows[t, :take] = torch.randperm(seq_len, generator=g)[:take].int()
    topk_buffer[: batch.num_tokens].copy_(rows.to(DEVICE))
    return rows


def _reference(batch, rows, kv_cache, q, scale):
    from triton_sparse_mla.reference import sparse_mla_reference

    flat = kv_cache.as_strided((NUM_BLOCKS * 128, kv_cache.shape[2]), (kv_cache.shape[2], 1)).cpu()
    phys = physical_rows(batch, [0, 1, 2, -1], rows).to(torch.int32)
    return sparse_mla_reference((q[0].cpu(), q[1].cpu()), flat, phys, scale)


def test_lse_when_asked(model_dirs, registered, cpu_vllm):
    from vllm.config import set_current_vllm_config

    config, layer, topk_buffer, md, batch, kv_cache = _setup(model_dirs, "auto", "model.layers.3.self_attn.attn")
    rows = _fill_topk(topk_buffer, batch, seed=3)
    g = torch.Generator().manual_seed(4)
    q = (torch.randn(batch.num_tokens, 4, 512, generator=g).bfloat16().to(DEVICE),
         torch.randn(batch.num_tokens, 4, 64, generator=g).bfloat16().to(DEVICE))
    layer.impl.need_to_return_lse_for_decode = True  # what vLLM sets under DCP
    with set_current_vllm_config(config):
        out, lse = layer.impl.forward_mqa(q, kv_cache, md, layer)
    ref_out, ref_lse = _reference(batch, rows, kv_cache, q, layer.impl.scale)
    torch.testing.assert_close(lse.cpu(), ref_lse.float(), atol=1e-2, rtol=1e-3)
    assert torch.isneginf(lse[-1]).all() and torch.equal(out[-1].cpu(), torch.zeros(4, 512, dtype=out.dtype))
    torch.testing.assert_close(out.float().cpu(), ref_out.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_ds_mla"])
def test_cuda_graph_replay(kv_dtype, model_dirs, registered):
    from vllm.config import set_current_vllm_config

    config, layer, topk_buffer, md, batch, kv_cache = _setup(model_dirs, kv_dtype, f"model.layers.4{kv_dtype[0]}.self_attn.attn")
    q = (torch.empty(batch.num_tokens, 4, 512, dtype=torch.bfloat16, device=DEVICE),
         torch.empty(batch.num_tokens, 4, 64, dtype=torch.bfloat16, device=DEVICE))
    _fill_topk(topk_buffer, batch, seed=5)
    torch.randn(q[0].shape, out=q[0]), torch.randn(q[1].shape, out=q[1])
    with set_current_vllm_config(config):
        layer.impl.forward_mqa(q, kv_cache, md, layer)  # warm-up compiles the kernels
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = layer.impl.forward_mqa(q, kv_cache, md, layer)
    for seed in (6, 7):
        rows = _fill_topk(topk_buffer, batch, seed=seed)
        g = torch.Generator().manual_seed(seed)
        q[0].copy_(torch.randn(q[0].shape, generator=g)), q[1].copy_(torch.randn(q[1].shape, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, _ = _reference(batch, rows, kv_cache, q, layer.impl.scale)
        torch.testing.assert_close(out.float().cpu(), ref_out.float(), atol=2e-2, rtol=2e-2)
