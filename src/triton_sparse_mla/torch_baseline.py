"""A plain-PyTorch sparse MLA: the baseline ``triton-sparse-mla bench`` times beside ours.

Not the specification (that is :mod:`.reference`, in float64): this is what a user without
custom kernels would run, checked against the specification in ``tests/test_torch_baseline.py``.
"""

from __future__ import annotations

import torch

from .formats import D_V, dequantize_fp8_ds_mla, row_format
from .reference import valid_entries


def sparse_mla_torch(q, kv, indices, sm_scale, *, topk_length=None, attn_sink=None,
                     dtype=torch.float32, chunk_tokens=512):
    """The same attention in plain PyTorch on the inputs' device: the baseline a user without
    custom kernels would run (``triton-sparse-mla bench`` times it), not the specification.

    Gathers the selected rows (dequantizing fp8_ds_mla rows after the gather), then computes
    scores, softmax and output with batched matmuls in ``dtype``, ``chunk_tokens`` query
    tokens at a time to bound the gathered ``[chunk, K, D_QK]`` buffer. Same arguments and
    conventions as :func:`.reference.sparse_mla_reference`; returns
    ``(out [T, H, 512], lse [T, H])`` in ``dtype`` on the inputs' device.
    """
    qd = torch.cat([q[0], q[1]], dim=-1) if isinstance(q, (tuple, list)) else q
    if kv.dim() == 3:
        kv = kv[:, 0]
    if indices.dim() == 3:
        indices = indices[:, 0]
    fp8 = row_format(kv) == "fp8_ds_mla"
    t_count, h_count, d_qk = qd.shape
    n_rows, k_width = kv.shape[0], indices.shape[1]
    out = torch.zeros(t_count, h_count, D_V, dtype=dtype, device=qd.device)
    lse = torch.full((t_count, h_count), float("-inf"), dtype=dtype, device=qd.device)
    for t0 in range(0, t_count, chunk_tokens):
        t1 = min(t0 + chunk_tokens, t_count)
        idx = indices[t0:t1].long()
        valid = valid_entries(idx, n_rows, None if topk_length is None else topk_length[t0:t1])
        rows = kv[torch.where(valid, idx, 0).reshape(-1)]  # [chunk * K, C]
        vals = (dequantize_fp8_ds_mla(rows) if fp8 else rows).to(dtype).view(t1 - t0, k_width, d_qk)
        # invalid entries gathered row 0, whatever it holds: zero them (0 * NaN would be NaN)
        vals = vals.masked_fill(~valid[..., None], 0.0)
        s = torch.bmm(qd[t0:t1].to(dtype), vals.transpose(1, 2)) * float(sm_scale)  # [chunk, H, K]
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        c_lse = torch.logsumexp(s, dim=-1)  # -inf where a token has no valid entry
        p = torch.exp(s - torch.where(torch.isneginf(c_lse), 0.0, c_lse)[..., None])
        out[t0:t1] = torch.bmm(p, vals[..., :D_V])
        lse[t0:t1] = c_lse
    if attn_sink is not None:
        sink = attn_sink.to(dtype)[None, :]
        factor = torch.where(torch.isneginf(lse), torch.zeros_like(lse), torch.sigmoid(lse - sink))
        out = out * factor[:, :, None]
    return out, lse
