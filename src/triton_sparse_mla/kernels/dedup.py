"""The three passes of the fp8_ds_mla prefill workspace (:mod:`triton_sparse_mla.workspace`).

``mark_rows_kernel`` marks every cache row that some valid index entry names; after a prefix
sum of the marks (``pos[i]`` = marked rows up to and including row ``i``), ``remap_kernel``
rewrites each valid entry as its row's place in the workspace (``pos[row] - 1``, -1 for an
invalid entry) and ``upconvert_kernel`` dequantizes each marked row into that place, with the
same arithmetic as the attention kernel's own loads (:func:`common.load_latent_tile`). Without
marks (``pos_ptr`` None) ``upconvert_kernel`` dequantizes every row into the place of its own id.
"""

import triton
import triton.language as tl

from .common import LATENT_TILE, load_latent_tile, load_rope_tile

LATENT_TILES = tl.constexpr(4)


@triton.jit
def _valid_entries(idx_ptr, len_ptr, t_first, n_rows, topk, stride_idx_t, HAS_LEN: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """``(row ids, validity)`` of index entries ``[BLOCK_K]`` of token
    ``t_first + program_id(0)``."""
    i_t = t_first + tl.program_id(0).to(tl.int64)
    o_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    m_k = o_k < topk
    if HAS_LEN:
        m_k = m_k & (o_k < tl.load(len_ptr + i_t))
    b_idx = tl.load(idx_ptr + i_t * stride_idx_t + o_k, mask=m_k, other=-1)
    return b_idx, m_k & (b_idx >= 0) & (b_idx < n_rows), o_k


@triton.jit(do_not_specialize=["t_first", "n_rows"])  # (see attention.py)
def mark_rows_kernel(idx_ptr, len_ptr, mark_ptr, t_first, n_rows, topk, stride_idx_t,
                     HAS_LEN: tl.constexpr, BLOCK_K: tl.constexpr):
    """``mark[row] = 1`` for every valid entry of tokens ``t_first`` on (grid: tokens x K
    blocks; the pointers stay the tensors' own, so a later range of tokens compiles nothing
    new). Entries naming the same row store the same value, so the order of the stores does not
    matter. A mark already seen set is not stored again: prefill names each row hundreds of
    times, and those stores to the same addresses queued behind each other (H200, T=4096 over
    32K rows: 239 us for the stores alone, ``benchmarks/workspace_parts.py``). A stale 0 only
    costs a store."""
    b_idx, m_k, _ = _valid_entries(idx_ptr, len_ptr, t_first, n_rows, topk, stride_idx_t, HAS_LEN,
                                   BLOCK_K)
    b_seen = tl.load(mark_ptr + b_idx, mask=m_k, other=1)
    tl.store(mark_ptr + b_idx, tl.full([BLOCK_K], 1, tl.int32), mask=m_k & (b_seen == 0))


@triton.jit(do_not_specialize=["n_rows", "n_slots"])  # (see attention.py)
def remap_kernel(idx_ptr, len_ptr, pos_ptr, new_idx_ptr, n_rows, n_slots, topk, stride_idx_t,
                 stride_new_t, HAS_LEN: tl.constexpr, BLOCK_K: tl.constexpr):
    """``new_idx[t, k] = pos[idx[t, k]] - 1`` for a valid entry whose row has one of the
    ``n_slots`` slots, -1 otherwise."""
    b_idx, m_k, o_k = _valid_entries(idx_ptr, len_ptr, 0, n_rows, topk, stride_idx_t, HAS_LEN,
                                     BLOCK_K)
    b_new = tl.load(pos_ptr + b_idx, mask=m_k, other=0) - 1
    b_new = tl.where(b_new < n_slots, b_new, -1)
    i_t = tl.program_id(0).to(tl.int64)
    tl.store(new_idx_ptr + i_t * stride_new_t + o_k, b_new, mask=o_k < topk)


@triton.jit(do_not_specialize=["n_rows", "n_slots"])  # (see attention.py)
def upconvert_kernel(kv_ptr, pos_ptr, ws_ptr, n_rows, n_slots, stride_kv, stride_ws,
                     FP8_CVT: tl.constexpr, D_PE: tl.constexpr, BLOCK_R: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """Dequantize each marked row ``i`` of ``kv`` (fp8_ds_mla bytes) into ``ws[pos[i] - 1]``
    (576 values of ws's dtype) where that is one of the ``n_slots`` slots; a row is marked
    where ``pos`` steps up (grid: N / BLOCK_R). With ``pos_ptr`` None every row ``i`` goes to
    ``ws[i]``."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    if pos_ptr is None:
        m_r = o_r < n_rows
        o_ws = o_r
    else:
        b_pos = tl.load(pos_ptr + o_r, mask=o_r < n_rows, other=0)
        b_prev = tl.load(pos_ptr + o_r - 1, mask=(o_r > 0) & (o_r < n_rows), other=0)
        m_r = (o_r < n_rows) & (b_pos > b_prev) & (b_pos <= n_slots)
        o_ws = b_pos - 1
    p_row = kv_ptr + o_r.to(tl.int64) * stride_kv  # byte pointers
    p_ws = ws_ptr + o_ws.to(tl.int64) * stride_ws
    dtype = ws_ptr.dtype.element_ty
    for j in tl.static_range(LATENT_TILES):
        b_k = load_latent_tile(p_row, m_r, j, True, FP8_CVT, dtype, False, False, INTERPRET)
        o_c = j * LATENT_TILE + tl.arange(0, LATENT_TILE)
        tl.store(p_ws[:, None] + o_c[None, :], b_k, mask=m_r[:, None])
    b_pe = load_rope_tile(p_row, m_r, D_PE, True, dtype)
    o_p = LATENT_TILES * LATENT_TILE + tl.arange(0, D_PE)
    tl.store(p_ws[:, None] + o_p[None, :], b_pe, mask=m_r[:, None])
