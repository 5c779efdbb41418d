"""FlashMLA-shaped entry points over :func:`triton_sparse_mla.sparse_mla_attention`.

Code written against FlashMLA's Python interface switches by changing one import::

    from flash_mla import flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata
    # becomes
    from triton_sparse_mla.flash_mla_compat import (
        flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata)

Only the sparse paths exist here (sparse prefill and sparse decode over a paged cache). Dense
decode, causal masking and the second ("extra") cache raise ``NotImplementedError``. Shapes
use FlashMLA's names (``s_q``, ``h_q``, ``topk``, ``s_kv``); in this package's vocabulary these
are T, H, K and N. :mod:`triton_sparse_mla.reference` remains the specification of the math.
"""

from __future__ import annotations

import math

import torch

from .api import sparse_mla_attention
from .formats import D_V, dequantize_fp8_ds_mla

__all__ = [
    "MLASchedule",
    "flash_mla_sparse_fwd",
    "flash_mla_with_kvcache",
    "get_mla_metadata",
]

# Budget of float32 elements for one chunk of the max_logits side computation: the gathered rows
# [chunk, K, D_QK] and the scores [chunk, H, K] each stay below 2^26 elements (256 MiB).
_MAX_LOGITS_CHUNK_ELEMS = 1 << 26
_INT32_MAX = 2**31 - 1


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=D_V, attn_sink=None, topk_length=None,
                         *, return_max_logits=True):
    """Sparse MLA prefill with FlashMLA's signature and return tuple.

    Args:
        q: ``[s_q, h_q, d_qk]`` bf16 (or fp16), ``d_qk`` 576 or 512; unit last stride.
        kv: ``[s_kv, 1, d_qk]`` in q's dtype, or ``[s_kv, 1, 656]`` uint8 fp8_ds_mla rows (an
            extension: FlashMLA's prefill takes bf16 only). ``[s_kv, d_qk]`` is accepted too.
            Any row stride; never copied.
        indices: int32 ``[s_q, 1, topk]`` row ids into ``kv``. An entry ``< 0`` or ``>= s_kv``
            (for example -1) is invalid: it contributes nothing and is never read.
        sm_scale: softmax scale applied to ``q . k``.
        d_v: value width; must be 512 (the first 512 values of a row).
        attn_sink: optional fp32 ``[h_q]``; the output is scaled by
            ``exp(lse) / (exp(lse) + exp(attn_sink))``, lse is unaffected.
        topk_length: optional int32 ``[s_q]``; only ``indices[t, 0, :topk_length[t]]`` count.
        return_max_logits: compute ``max_logits`` (default, as FlashMLA returns it). Our kernel
            does not produce it, so it costs a second pass in PyTorch: a gather of the selected
            rows (``s_q * topk * d_qk`` values, dequantized to fp32) and an fp32 batched matmul
            of the same size as the kernel's ``q . k``, chunked to bound memory. That is about as
            much work as the attention itself; pass ``False`` when the caller ignores it, and
            the slot holds ``None``.

    Returns:
        ``(out, max_logits, lse)``: ``out [s_q, h_q, 512]`` in q's dtype; ``max_logits
        [s_q, h_q]`` fp32, the largest ``sm_scale * q . k`` over the counted valid entries
        (``-inf`` when there is none), or ``None``; ``lse [s_q, h_q]`` fp32, natural log
        (``-inf`` when there is no valid entry, where ``out`` is 0).

    Raises:
        ValueError: ``d_v != 512``; plus every error of :func:`sparse_mla_attention`.
    """
    if d_v != D_V:
        raise ValueError(f"d_v: expected {D_V} (the latent value width), got {d_v!r}")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor [s_q, h_q, d_qk], got {type(q).__name__}")
    out, lse = sparse_mla_attention(q, kv, indices, sm_scale, topk_length=topk_length,
                                    attn_sink=attn_sink, return_lse=True)
    max_logits = None
    if return_max_logits:
        rows = kv[:, 0] if kv.dim() == 3 else kv
        idx = indices[:, 0] if indices.dim() == 3 else indices
        max_logits = _max_logits(q, rows, idx, float(sm_scale), topk_length)
    return out, max_logits, lse


