"""Public entry points of the indexer scores: :func:`mqa_logits` (prefill) and
:func:`paged_mqa_logits` (decode). They compute what vLLM's DeepGEMM calls of the same names
compute, on every GPU Triton supports (DeepGEMM has no kernels below SM90 but SM120's)."""

from __future__ import annotations

from numbers import Integral

import torch

from ..boundary import check_tensor, device_traits
from ..kernels.common import INTERPRETED
from .flat import fp8_dot, launch_mqa_logits
from .paged import launch_paged_mqa_logits
from .reference import row_limits

_FP8 = torch.float8_e4m3fn


def _check_width(width) -> int:
    if isinstance(width, bool) or not isinstance(width, Integral):
        raise TypeError(f"width: expected an int >= 0, got {width!r}")
    if width < 0:
        raise ValueError(f"width: expected an int >= 0, got {width}")
    return int(width)


def _check_head_dim(name, d):
    if d < 16 or d & (d - 1):
        raise ValueError(f"{name}: expected a head dimension that is a power of two >= 16, got {d}")


def _check_rows_aligned(name, x):
    """The kernels read fp8 rows as 32-bit words: every row must start at a 4-byte aligned
    address (strides but the last and the data pointer multiples of 4)."""
    if x.numel() > 0 and (x.data_ptr() % 4 or any(s % 4 for s in x.stride()[:-1])):
        raise ValueError(f"{name}: expected rows at 4-byte aligned addresses (strides but the "
                         f"last, and the address, multiples of 4), got strides {x.stride()} at "
                         f"address offset {x.data_ptr() % 4}")


def _output(out, shape, device):
    if out is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    check_tensor("out", out, dtype=torch.float32, rank=2, device=device)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out: expected shape {list(shape)}, got {list(out.shape)}")
    return out


def fp8_products(device) -> bool:
    """Whether the indexer's products run on ``device``'s fp8 tensor cores (SM89 and newer,
    unless ``TSM_INDEXER_FP8_DOT=0``; never under the interpreter). Those accumulate with fewer
    bits than fp32, as DeepGEMM's do: the scores' relative error (norm) against float64 measured
    up to 1.7e-4 (H200, run 267), where fp16 products (SM80/86, the interpreter) give 1.3e-7.

    ``device``: a CUDA device, or the CPU under ``TRITON_INTERPRET=1``."""
    _, _, fp8_cvt = device_traits(torch.device(device), "device")
    return fp8_dot(fp8_cvt, INTERPRETED)


def mqa_logits(q, k, k_scale, weights, row_starts, row_ends, width, *, out=None):
    """Indexer logits of ``M`` query rows, each over its own range of one key array.

    ``out[i, c] = k_scale[n] * sum_h weights[i, h] * relu(<q[i, h], k[n]>)`` with
    ``n = row_starts[i] + c``, for ``c < row_ends[i] - row_starts[i]``; the columns after are not
    written. (Float64 specification: :func:`~.reference.mqa_logits_reference`.)

    Args:
        q: ``[M, H, D]`` float8_e4m3fn, ``D`` a power of two (128 in the models).
        k: ``[N, D]`` float8_e4m3fn; ``k_scale``: ``[N]`` float32, the keys' scales. q's and
            k's rows must start at 4-byte aligned addresses (they are read as 32-bit words).
        weights: ``[M, H]`` float32 (the query scale and softmax scale folded in).
        row_starts, row_ends: ``[M]`` int32, ``0 <= start <= end <= N`` (not checked on the
            device: keys at or past ``N`` are neither read nor written).
        width: the output's columns (vLLM: ``max_seqlen_k``); a longer range writes its first
            ``width`` columns only.
        out: optional ``[M, width]`` float32 to write into.

    Returns:
        ``out``, ``[M, width]`` float32.
    """
    check_tensor("q", q, dtype=_FP8, rank=3)
    device = q.device
    m_rows, n_heads, d = q.shape
    _check_head_dim("q", d)
    _check_rows_aligned("q", q)
    check_tensor("k", k, dtype=_FP8, rank=2, device=device)
    if k.shape[1] != d:
        raise ValueError(f"k: expected rows of D = {d} values (q's width), got {k.shape[1]}")
    _check_rows_aligned("k", k)
    check_tensor("k_scale", k_scale, dtype=torch.float32, rank=1, device=device)
    if k_scale.shape[0] != k.shape[0]:
        raise ValueError(f"k_scale: expected shape [{k.shape[0]}] (k's rows), got {list(k_scale.shape)}")
    check_tensor("weights", weights, dtype=torch.float32, rank=2, device=device)
    if tuple(weights.shape) != (m_rows, n_heads):
        raise ValueError(f"weights: expected shape {[m_rows, n_heads]}, got {list(weights.shape)}")
    for name, x in (("row_starts", row_starts), ("row_ends", row_ends)):
        check_tensor(name, x, dtype=torch.int32, rank=1, device=device)
        if x.shape[0] != m_rows:
            raise ValueError(f"{name}: expected shape [{m_rows}] (q's rows), got {list(x.shape)}")
    width = _check_width(width)
    out = _output(out, (m_rows, width), device)
    family, sm_count, fp8_cvt = device_traits(device, "q")
    return launch_mqa_logits(q.view(torch.uint8), k.view(torch.uint8), k_scale, weights, row_starts,
                             row_ends, out, family=family, sm_count=sm_count, fp8_cvt=fp8_cvt,
                             interpret=INTERPRETED)


def paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, width, *, out=None):
    """Indexer logits of decode query rows over their request's paged indexer K cache.

    Row ``r = b * next_n + j`` (request ``b``, its ``j``-th new token) scores the request's
    cache positions ``p`` below its limit (``context_lens[b, j]`` for a 2-D ``context_lens``;
    ``context_lens[b] - next_n + j + 1`` for a 1-D one)::

        out[r, p] = scale(p) * sum_h weights[r, h] * relu(<q[b, j, h], key(p)>)

    where ``key(p)`` and ``scale(p)`` are position ``p % block_size`` of cache block
    ``block_tables[b, p // block_size]`` (:mod:`.cache_layout`). Positions at or past the limit
    (or ``width``) are not written. (Float64 specification:
    :func:`~.reference.paged_mqa_logits_reference`.)

    Args:
        q: ``[B, next_n, H, D]`` float8_e4m3fn, ``D`` a power of two, rows at 4-byte aligned
            addresses.
        kv_cache: ``[num_blocks, block_size, 1, D + 4]`` uint8, each block contiguous,
            ``block_size`` a power of two >= 16.
        weights: ``[B * next_n, H]`` float32.
        context_lens: ``[B]`` or ``[B, next_n]`` int32.
        block_tables: ``[B, max_blocks]`` int32; only the blocks below a request's largest
            limit are read, and each of those entries must name a block of ``kv_cache`` (not
            checked on the device, as vLLM's kernel does not).
        width: the output's columns (vLLM's ``max_model_len``).
        out: optional ``[B * next_n, width]`` float32 to write into.

    Returns:
        ``out``, ``[B * next_n, width]`` float32.
    """
    check_tensor("q", q, dtype=_FP8, rank=4)
    device = q.device
    batch, next_n, n_heads, d = q.shape
    _check_head_dim("q", d)
    _check_rows_aligned("q", q)
    check_tensor("kv_cache", kv_cache, dtype=torch.uint8, rank=4, device=device)
    n_blocks, block_size, one, d4 = kv_cache.shape
    if one != 1 or d4 != d + 4:
        raise ValueError(f"kv_cache: expected shape [num_blocks, block_size, 1, {d + 4}] (D = {d} "
                         f"from q), got {list(kv_cache.shape)}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"kv_cache: expected a block_size that is a power of two >= 16, got {block_size}")
    if n_blocks > 0 and (kv_cache.stride(1) != d4 or kv_cache.stride(0) % 4 or kv_cache.data_ptr() % 4):
        raise ValueError(f"kv_cache: expected contiguous blocks at 4-byte aligned addresses, got "
                         f"strides {kv_cache.stride()}")
    check_tensor("weights", weights, dtype=torch.float32, rank=2, device=device)
    if tuple(weights.shape) != (batch * next_n, n_heads):
        raise ValueError(f"weights: expected shape {[batch * next_n, n_heads]}, got {list(weights.shape)}")
    if not isinstance(context_lens, torch.Tensor) or context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens: expected a [B] or [B, next_n] int32 tensor, got {context_lens!r}")
    check_tensor("context_lens", context_lens, dtype=torch.int32, device=device)
    if context_lens.shape[0] != batch or (context_lens.dim() == 2 and context_lens.shape[1] != next_n):
        raise ValueError(f"context_lens: expected shape [{batch}] or [{batch}, {next_n}], got "
                         f"{list(context_lens.shape)}")
    check_tensor("block_tables", block_tables, dtype=torch.int32, rank=2, device=device)
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables: expected {batch} rows (q's requests), got {block_tables.shape[0]}")
    width = _check_width(width)
    out = _output(out, (batch * next_n, width), device)
    family, sm_count, fp8_cvt = device_traits(device, "q")
    # (vLLM's decode passes 2-D lengths: used as they are, no kernel launched on this hot path)
    limits = (context_lens.reshape(-1) if context_lens.dim() == 2
              else row_limits(context_lens, next_n).to(torch.int32))
    return launch_paged_mqa_logits(q.view(torch.uint8), kv_cache, weights, limits, block_tables,
                                   out, family=family, sm_count=sm_count, fp8_cvt=fp8_cvt,
                                   interpret=INTERPRETED)
