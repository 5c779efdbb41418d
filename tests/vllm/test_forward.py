"""The impl's forward through vLLM's sparse-MLA path matches the float64 reference.

Real ``MLAAttention`` layer, real builder and ``CommonAttentionMetadata``, a paged cache with
shuffled blocks and a block stride of 128 rows for 64-row blocks. On CPU the kernels run in
Triton's interpreter (``TRITON_INTERPRET=1``), so sizes stay tiny.
"""

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

NUM_BLOCKS = 16
TOPK = 128

CASES = [
    pytest.param("deepseek_v32", "auto", 4, 64, id="dsv32-bf16-H4"),
    pytest.param("deepseek_v32", "fp8_ds_mla", 4, 64, id="dsv32-fp8-H4"),
    pytest.param("glm_moe_dsa", "fp8_ds_mla", 8, 64, id="glm5-fp8-H8"),
    pytest.param("glm_moe_dsa", "auto", 3, 0, id="nope512-bf16-H3"),
    pytest.param("glm_moe_dsa", "fp8_ds_mla", 3, 0, id="nope512-fp8-H3"),
    # 64 heads (DeepSeek-V3.2 at TP2, or data-parallel attention) and 14 tokens: the sm90 tables'
    # 64-head tile, the Gluon kernel on an SM90 GPU (kernels/gluon_sm90.py) and elsewhere the
    # Triton tile whose probabilities go through the per-SM scratch slot (exchange_p).
    pytest.param("deepseek_v32", "fp8_ds_mla", 64, 64, id="dsv32-fp8-H64"),
    pytest.param("deepseek_v32", "auto", 64, 64, id="dsv32-bf16-H64"),
]


def _topk_rows(batch, seed):
    """Logical top-k positions per token: causal, shuffled, -1 padded; padded tokens all -1."""
    g = torch.Generator().manual_seed(seed)
    rows, owners = [], []
    for r, (q_len, seq_len) in enumerate(zip(batch.query_lens, batch.seq_lens)):
        for i in range(q_len):
            visible = seq_len - q_len + i + 1
            take = min(visible, TOPK - 7 * (i % 2))
            pos = torch.randperm(visible, generator=g)[:take].to(torch.int32)
            row = torch.full((TOPK,), -1, dtype=torch.int32)
            row[:take] = pos
            rows.append(row)
            owners.append(r)
    for _ in range(batch.num_tokens - len(rows)):
        rows.append(torch.full((TOPK,), -1, dtype=torch.int32))
        owners.append(-1)
    return torch.stack(rows), owners


@pytest.mark.parametrize("model,kv_dtype,heads,rope", CASES)
def test_forward_matches_reference(model, kv_dtype, heads, rope, model_dirs, registered, cpu_vllm):
    from vllm.config import set_current_vllm_config

    from triton_sparse_mla.reference import sparse_mla_reference

    config = make_vllm_config(model_dirs[model], kv_cache_dtype=kv_dtype)
    layer, topk_buffer = build_layer(config, num_heads=heads, rope_dim=rope, topk=TOPK, device=DEVICE)
    builder = build_builder(config, layer, device=DEVICE)
    # Decodes of 1 and 2 tokens (MTP-like), a 4-token request, a prefill, one padding request
    # and two padded token rows.
    batch = build_batch([1, 2, 4, 5, 0], [70, 129, 100, 5, 0], num_blocks=NUM_BLOCKS, pad_tokens=2,
                        device=DEVICE)
    metadata = builder.build(0, batch.common)
    width = 576 if kv_dtype == "fp8_ds_mla" else 512 + rope  # (an fp8_ds_mla row holds 576 always)
    cache_dtype = torch.uint8 if kv_dtype == "fp8_ds_mla" else torch.bfloat16
    kv_cache, _ = paged_cache(batch, num_blocks=NUM_BLOCKS, width=width, dtype=cache_dtype, device=DEVICE)

    logical, owners = _topk_rows(batch, seed=1)
    topk_buffer[: batch.num_tokens] = logical.to(DEVICE)
    g = torch.Generator().manual_seed(2)
    T = batch.num_tokens
    # ql_nope arrives head-major from a bmm: a strided view, as in the model.
    q_nope = torch.randn(heads, T, 512, generator=g).to(torch.bfloat16).to(DEVICE).transpose(0, 1)
    q_pe = torch.randn(T, heads, rope, generator=g).to(torch.bfloat16).to(DEVICE)
    if DEVICE == "cpu":
        # vLLM's index-group conversion runs on a CUDA side stream; on CPU take vLLM's
        # per-layer conversion branch instead (same conversion kernel).
        layer.impl.group_conversion_decode_only = True
    with set_current_vllm_config(config):
        out, lse = layer.impl.forward_mqa((q_nope, q_pe), kv_cache, metadata, layer)
    assert lse is None
    assert out.shape == (T, heads, 512) and out.dtype == torch.bfloat16

    rows = physical_rows(batch, owners, logical)
    flat = kv_cache.as_strided((NUM_BLOCKS * 128, kv_cache.shape[2]), (kv_cache.shape[2], 1)).cpu()
    q_ref = (q_nope.cpu(), q_pe.cpu()) if rope else q_nope.cpu()
    if kv_dtype == "fp8_ds_mla" and rope == 0:
        q_ref = (q_nope.cpu(), torch.zeros(T, heads, 64, dtype=torch.bfloat16))
    ref, _ = sparse_mla_reference(q_ref, flat, rows.to(torch.int32), layer.impl.scale)
    got = out.float().cpu()
    assert torch.isfinite(got).all()
    assert torch.equal(got[-2:], torch.zeros_like(got[-2:])), "padded rows must be zeros"
    torch.testing.assert_close(got, ref.float(), atol=2e-2, rtol=2e-2)


