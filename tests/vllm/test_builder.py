"""The metadata builder on a real CommonAttentionMetadata of a mixed batch."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package

import torch  # noqa: E402

from conftest import make_vllm_config  # noqa: E402
from plugin_paged import build_batch, build_builder, build_layer  # noqa: E402


def test_builder_mixed_batch(model_dirs, registered, cpu_vllm):
    from vllm.v1.attention.backend import AttentionCGSupport

    from triton_sparse_mla.vllm_plugin.builder import TritonMLASparseMetadata, TritonMLASparseMetadataBuilder

    config = make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype="fp8_ds_mla")
    layer, _ = build_layer(config, num_heads=4, name="model.layers.1.self_attn.attn")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    builder = build_builder(config, layer, device=device)
    assert isinstance(builder, TritonMLASparseMetadataBuilder)
    assert builder.reorder_batch_threshold == 1
    assert TritonMLASparseMetadataBuilder.get_cudagraph_support(config, None) == AttentionCGSupport.UNIFORM_BATCH
    # Two decodes, a 3-token extend, a prefill, a padding request, three padded token rows.
    batch = build_batch([1, 1, 3, 5, 0], [65, 200, 9, 5, 0], num_blocks=20, pad_tokens=3,
                        device=device)
    md = builder.build(0, batch.common)
    assert isinstance(md, TritonMLASparseMetadata)
    # vLLM counts the zero-length padding request among the prefills.
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (2, 2, 3)
    assert md.num_actual_tokens == 13 and md.block_size == 64 and md.topk_tokens == 128
    assert md.prefill is None, "no dense-MHA prefill: every token takes the sparse MQA path"
    assert md.req_id_per_token[:10].tolist() == [0, 1, 2, 2, 2, 3, 3, 3, 3, 3]
    assert torch.equal(md.block_table, batch.common.block_table_tensor)


def test_impl_flags(model_dirs, registered, cpu_vllm):
    config = make_vllm_config(model_dirs["glm_moe_dsa"], kv_cache_dtype="fp8_ds_mla")
    layer, _ = build_layer(config, num_heads=8, name="model.layers.2.self_attn.attn")
    impl = layer.impl
    assert not impl.supports_dense_mha_prefill and layer.prefill_backend is None
    assert not impl.supports_pcp and not impl.supports_dcp
    assert not impl.supports_quant_query_input
    assert impl.lse_base_on_e and not impl.need_to_return_lse_for_decode
    assert not layer.attn_backend.supports_pcp() and not layer.attn_backend.supports_dcp()
