"""Scatter byte rows into a paged cache by slot (``slot = block * block_size + offset``),
skipping negative slots (padding tokens), with no data-dependent shapes: CUDA graphs stay
valid.

Row ``t`` of ``src`` (``WIDTH`` bytes) goes to byte ``(slot // block_size) * block_stride +
(slot % block_size) * row_stride + offset`` of ``dst``; one program per row. One kernel serves
each region of a cache whose blocks hold their tokens' rows side by side (vLLM's MLA cache:
``row_stride`` = the entry's bytes) or region after region (its indexer K cache: the values,
then the scales at ``offset = block_size * D``).
"""

import torch
import triton
import triton.language as tl

from ..hostmath import next_power_of_2
from .common import LAUNCH_OPTIONS


@triton.jit(do_not_specialize=["block_size", "block_stride", "row_stride", "offset", "stride_src"])
def scatter_rows_kernel(src_ptr, dst_ptr, slot_ptr, stride_src, block_size, block_stride,
                        row_stride, offset, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + i_t).to(tl.int64)
    if slot >= 0:
        o_w = tl.arange(0, BLOCK_W)
        m_w = o_w < WIDTH
        b_row = tl.load(src_ptr + i_t * stride_src + o_w, mask=m_w)
        p_dst = dst_ptr + (slot // block_size) * block_stride + (slot % block_size) * row_stride + offset
        tl.store(p_dst + o_w, b_row, mask=m_w)


def scatter_rows(src: torch.Tensor, dst: torch.Tensor, slots: torch.Tensor, *, block_size: int,
                 block_stride: int, row_stride: int, offset: int = 0) -> None:
    """Write ``src [T, W]`` uint8 rows into the uint8 tensor ``dst`` (any shape; addressed as
    bytes from its start) at ``slots [T]`` (int32/int64; negative: skipped). Strides in bytes."""
    if src.dtype != torch.uint8 or dst.dtype != torch.uint8:
        raise TypeError(f"src, dst: expected torch.uint8, got {src.dtype} and {dst.dtype}")
    if src.dim() != 2 or src.stride(1) != 1:
        raise ValueError(f"src: expected [T, W] with unit stride in W, got shape {list(src.shape)} "
                         f"strides {src.stride()}")
    if slots.dim() != 1 or slots.shape[0] != src.shape[0]:
        raise ValueError(f"slots: expected shape [{src.shape[0]}] (src's rows), got {list(slots.shape)}")
    if src.shape[0] == 0 or src.shape[1] == 0:
        return
    scatter_rows_kernel[(src.shape[0],)](
        src, dst, slots, src.stride(0), block_size, block_stride, row_stride, offset,
        WIDTH=src.shape[1], BLOCK_W=next_power_of_2(src.shape[1]), num_warps=4, **LAUNCH_OPTIONS)
