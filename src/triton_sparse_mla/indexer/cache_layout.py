"""vLLM's indexer K cache: ``[num_blocks, block_size, 1, D + 4]`` uint8, laid out by block.

The tensor's shape suggests ``D + 4`` bytes per token, but a block is stored flat: first the
``block_size x D`` float8_e4m3fn values of its tokens, token after token, then their
``block_size`` fp32 scales::

    block b, token t:  value d at byte  b * block_bytes + t * D + d
                       scale   at byte  b * block_bytes + block_size * D + 4 * t

with ``block_bytes = block_size * (D + 4)``. (DeepSeek-V3.2: D = 128, block_size = 64.)
"""

from __future__ import annotations

import torch


def pack_indexer_k_cache(keys: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``keys [num_blocks, block_size, D]`` float8_e4m3fn and ``scales [num_blocks, block_size]``
    fp32 into a ``[num_blocks, block_size, 1, D + 4]`` uint8 cache."""
    if keys.dtype != torch.float8_e4m3fn or keys.dim() != 3:
        raise ValueError(f"keys: expected float8_e4m3fn [num_blocks, block_size, D], got "
                         f"{keys.dtype} {list(keys.shape)}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != tuple(keys.shape[:2]):
        raise ValueError(f"scales: expected float32 {list(keys.shape[:2])}, got "
                         f"{scales.dtype} {list(scales.shape)}")
    n_blocks, block_size, d = keys.shape
    flat = torch.cat([keys.reshape(n_blocks, -1).view(torch.uint8),
                      scales.contiguous().view(torch.uint8).reshape(n_blocks, -1)], dim=1)
    return flat.reshape(n_blocks, block_size, 1, d + 4)


def unpack_indexer_k_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_indexer_k_cache`: ``(keys [num_blocks, block_size, D]``
    float8_e4m3fn, ``scales [num_blocks, block_size]`` fp32), copies."""
    n_blocks, block_size, _, d4 = kv_cache.shape
    d = d4 - 4
    flat = kv_cache.reshape(n_blocks, block_size * d4)
    keys = flat[:, : block_size * d].contiguous().view(torch.float8_e4m3fn)
    scales = flat[:, block_size * d:].contiguous().view(torch.float32)
    return keys.reshape(n_blocks, block_size, d), scales.reshape(n_blocks, block_size)
