"""fp8_ds_mla prefill through a bf16 workspace of the distinct rows a call reads.

In prefill every cache row is gathered by many query tokens: T tokens x K entries name at most
the rows of their requests' contexts (a 4096-token chunk of one request: 8.4M entries, at most
its context's rows). Dequantizing each distinct row once into a bf16 workspace and running the
bf16 kernel over it replaces T x K in-kernel conversions by one per row, and lets the faster
bf16 tiles run. The workspace holds only the distinct rows, so it costs
``distinct rows x 1152`` bytes (plus 8 bytes per cache row and 4 per index entry while it is
built), bounded by :data:`MAX_BYTES`; a call past the bound, or whose rows are reused too little,
keeps the in-kernel conversion.

Counting the distinct rows needs their number on the host (a device-to-host copy), so this path
is never taken while a CUDA graph is being captured, nor for decode-sized calls
(T < :data:`MIN_TOKENS`), which stay synchronization-free and graph-safe. It is taken only for
a bf16 query: the workspace holds the dequantized values in q's dtype, and fp16 cannot hold
every value an fp8_ds_mla row with a large scale encodes.

Results equal, bit for bit, the bf16 kernel run on ``dequantize_fp8_ds_mla(kv).bfloat16()``
(the same values, gathered in the same order).
"""

from __future__ import annotations

import torch
import triton

from .formats import D_NOPE, D_ROPE
from .kernels.dedup import mark_rows_kernel, remap_kernel, upconvert_kernel

# Calls with fewer query tokens keep the in-kernel conversion (decode: no host synchronization).
MIN_TOKENS = 1024
# Index entries per distinct row below which the in-kernel conversion is kept: the workspace
# pays one conversion per distinct row (656 bytes read, 1152 written) to save part of the cost of
# each entry.
MIN_REUSE = 4
# Largest workspace (bytes of dequantized rows) a call may allocate.
MAX_BYTES = 1 << 30

_BLOCK_K = 256
_BLOCK_R = 16


def wanted(t_count: int, q_dtype: torch.dtype, device: torch.device, mode) -> bool:
    """Whether to try the workspace before looking at the indices.

    ``mode``: None (automatic: bf16 q, ``T >= MIN_TOKENS``, not capturing a CUDA graph), True
    (whenever possible) or False (never).
    """
    if mode is False:
        return False
    if q_dtype != torch.bfloat16:
        if mode is True:
            raise ValueError(f"fp8_workspace: needs a bf16 query (fp16 cannot hold every "
                             f"fp8_ds_mla value), got q of dtype {q_dtype}")
        return False
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        if mode is True:
            raise ValueError("fp8_workspace=True: cannot be used while a CUDA graph is "
                             "captured (it reads the number of distinct rows on the host)")
        return False
    return mode is True or t_count >= MIN_TOKENS


def build(kv: torch.Tensor, indices: torch.Tensor, topk_length, fp8_cvt: int, *, force: bool):
    """Dequantize the rows that valid entries of ``indices`` name into a workspace.

    Args:
        kv: fp8_ds_mla rows ``[N, 656]`` uint8. indices: int32 ``[T, K]``. topk_length: int32
            ``[T]`` or None (validity as in :func:`triton_sparse_mla.sparse_mla_attention`).
        fp8_cvt: the device's e4m3 decode path (``configs.fp8_cvt_level``).
        force: skip the reuse and size checks.

    Returns:
        ``(workspace [R, 576] bf16, new_indices [T, K] int32)`` with every valid entry
        rewritten as its row's place in the workspace and every other entry -1, or None when
        the call should keep the in-kernel conversion (``R * 1152 > MAX_BYTES`` or fewer than
        ``MIN_REUSE`` entries per distinct row).
    """
    n_rows = kv.shape[0]
    t_count, topk = indices.shape
    device = kv.device
    common = dict(idx_ptr=indices, len_ptr=topk_length, n_rows=n_rows, topk=topk,
                  stride_idx_t=indices.stride(0), HAS_LEN=topk_length is not None,
                  BLOCK_K=_BLOCK_K)
    grid = (t_count, triton.cdiv(topk, _BLOCK_K))
    mark = torch.zeros(n_rows, dtype=torch.int32, device=device)
    mark_rows_kernel[grid](mark_ptr=mark, **common)
    pos = torch.cumsum(mark, 0, dtype=torch.int32)
    del mark
    distinct = int(pos[-1]) if n_rows > 0 else 0
    row_bytes = (D_NOPE + D_ROPE) * 2
    if not force and (distinct * row_bytes > MAX_BYTES or t_count * topk < MIN_REUSE * distinct):
        return None
    new_indices = torch.empty(t_count, topk, dtype=torch.int32, device=device)
    remap_kernel[grid](pos_ptr=pos, new_idx_ptr=new_indices, stride_new_t=new_indices.stride(0),
                       **common)
    workspace = torch.empty(max(distinct, 1), D_NOPE + D_ROPE, dtype=torch.bfloat16, device=device)
    if distinct > 0:
        upconvert_kernel[(triton.cdiv(n_rows, _BLOCK_R),)](
            kv_ptr=kv, pos_ptr=pos, ws_ptr=workspace, n_rows=n_rows, stride_kv=kv.stride(0),
            stride_ws=workspace.stride(0), FP8_CVT=fp8_cvt, D_PE=D_ROPE, BLOCK_R=_BLOCK_R)
    return workspace, new_indices
