"""Real vLLM objects for one sparse-MLA layer on our backend, and a paged cache to attend over.

``build_layer`` constructs vLLM's own ``MLAAttention`` (which instantiates our impl),
``build_batch`` a ``CommonAttentionMetadata`` of mixed requests, and ``paged_cache`` a cache
whose block stride exceeds the block, with NaN in every row no request owns.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch

KV_LORA_RANK = 512
ROPE_DIM = 64
BLOCK = 64
PAD_ROWS = 64
"""Rows of other layers' pages between two blocks of this cache (block stride = 128 rows)."""


def init_single_process_distributed(vllm_config) -> None:
    """A one-rank gloo world with TP = PP = 1, as vLLM's layers need (idempotent)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config):
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                        distributed_init_method=f"tcp://127.0.0.1:{port}",
                                        backend="gloo")
        ps.initialize_model_parallel(1, 1)


def build_layer(vllm_config, *, num_heads, rope_dim=ROPE_DIM, topk=128, device="cpu",
                name="model.layers.0.self_attn.attn"):
    """vLLM's ``MLAAttention`` on ``TritonMLASparseBackend``; returns ``(layer, topk_buffer)``."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from triton_sparse_mla.vllm_plugin.backend import TritonMLASparseBackend

    init_single_process_distributed(vllm_config)
    topk_buffer = torch.full((vllm_config.scheduler_config.max_num_batched_tokens, topk), -1,
                             dtype=torch.int32, device=device)
    with set_current_vllm_config(vllm_config):
        kv_b_proj = ColumnParallelLinear(KV_LORA_RANK, num_heads * 256, bias=False,
                                         prefix=name.replace(".attn", ".kv_b_proj"))
        layer = MLAAttention(
            num_heads=num_heads, scale=0.0625, qk_nope_head_dim=128, qk_rope_head_dim=rope_dim,
            v_head_dim=128, q_lora_rank=64, kv_lora_rank=KV_LORA_RANK, kv_b_proj=kv_b_proj,
            cache_config=vllm_config.cache_config, prefix=name, attn_backend=TritonMLASparseBackend,
            use_sparse=True, topk_indices_buffer=topk_buffer,
        )
    return layer, topk_buffer


def build_builder(vllm_config, layer, device="cpu"):
    """Our metadata builder for ``layer``'s customised KV cache spec."""
    from vllm.config import set_current_vllm_config

    backend = layer.attn_backend
    spec = backend.customize_spec(layer.get_kv_cache_spec(vllm_config))
    with set_current_vllm_config(vllm_config):
        return backend.get_builder_cls()(spec, [layer.layer_name], vllm_config, torch.device(device))


@dataclass
class Batch:
    common: object  # CommonAttentionMetadata
    query_lens: list[int]
    seq_lens: list[int]
    block_table: torch.Tensor  # int32 [R, max_blocks]
    num_tokens: int  # including padded tokens


def build_batch(query_lens, seq_lens, *, num_blocks, pad_tokens=0, seed=0, device="cpu"):
    """``CommonAttentionMetadata`` for requests in order, with a shuffled block table.

    Trailing requests with query length 0 are padding; ``pad_tokens`` extra token rows
    belong to no request (as in a padded CUDA-graph batch).
    """
    from vllm.v1.attention.backend import CommonAttentionMetadata

    g = torch.Generator().manual_seed(seed)
    num_reqs = len(query_lens)
    max_blocks = max(1, -(-max(seq_lens) // BLOCK))
    if num_reqs * max_blocks > num_blocks:
        raise ValueError(f"num_blocks: need {num_reqs * max_blocks}, got {num_blocks}")
    block_table = torch.randperm(num_blocks, generator=g)[: num_reqs * max_blocks]
    block_table = block_table.to(torch.int32).view(num_reqs, max_blocks)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    qsl = torch.tensor(starts, dtype=torch.int32)
    num_tokens = starts[-1] + pad_tokens
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq.to(device),
        num_reqs=num_reqs, num_actual_tokens=num_tokens, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_table_tensor=block_table.to(device),
        slot_mapping=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        seq_lens_cpu_upper_bound=seq,
    )
    return Batch(common, list(query_lens), list(seq_lens), block_table, num_tokens)


def paged_cache(batch, *, num_blocks, width, dtype, seed=0, device="cpu"):
    """``(kv_cache [num_blocks, 64, C] view with block stride 128 rows, values [R, S, width] fp32)``.

    ``values[r, p]`` is the latent of position ``p`` of request ``r``; bf16 caches hold it
    exactly, fp8_ds_mla (``dtype=torch.uint8``) its quantized form. Unowned rows are NaN
    (0xFF bytes for fp8), so a stray read shows.
    """
    from triton_sparse_mla.formats import quantize_fp8_ds_mla

    g = torch.Generator().manual_seed(seed)
    stride_rows = BLOCK + PAD_ROWS
    row_width = 656 if dtype == torch.uint8 else width
    store = torch.empty(num_blocks * stride_rows, row_width, dtype=dtype)
    store.fill_(255 if dtype == torch.uint8 else float("nan"))
    flat = store
    values = torch.randn(len(batch.seq_lens), max(batch.seq_lens), width, generator=g)
    for r, seq_len in enumerate(batch.seq_lens):
        if seq_len == 0:
            continue
        pos = torch.arange(seq_len)
        rows = batch.block_table[r, pos // BLOCK].long() * stride_rows + pos % BLOCK
        latent = values[r, :seq_len]
        if dtype == torch.uint8:
            flat[rows] = quantize_fp8_ds_mla(latent.to(torch.bfloat16))
        else:
            flat[rows] = latent.to(dtype)
    store = store.to(device)
    kv_cache = store.as_strided((num_blocks, BLOCK, row_width), (stride_rows * row_width, row_width, 1))
    return kv_cache, values


def physical_rows(batch, req_of_token, logical):
    """Our own logical -> flat row conversion (independent of vLLM's): int64 [T, K], -1 invalid."""
    stride_rows = BLOCK + PAD_ROWS
    out = torch.full_like(logical, -1, dtype=torch.int64)
    for t in range(logical.shape[0]):
        r = req_of_token[t]
        if r < 0:
            continue
        for j, p in enumerate(logical[t].tolist()):
            if 0 <= p < batch.seq_lens[r]:
                out[t, j] = int(batch.block_table[r, p // BLOCK]) * stride_rows + p % BLOCK
    return out