# (query tokens, context lengths, the bounds the builder passes: rows, valid entries)
WORKSPACE_BATCHES = {"prefills": ([6, 4], [40, 30], 70, 6 * 40 + 4 * 30),
                     "decodes": ([1] * 8, [20] * 8, 160, 160)}


@pytest.mark.parametrize("batch_kind", sorted(WORKSPACE_BATCHES))
@pytest.mark.parametrize("setting", ["auto", "off"])
def test_fp8_prefill_workspace_through_vllm(setting, batch_kind, model_dirs, registered, cpu_vllm,
                                            monkeypatch):
    """The fp8 prefill workspace (taken here from 1 token on) inside vLLM's forward: the
    paged cache's flat rows, its -1 padding and valid counts, against the reference, its slots
    bounded by the batch's context lengths (no count read back); with
    TRITON_SPARSE_MLA_FP8_WORKSPACE=off it is never built. A batch of decodes reads each row
    once: T x K entries (6.4 per row here) would take the workspace, the bound on the valid
    entries keeps the in-kernel path."""
    from vllm.config import set_current_vllm_config

    from triton_sparse_mla import workspace
    from triton_sparse_mla.reference import sparse_mla_reference

    monkeypatch.setattr(workspace, "MIN_TOKENS", 1)
    # (the prefills' bound gives about 5 valid entries per distinct row, 360 over 70: the
    # shipped rules ask for 8 to 1024, which so small a batch never reaches)
    monkeypatch.setattr(workspace, "MIN_REUSE", 4)
    monkeypatch.setattr(workspace, "MIN_REUSE_GLUON", ((None, 4, 4),))
    monkeypatch.setenv("TRITON_SPARSE_MLA_FP8_WORKSPACE", setting)
    built, bounds = [], []
    build = workspace.build
    monkeypatch.setattr(workspace, "build", lambda *a, **k: bounds.append(
        (k["rows_bound"], k["entries_bound"])) or built.append(build(*a, **k)) or built[-1])
    heads = 8
    config = make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype="fp8_ds_mla")
    layer, topk_buffer = build_layer(config, num_heads=heads, rope_dim=64, topk=TOPK, device=DEVICE)
    builder = build_builder(config, layer, device=DEVICE)
    query_lens, contexts, rows_bound, entries_bound = WORKSPACE_BATCHES[batch_kind]
    batch = build_batch(query_lens, contexts, num_blocks=NUM_BLOCKS, device=DEVICE)
    metadata = builder.build(0, batch.common)
    assert (metadata.rows_bound, metadata.entries_bound) == (rows_bound, entries_bound)
    kv_cache, _ = paged_cache(batch, num_blocks=NUM_BLOCKS, width=576, dtype=torch.uint8, device=DEVICE)
    logical, owners = _topk_rows(batch, seed=3)
    topk_buffer[: batch.num_tokens] = logical.to(DEVICE)
    g = torch.Generator().manual_seed(4)
    T = batch.num_tokens
    q_nope = torch.randn(T, heads, 512, generator=g).to(torch.bfloat16).to(DEVICE)
    q_pe = torch.randn(T, heads, 64, generator=g).to(torch.bfloat16).to(DEVICE)
    if DEVICE == "cpu":
        layer.impl.group_conversion_decode_only = True
    with set_current_vllm_config(config):
        out, _ = layer.impl.forward_mqa((q_nope, q_pe), kv_cache, metadata, layer)
    assert bounds == ([(rows_bound, entries_bound)] if setting == "auto" else [])
    if setting == "off":
        assert not built
    elif batch_kind == "decodes":
        assert built == [None]
    else:  # the slots from the bound (70 rows; the cache has NUM_BLOCKS x 128)
        assert len(built) == 1 and built[0][0].shape[0] <= rows_bound
    assert layer.impl._bounds == {}  # kept for the call only
    rows = physical_rows(batch, owners, logical)
    flat = kv_cache.as_strided((NUM_BLOCKS * 128, kv_cache.shape[2]), (kv_cache.shape[2], 1)).cpu()
    ref, _ = sparse_mla_reference((q_nope.cpu(), q_pe.cpu()), flat, rows.to(torch.int32),
                                  layer.impl.scale)
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)