def _max_logits(q, rows, indices, sm_scale, topk_length):
    """``max_j sm_scale * q[t, h] . rows[indices[t, j]]`` over counted valid j; ``-inf`` if none.

    Inputs are already validated by :func:`sparse_mla_attention`.
    """
    t_count, h_count, d_qk = q.shape
    n_rows, k_width = rows.shape[0], indices.shape[1]
    result = torch.full((t_count, h_count), float("-inf"), dtype=torch.float32, device=q.device)
    if t_count == 0 or k_width == 0 or n_rows == 0:
        return result
    fp8 = rows.dtype == torch.uint8
    chunk = max(1, _MAX_LOGITS_CHUNK_ELEMS // (k_width * max(d_qk, h_count)))
    pos = torch.arange(k_width, device=q.device)
    for t0 in range(0, t_count, chunk):
        t1 = min(t_count, t0 + chunk)
        idx = indices[t0:t1].long()  # [c, K]
        valid = (idx >= 0) & (idx < n_rows)
        if topk_length is not None:
            valid &= pos[None, :] < topk_length[t0:t1, None].long()
        # Invalid entries read row 0 (in bounds); their scores are masked below.
        picked = rows.index_select(0, torch.where(valid, idx, 0).reshape(-1))
        vals = dequantize_fp8_ds_mla(picked) if fp8 else picked.float()
        vals = vals.view(t1 - t0, k_width, d_qk)
        scores = torch.bmm(q[t0:t1].float(), vals.transpose(1, 2)) * sm_scale  # [c, H, K]
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        result[t0:t1] = scores.amax(dim=-1)
    return result


class MLASchedule:
    """Placeholder for FlashMLA's tile-scheduler metadata.

    Our kernels plan their launch from shapes alone, so there is nothing to precompute; the
    object only lets FlashMLA-style code thread a schedule through unchanged.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "MLASchedule()"


def get_mla_metadata(*args, **kwargs):
    """Return ``(MLASchedule(), None)`` whatever the arguments.

    Matches both FlashMLA conventions for unpacking: ``sched, num_splits = get_mla_metadata(...)``.
    Both values are ignored by :func:`flash_mla_with_kvcache`, and one schedule may be reused
    across any calls.
    """
    return MLASchedule(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=None, indices=None, attn_sink=None,
                           topk_length=None, **unsupported):
    """Sparse MLA decode over a paged cache, with FlashMLA's signature.

    Only the sparse mode (``indices`` given) is supported.

    Args:
        q: ``[b, s_q, h_q, d_qk]`` bf16 (or fp16), ``d_qk`` 576 (or 512 with a bf16 cache).
        k_cache: ``[num_blocks, block_size, 1, C]``: q's dtype with ``C = d_qk``, or fp8_ds_mla
            with ``C = 656`` bytes as uint8 (float8_e4m3fn is reinterpreted as uint8). Viewed
            as flat rows, never copied. The block stride may exceed ``block_size`` rows (pages
            between blocks) when it is a multiple of the row stride.
        block_table, cache_seqlens: ignored; sparse indices already name physical rows.
        head_dim_v: must be 512.
        tile_scheduler_metadata, num_splits: ignored (see :func:`get_mla_metadata`).
        softmax_scale: defaults to ``1 / sqrt(d_qk)`` (``1 / sqrt(576)`` for DeepSeek-V3.2).
        causal: must be False (causal masking belongs to dense attention).
        is_fp8_kvcache: None (inferred from ``k_cache``'s dtype) or a bool that must agree with it.
        indices: int32 ``[b, s_q, topk]``; entry ``block * block_size + offset`` names a row.
            An entry ``< 0`` or ``>= num_blocks * block_size`` is invalid and never read.
        attn_sink: optional fp32 ``[h_q]``; the output is scaled by
            ``exp(lse) / (exp(lse) + exp(attn_sink))``, lse is unaffected.
        topk_length: optional int32 ``[b]``; only ``indices[i, j, :topk_length[i]]`` count, for
            every query token ``j`` of batch row ``i``.
        **unsupported: further FlashMLA keywords (``extra_k_cache``,
            ``extra_indices_in_kvcache``, ``extra_topk_length``, ...) are accepted only as None.

    Returns:
        ``(out [b, s_q, h_q, 512]`` in q's dtype, ``lse [b, h_q, s_q]`` fp32 natural log``)``.
        A token with no valid entry gives ``out = 0`` and ``lse = -inf``.

    Raises:
        NotImplementedError: dense mode (``indices=None``), ``causal=True``, or a non-None
            unsupported keyword.
        ValueError / TypeError: wrong shapes, dtypes or cache strides, naming the argument;
            plus every error of :func:`sparse_mla_attention`.

    Cost beyond the kernel: when the block stride exceeds ``block_size`` rows, the indices are
    remapped to physical rows by a few elementwise ops; when ``s_q > 1`` with ``topk_length``,
    the lengths are repeated per token; when ``s_q > 1`` the lse is transposed into a small
    contiguous tensor. All are plain tensor ops, safe inside a CUDA graph.
    """
    given = sorted(name for name, value in unsupported.items() if value is not None)
    if given:
        raise NotImplementedError(
            f"flash_mla_with_kvcache: unsupported arguments {given} (only None is accepted)"
        )
    if head_dim_v != D_V:
        raise ValueError(f"head_dim_v: expected {D_V}, got {head_dim_v!r}")
    if causal:
        raise NotImplementedError(
            "causal: only sparse attention is supported, and it takes no causal mask"
        )
    if indices is None:
        raise NotImplementedError(
            "indices: dense decode is not supported; pass sparse indices [b, s_q, topk]"
        )

    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q: expected a tensor [b, s_q, h_q, d_qk], got {_describe(q)}")
    batch, s_q, h_q, d_qk = q.shape
    if (not isinstance(indices, torch.Tensor) or indices.dim() != 3
            or tuple(indices.shape[:2]) != (batch, s_q)):
        raise ValueError(
            f"indices: expected a tensor [b, s_q, topk] = [{batch}, {s_q}, topk], "
            f"got {_describe(indices)}"
        )
    if indices.dtype != torch.int32:
        raise TypeError(f"indices: expected dtype torch.int32, got {indices.dtype}")
    if topk_length is not None and (not isinstance(topk_length, torch.Tensor) or topk_length.dim() != 1
                                    or topk_length.shape[0] != batch):
        raise ValueError(f"topk_length: expected a tensor [b] = [{batch}], got {_describe(topk_length)}")

    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4 or k_cache.shape[2] != 1:
        raise ValueError(
            f"k_cache: expected a tensor [num_blocks, block_size, 1, C], got {_describe(k_cache)}"
        )
    if k_cache.dtype == torch.float8_e4m3fn:
        k_cache = k_cache.view(torch.uint8)
    fp8 = k_cache.dtype == torch.uint8
    if is_fp8_kvcache is not None and bool(is_fp8_kvcache) != fp8:
        raise ValueError(f"is_fp8_kvcache: {is_fp8_kvcache} disagrees with k_cache dtype {k_cache.dtype}")

    rows, rows_per_block = _flat_rows(k_cache)
    flat_indices = indices.reshape(batch * s_q, indices.shape[2])
    block_size = k_cache.shape[1]
    if rows_per_block != block_size:
        flat_indices = _physical_rows(flat_indices, block_size, rows_per_block,
                                      k_cache.shape[0] * block_size)
    lengths = topk_length
    if lengths is not None and s_q != 1:
        lengths = lengths.repeat_interleave(s_q)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d_qk)

    out, lse = sparse_mla_attention(q.reshape(batch * s_q, h_q, d_qk), rows, flat_indices,
                                    softmax_scale, topk_length=lengths, attn_sink=attn_sink,
                                    return_lse=True)
    out = out.view(batch, s_q, h_q, D_V)
    lse = lse.view(batch, s_q, h_q).transpose(1, 2).contiguous()
    return out, lse


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"shape {list(x.shape)}"
    return type(x).__name__


def _flat_rows(k_cache):
    """View ``[num_blocks, block_size, 1, C]`` as rows ``[R, C]`` over the same memory.

    Returns ``(rows, rows_per_block)``: row ``block * rows_per_block + offset`` of the view is
    ``k_cache[block, offset, 0]``. ``rows_per_block`` exceeds ``block_size`` when blocks are
    spaced further apart than their own size; the rows between blocks are never addressed.
    """
    num_blocks, block_size, _, width = k_cache.shape
    if width > 1 and k_cache.stride(3) != 1:
        raise ValueError(
            f"k_cache: expected unit stride in the last dimension, got strides {k_cache.stride()}"
        )
    # A dimension of size 1 may carry any stride; take the spacing from a dimension that has more.
    if block_size > 1:
        row_stride = k_cache.stride(1)
    elif num_blocks > 1:
        row_stride = k_cache.stride(0)
    else:
        row_stride = width
    block_stride = k_cache.stride(0) if num_blocks > 1 else block_size * row_stride
    if row_stride <= 0 or block_stride % row_stride != 0 or block_stride // row_stride < block_size:
        raise ValueError(
            f"k_cache: the block stride ({block_stride} elements) must be a whole number of rows of "
            f"the row stride ({row_stride} elements), at least block_size = {block_size} rows, so "
            f"the blocks form one strided row array; got strides {k_cache.stride()}"
        )
    rows_per_block = block_stride // row_stride
    n_rows = 0 if num_blocks == 0 or block_size == 0 else (num_blocks - 1) * rows_per_block + block_size
    if n_rows > _INT32_MAX:
        raise ValueError(f"k_cache: {n_rows} addressable rows exceed int32 row ids")
    rows = k_cache.as_strided((n_rows, width), (row_stride, 1), k_cache.storage_offset())
    return rows, rows_per_block


def _physical_rows(indices, block_size, rows_per_block, n_logical):
    """Map logical ids ``block * block_size + offset`` to rows of the spaced view; invalid -> -1."""
    idx = indices.long()
    valid = (idx >= 0) & (idx < n_logical)
    phys = torch.div(idx, block_size, rounding_mode="floor") * rows_per_block + idx.remainder(block_size)
    return torch.where(valid, phys, torch.full_like(phys, -1)).to(torch.int32)
