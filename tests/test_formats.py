"""fp8_ds_mla packing: layout, both scale styles, and the kernels' integer e4m3 decoder."""

import pytest
import torch
import triton
import triton.language as tl

from triton_sparse_mla.formats import (FP8_ROW_BYTES, dequantize_fp8_ds_mla, quantize_fp8_ds_mla,
                                       row_format)
from triton_sparse_mla.kernels.common import e4m3_to_f32


@pytest.mark.parametrize("style", ["amax", "pow2"])
def test_round_trip_and_layout(style):
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(37, 576, generator=g) * torch.logspace(-3, 2, 37)[:, None]
    packed = quantize_fp8_ds_mla(rows, scale_style=style)
    assert packed.shape == (37, FP8_ROW_BYTES) and packed.dtype == torch.uint8
    back = dequantize_fp8_ds_mla(packed)
    # e4m3 keeps 3 mantissa bits: relative error per value at most 2^-4 of the tile's amax.
    nope_err = (back[:, :512] - rows[:, :512]).abs().reshape(37, 4, 128).amax(-1)
    amax = rows[:, :512].abs().reshape(37, 4, 128).amax(-1)
    assert torch.all(nope_err <= amax * 2**-4)
    assert torch.equal(back[:, 512:], rows[:, 512:].bfloat16().float())
    scales = packed[:, 512:528].contiguous().view(torch.float32)
    if style == "pow2":
        assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))
    else:
        assert torch.allclose(scales, amax / 448.0)


def test_row_format_errors():
    assert row_format(torch.empty(2, 656, dtype=torch.uint8)) == "fp8_ds_mla"
    assert row_format(torch.empty(2, 512, dtype=torch.float16)) == "fp16"
    with pytest.raises(ValueError, match="656"):
        row_format(torch.empty(2, 576, dtype=torch.uint8))
    with pytest.raises(TypeError, match="float32"):
        row_format(torch.empty(2, 576, dtype=torch.float32))
    with pytest.raises(ValueError, match="rows"):
        quantize_fp8_ds_mla(torch.empty(2, 512))


@triton.jit
def _decode_kernel(x_ptr, y_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y_ptr + o, e4m3_to_f32(tl.load(x_ptr + o), 0))


def test_integer_e4m3_decoder_matches_torch(device):
    """All 256 byte values except the two NaN patterns decode exactly as torch does."""
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = raw.view(torch.float8_e4m3fn).float()
    got = torch.empty(256, dtype=torch.float32, device=device)
    _decode_kernel[(1,)](raw.to(device), got, N=256)
    finite = ~torch.isnan(want)
    assert torch.equal(got.cpu()[finite], want[finite])