def test_fp8_workspace_setting_rejects_unknown_values():
    from triton_sparse_mla.vllm_plugin.impl import fp8_workspace_setting

    assert fp8_workspace_setting({}) is None
    assert fp8_workspace_setting({"TRITON_SPARSE_MLA_FP8_WORKSPACE": "OFF"}) is False
    with pytest.raises(ValueError, match="TRITON_SPARSE_MLA_FP8_WORKSPACE: expected 'auto' or 'off', got 'no'"):
        fp8_workspace_setting({"TRITON_SPARSE_MLA_FP8_WORKSPACE": "no"})


@pytest.mark.parametrize("kv_dtype,rope", [("fp8_ds_mla", 0), ("auto", 64)])
def test_layers_warm_up_their_kernels(kv_dtype, rope, model_dirs, registered, cpu_vllm, monkeypatch):
    """Building a layer warms up the kernels for its kind of call, once per kind in the process:
    its heads, the model dtype, its row format (NoPE fp8_ds_mla rows take 576-wide queries, the
    rope part zero), the indexer's top-k, vLLM's token budget, lengths passed, no lse; with
    TRITON_SPARSE_MLA_WARMUP=off it does not."""
    from triton_sparse_mla import warmup
    from triton_sparse_mla.vllm_plugin import impl

    kinds = []
    monkeypatch.setattr(warmup, "warmup", lambda **kind: kinds.append(kind) or [])
    monkeypatch.setattr(impl, "_WARMED", set())
    monkeypatch.setenv("TRITON_SPARSE_MLA_WARMUP", "on")
    config = make_vllm_config(model_dirs["glm_moe_dsa"], kv_cache_dtype=kv_dtype)
    build_layer(config, num_heads=8, rope_dim=rope, topk=TOPK, device=DEVICE)
    build_layer(config, num_heads=8, rope_dim=rope, topk=TOPK, device=DEVICE,
                name="model.layers.1.self_attn.attn")
    assert len(kinds) == 1 and kinds[0].pop("device").type == torch.device(DEVICE).type
    assert kinds == [dict(num_heads=8, q_dtype=torch.bfloat16,
                          kv_format="fp8_ds_mla" if kv_dtype == "fp8_ds_mla" else "bf16",
                          d_qk=576 if kv_dtype == "fp8_ds_mla" or rope else 512, topk=TOPK,
                          max_tokens=config.scheduler_config.max_num_batched_tokens,
                          topk_length=True, return_lse=False, attn_sink=False)]
    monkeypatch.setenv("TRITON_SPARSE_MLA_WARMUP", "off")
    build_layer(config, num_heads=4, rope_dim=rope, topk=TOPK, device=DEVICE,
                name="model.layers.2.self_attn.attn")
    assert len(kinds) == 1
    with pytest.raises(ValueError, match="TRITON_SPARSE_MLA_WARMUP: expected 'on' or 'off', got 'yes'"):
        impl.warmup_setting({"TRITON_SPARSE_MLA_WARMUP": "yes"})


