"""Index arithmetic the indexer's score kernels share: which query rows and heads a tile holds,
the key ranges of a program's rows, and how the prefill kernels split the keys."""

import triton
import triton.language as tl

from ..hostmath import cdiv


def key_programs(width: int, block_n: int, row_blocks: int, sm_count: int) -> int:
    """Programs a prefill launch splits the key axis over: enough, with ``row_blocks`` row
    tiles, to give each SM about two, and no more than the ``width`` keys' tiles."""
    return max(1, min(cdiv(width, block_n), cdiv(2 * sm_count, row_blocks)))


@triton.jit
def rows_by_heads(row0, n_rows, G: tl.constexpr, BLOCK_H: tl.constexpr, H: tl.constexpr):
    """The index of a ``[G * BLOCK_H]`` axis that holds ``G`` query rows from ``row0`` with
    their heads: entry ``e`` is head ``e % BLOCK_H`` of row ``row0 + e // BLOCK_H``. Returns
    the rows, the heads and which entries exist (row below ``n_rows``, head below ``H``)."""
    o_e = tl.arange(0, G * BLOCK_H)
    o_row = row0 + o_e // BLOCK_H
    o_head = o_e % BLOCK_H
    return o_row, o_head, (o_row < n_rows) & (o_head < H)


@triton.jit
def key_ranges(starts_ptr, ends_ptr, o_rows, m_rows, n_keys, width):
    """The key ranges of a program's rows ``o_rows`` (``m_rows``: which exist): each row's
    ``[lo, hi)`` clipped to ``n_keys`` and to ``width`` keys (a missing row's is empty), and
    their union's bounds."""
    b_lo = tl.load(starts_ptr + o_rows, mask=m_rows, other=n_keys)
    b_hi = tl.load(ends_ptr + o_rows, mask=m_rows, other=0)
    b_hi = tl.minimum(tl.minimum(b_hi, n_keys), b_lo + width)
    return b_lo, b_hi, tl.min(b_lo, axis=0), tl.max(b_hi, axis=0)
