"""kernels/scatter.py: byte rows to their slots in a paged cache, padding slots skipped."""

import pytest
import torch

from triton_sparse_mla.kernels.scatter import scatter_rows


@pytest.mark.parametrize("width, row_stride, offset", [
    pytest.param(656, 656, 0, id="rows-side-by-side"),
    pytest.param(4, 4, 16 * 128, id="a-region-after-the-values"),
    pytest.param(100, 132, 0, id="narrower-than-the-stride"),
])
def test_scatter_rows(device, width, row_stride, offset):
    g = torch.Generator().manual_seed(width)
    blocks, block_size = 3, 16
    block_stride = max(block_size * row_stride + offset, 16 * 132) + 40  # padded blocks
    dst = torch.zeros(blocks * block_stride, dtype=torch.uint8)
    slots = torch.tensor([5, -1, 47, 16, 0, -7], dtype=torch.int64)
    src = torch.randint(1, 256, (len(slots), width), generator=g, dtype=torch.uint8)
    expected = dst.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            at = (slot // block_size) * block_stride + (slot % block_size) * row_stride + offset
            expected[at: at + width] = src[t]
    got = dst.to(device)
    scatter_rows(src.to(device), got, slots.to(device), block_size=block_size,
                 block_stride=block_stride, row_stride=row_stride, offset=offset)
    assert torch.equal(got.cpu(), expected)


def test_scatter_rows_checks_its_inputs(device):
    src = torch.zeros(2, 8, dtype=torch.uint8, device=device)
    dst = torch.zeros(64, dtype=torch.uint8, device=device)
    with pytest.raises(TypeError, match="expected torch.uint8"):
        scatter_rows(src.float(), dst, torch.zeros(2, dtype=torch.int64, device=device),
                     block_size=4, block_stride=32, row_stride=8)
    with pytest.raises(ValueError, match=r"slots: expected shape \[2\]"):
        scatter_rows(src, dst, torch.zeros(3, dtype=torch.int64, device=device),
                     block_size=4, block_stride=32, row_stride=8)
