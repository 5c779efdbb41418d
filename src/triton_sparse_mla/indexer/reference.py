"""The specification of the DSA indexer's scores, in float64 with PyTorch.

The indexer of DeepSeek-V3.2 and GLM-5 scores every cache token ``n`` a query token ``t`` may
see with ``H`` small heads (``H = 64``, ``D = 128``), all in float8_e4m3fn, each key with one
fp32 scale::

    logit[t, n] = k_scale[n] * sum_h weights[t, h] * relu(<q[t, h], k[n]>)

and keeps the ``top-k`` highest (2048) as the rows the sparse attention reads. ``weights``
already holds the query's scale and the softmax scale. The paged form reads ``k`` and
``k_scale`` from vLLM's indexer K cache (:mod:`.cache_layout`).
"""

from __future__ import annotations

import torch

from .cache_layout import unpack_indexer_k_cache


def _scores(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor):
    """``[T, N]`` float64 logits of ``q [T, H, D]`` against ``k [N, D]``."""
    s = torch.einsum("thd,nd->thn", q.double(), k.double()).clamp_min(0.0)
    return torch.einsum("thn,th->tn", s, weights.double()) * k_scale.double()[None, :]


def mqa_logits_reference(q, k, k_scale, weights, row_starts, row_ends, width):
    """Float64 logits of every query row over its own key range, compressed to column 0.

    Args:
        q: ``[M, H, D]`` float8_e4m3fn (or any float dtype).
        k: ``[N, D]`` keys in q's dtype; ``k_scale`` ``[N]`` fp32.
        weights: ``[M, H]`` fp32.
        row_starts, row_ends: ``[M]`` integers; row ``i`` sees keys
            ``[row_starts[i], row_ends[i])``, ``0 <= start <= end <= N``.
        width: the output's columns; a longer range keeps its first ``width`` keys.

    Returns:
        ``[M, width]`` float64 on the CPU: ``out[i, c]`` is the logit of key
        ``row_starts[i] + c`` for ``c < row_ends[i] - row_starts[i]``, ``-inf`` after.
    """
    q, k, k_scale, weights = (x.cpu() for x in (q, k, k_scale, weights))
    starts, ends = row_starts.cpu().long().tolist(), row_ends.cpu().long().tolist()
    out = torch.full((q.shape[0], width), float("-inf"), dtype=torch.float64)
    for i, (lo, hi) in enumerate(zip(starts, ends)):
        hi = min(hi, lo + width)
        if hi > lo:
            out[i, : hi - lo] = _scores(q[i : i + 1], k[lo:hi], k_scale[lo:hi], weights[i : i + 1])[0]
    return out


def row_limits(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """``[B * next_n]`` int64: how many cache positions each query row sees.

    A 2-D ``context_lens`` ``[B, next_n]`` gives each row's count. A 1-D one ``[B]`` counts the
    request's tokens including its ``next_n`` new ones, which are its last positions, each seeing
    itself and what precedes it: row ``j`` sees ``context_lens[b] - next_n + j + 1``.
    """
    if context_lens.dim() == 2:
        if context_lens.shape[1] != next_n:
            raise ValueError(
                f"context_lens: expected shape [B, {next_n}] or [B], got {list(context_lens.shape)}")
        return context_lens.long().reshape(-1)
    offsets = torch.arange(next_n, device=context_lens.device) - (next_n - 1)
    return (context_lens.long()[:, None] + offsets[None, :]).clamp_min(0).reshape(-1)


def paged_mqa_logits_reference(q, kv_cache, weights, context_lens, block_tables, width):
    """Float64 logits of decode query rows over their request's paged indexer K cache.

    Args:
        q: ``[B, next_n, H, D]`` float8_e4m3fn.
        kv_cache: ``[num_blocks, block_size, 1, D + 4]`` uint8 (:mod:`.cache_layout`).
        weights: ``[B * next_n, H]`` fp32.
        context_lens: ``[B]`` or ``[B, next_n]`` integers (:func:`row_limits`).
        block_tables: ``[B, max_blocks]`` integers: logical block -> cache block.
        width: the output's columns (vLLM's ``max_model_len``).

    Returns:
        ``[B * next_n, width]`` float64 on the CPU: ``out[b * next_n + j, p]`` is the logit of
        the request's position ``p`` for ``p`` below the row's limit (and ``width``), ``-inf``
        after.
    """
    batch, next_n = q.shape[:2]
    keys, scales = unpack_indexer_k_cache(kv_cache.cpu())  # [blocks, bs, D], [blocks, bs]
    block_size = keys.shape[1]
    limits = row_limits(context_lens.cpu(), next_n).tolist()
    tables = block_tables.cpu().long()
    q, weights = q.cpu(), weights.cpu()
    out = torch.full((batch * next_n, width), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        for j in range(next_n):
            r = b * next_n + j
            n = limits[r]
            if n == 0:
                continue
            blocks = tables[b, : -(-n // block_size)]
            # rows taken through a byte view: torch 2.7 cannot index float8 tensors on a CPU
            k = keys.view(torch.uint8)[blocks].view(keys.dtype).reshape(-1, keys.shape[-1])[:n]
            k_scale = scales[blocks].reshape(-1)[:n]
            out[r, : min(n, width)] = _scores(q[b, j][None], k, k_scale, weights[r][None])[0, :width]
    return out