@pytest.mark.parametrize("model,kv_dtype,heads,rope", [
    pytest.param("deepseek_v32", "auto", 4, 64, id="dsv32-bf16-H4"),
    pytest.param("glm_moe_dsa", "fp8_ds_mla", 3, 0, id="nope512-fp8-H3"),
])
def test_shardq_call_matches_reference(model, kv_dtype, heads, rope, model_dirs, registered, cpu_vllm,
                                       monkeypatch):
    """A ShardQ call (vLLM 0.34, tensor parallelism 2): the layer's impl takes ShardQ, warms up
    for its own and both ranks' heads, and attends this rank's share of the prefill tokens with
    both ranks' heads, its top-k rows read after the decodes' (``topk_start``), on the metadata
    narrowed by the builder as vLLM's ``build_shardq_metadata`` narrows it (that function,
    which needs a process group, replaced by its narrowing) and keeping the batch's bound on the
    rows it reads; against the reference."""
    import dataclasses
    from types import SimpleNamespace

    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import sparse_mla_attention
    from vllm.model_executor.layers.attention.sparse_mla_attention import SparseMLACommonMetadata

    from triton_sparse_mla import warmup
    from triton_sparse_mla.reference import sparse_mla_reference
    from triton_sparse_mla.vllm_plugin import impl

    if "topk_start" not in {f.name for f in dataclasses.fields(SparseMLACommonMetadata)}:
        pytest.skip("this vLLM has no ShardQ (0.34 brought it)")
    world = 2
    kinds = []
    monkeypatch.setattr(warmup, "warmup", lambda **kind: kinds.append(kind["num_heads"]) or [])
    monkeypatch.setattr(impl, "_WARMED", set())
    monkeypatch.setenv("TRITON_SPARSE_MLA_WARMUP", "on")
    config = make_vllm_config(model_dirs[model], kv_cache_dtype=kv_dtype)
    config.parallel_config.tensor_parallel_size = world
    with set_current_vllm_config(config):
        layer, topk_buffer = build_layer(config, num_heads=heads, rope_dim=rope, topk=TOPK, device=DEVICE)
    assert layer.impl.use_shardq and kinds == [heads, world * heads]
    config.parallel_config.tensor_parallel_size = 1  # the builder below is a single process's
    builder = build_builder(config, layer, device=DEVICE)
    batch = build_batch([1, 2, 9, 6], [70, 129, 100, 6], num_blocks=NUM_BLOCKS, device=DEVICE)
    # This rank's tokens after the decodes (vLLM splits each request zigzag over the ranks).
    local = torch.tensor([0, 1, 2, 5, 9, 10, 14])

    def narrow(common, vllm_config, metadata, device):  # build_shardq_metadata's narrowing
        nd = metadata.num_decode_tokens
        ids = (local + nd).to(metadata.req_id_per_token.device)
        return SimpleNamespace(attn_metadata=dataclasses.replace(
            metadata, num_decodes=0, num_decode_tokens=0, req_id_per_token=metadata.req_id_per_token[ids],
            topk_start=nd))

    monkeypatch.setattr(sparse_mla_attention, "build_shardq_metadata", narrow)
    builder.use_shardq = True
    metadata = builder.build(0, batch.common)
    nd = metadata.num_decode_tokens
    narrowed = metadata.shardq.attn_metadata
    assert nd == 1 and metadata.topk_start == 0 and narrowed.topk_start == nd
    assert narrowed.rows_bound == metadata.rows_bound == 70 + 129 + 100 + 6
    # (query tokens 1, 2, 9, 6 times each context, the 129-row one cut to TOPK = 128)
    assert narrowed.entries_bound == metadata.entries_bound == 70 + 2 * 128 + 9 * 100 + 6 * 6
    cache_dtype = torch.uint8 if kv_dtype == "fp8_ds_mla" else torch.bfloat16
    # (fp8_ds_mla rows are 656 bytes with or without rope; a NoPE query meets the rope as zero)
    width = 576 if kv_dtype == "fp8_ds_mla" else 512 + rope
    kv_cache, _ = paged_cache(batch, num_blocks=NUM_BLOCKS, width=width, dtype=cache_dtype, device=DEVICE)
    logical, owners = _topk_rows(batch, seed=5)
    # The indexer wrote the decodes' top-k first, then this rank's tokens', compactly.
    topk_buffer.fill_(-1)
    topk_buffer[:nd] = logical[:nd].to(DEVICE)
    topk_buffer[nd:nd + len(local)] = logical[local + nd].to(DEVICE)
    # The query as vLLM's shard_q hands it over: [T_rank, world * H, 512 + rope], contiguous.
    g = torch.Generator().manual_seed(6)
    q = torch.randn(len(local), world * heads, 512 + rope, generator=g).to(torch.bfloat16)
    if DEVICE == "cpu":
        layer.impl.group_conversion_decode_only = True
    with set_current_vllm_config(config):
        out, _ = layer.impl.forward_mqa(q.to(DEVICE), kv_cache, narrowed, layer)
    assert out.shape == (len(local), world * heads, 512) and out.is_contiguous()
    rows = physical_rows(batch, [owners[t] for t in (local + nd).tolist()], logical[local + nd])
    flat = kv_cache.as_strided((NUM_BLOCKS * 128, kv_cache.shape[2]), (kv_cache.shape[2], 1)).cpu()
    q_ref = q if rope else (q, torch.zeros(len(local), world * heads, 64, dtype=torch.bfloat16))
    ref, _ = sparse_mla_reference(q_ref, flat, rows.to(torch.int32), layer.impl.scale)
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)
