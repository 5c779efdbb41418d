"""Compile the indexer's kernels before serving: one tiny call of each kind vLLM makes.

vLLM's profile run skips the indexer, so without this the prefill kernel would compile in the
first request's prefill. The tiny calls specialise as vLLM's do: contiguous q ``[M, H, D]``
and weights ``[M, H]``, keys ``[N, D]``, a cache of ``block_size``-token blocks; decode with
1 or 2 rows per request (vLLM flattens more draft tokens to 1).
"""

from __future__ import annotations

import torch

from .api import mqa_logits, paged_mqa_logits


def warmup(device: torch.device, heads: int, head_dim: int, *, block_size: int = 64,
           next_ns=(1, 2)) -> None:
    """Run :func:`~.api.mqa_logits` and, per ``next_n``, :func:`~.api.paged_mqa_logits` once on
    ``device`` at ``heads`` x ``head_dim``, so that their kernels compile now."""
    fp8, f32 = torch.float8_e4m3fn, torch.float32  # (dtypes named: vLLM builds its model, and
    # calls this, under a default dtype of bf16)
    rows = torch.zeros(1, dtype=torch.int32, device=device)
    mqa_logits(torch.zeros(1, heads, head_dim, dtype=fp8, device=device),
               torch.zeros(1, head_dim, dtype=fp8, device=device),
               torch.ones(1, dtype=f32, device=device), torch.zeros(1, heads, dtype=f32, device=device),
               rows, rows + 1, 1)
    cache = torch.zeros(1, block_size, 1, head_dim + 4, dtype=torch.uint8, device=device)
    for next_n in next_ns:
        paged_mqa_logits(torch.zeros(1, next_n, heads, head_dim, dtype=fp8, device=device), cache,
                         torch.zeros(next_n, heads, dtype=f32, device=device),
                         torch.ones(1, next_n, dtype=torch.int32, device=device),
                         torch.zeros(1, 1, dtype=torch.int32, device=device), 1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
