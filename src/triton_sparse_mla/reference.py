"""The specification: sparse MLA attention in float64 with PyTorch.

For query token ``t`` and head ``h``, let ``S_t`` be the multiset of valid entries of
``indices[t]``: those at positions ``j < topk_length[t]`` (all positions when ``topk_length`` is
None) whose value ``i`` satisfies ``0 <= i < N``. Then, with ``x_i`` the values of cache row ``i``
(``D_QK`` wide) and ``v_i = x_i[:512]``::

    s_i      = sm_scale * <q[t, h], x_i>                  for i in S_t
    lse[t,h] = log(sum_i exp(s_i))                        (-inf when S_t is empty)
    out[t,h] = sum_i exp(s_i - lse[t,h]) * v_i            (0 when S_t is empty)
    out[t,h] *= 1 / (1 + exp(attn_sink[h] - lse[t,h]))    when attn_sink is given

A repeated index counts once per occurrence. The kernels must match this function.
"""

from __future__ import annotations

import torch

from .formats import D_V, row_values


def valid_entries(indices: torch.Tensor, n_rows: int, topk_length=None) -> torch.Tensor:
    """``[T, K]`` bool: which entries of ``indices`` count (in ``[0, n_rows)`` and, with
    ``topk_length``, at a position below the token's length)."""
    valid = (indices >= 0) & (indices < n_rows)
    if topk_length is not None:
        pos = torch.arange(indices.shape[1], device=indices.device)[None, :]
        valid &= pos < topk_length.long()[:, None]
    return valid


def _as_query(q) -> torch.Tensor:
    """``[T, H, D_QK]`` float64 from q or its tuple (a NoPE tuple's q_pe may be None)."""
    if isinstance(q, (tuple, list)):
        q_nope, q_pe = q
        return q_nope.double() if q_pe is None else torch.cat([q_nope.double(), q_pe.double()], dim=-1)
    return q.double()


def sparse_mla_reference(q, kv, indices, sm_scale, *, topk_length=None, attn_sink=None):
    """Float64 sparse MLA attention.

    Args:
        q: ``[T, H, D_QK]`` or a tuple ``(q_nope [T, H, 512], q_pe [T, H, D_QK - 512])``
            (q_pe None for NoPE).
        kv: cache rows ``[N, C]`` or ``[N, 1, C]`` in any format of :mod:`.formats`.
        indices: ``[T, K]`` or ``[T, 1, K]`` integer row ids.
        sm_scale: softmax scale applied to ``q . x``.
        topk_length: optional ``[T]``; only ``indices[t, :topk_length[t]]`` count.
        attn_sink: optional ``[H]``.

    Returns:
        ``(out [T, H, 512], lse [T, H])``, both float64 on the CPU.
    """
    qd = _as_query(q).cpu()
    if kv.dim() == 3:
        kv = kv[:, 0]
    if indices.dim() == 3:
        indices = indices[:, 0]
    vals = row_values(kv.cpu())  # [N, D_QK]
    n_rows = vals.shape[0]
    idx = indices.cpu().long()
    t_count, h_count, d_qk = qd.shape
    if vals.shape[1] != d_qk:
        raise ValueError(f"q is {d_qk} wide but kv rows hold {vals.shape[1]} values")
    valid = valid_entries(idx, n_rows, None if topk_length is None else topk_length.cpu())
    out = torch.zeros(t_count, h_count, D_V, dtype=torch.float64)
    lse = torch.full((t_count, h_count), float("-inf"), dtype=torch.float64)
    for t in range(t_count):
        rows = vals[idx[t][valid[t]]]  # [k_t, D_QK]
        if rows.shape[0] == 0:
            continue
        s = (qd[t] @ rows.T) * float(sm_scale)  # [H, k_t]
        lse[t] = torch.logsumexp(s, dim=-1)
        out[t] = torch.softmax(s, dim=-1) @ rows[:, :D_V]
    if attn_sink is not None:
        sink = attn_sink.cpu().double()[None, :]
        factor = torch.where(
            torch.isneginf(lse), torch.zeros_like(lse), torch.sigmoid(lse - sink)
        )
        out = out * factor[:, :, None]
    return out, lse

