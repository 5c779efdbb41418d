"""fp8_ds_mla packing: layout, both scale styles, and the kernels' e4m3 decoders."""

import pytest
import torch
import triton
import triton.language as tl

from triton_sparse_mla import configs
from triton_sparse_mla.boundary import interpreting
from triton_sparse_mla.formats import (FP8_ROW_BYTES, dequantize_fp8_ds_mla, quantize_fp8_ds_mla,
                                       row_format)
from triton_sparse_mla.kernels.common import e4m3_to_f16, e4m3_unit, e4m3_words_to_f16
from triton_sparse_mla.kernels.e4m3_encode import f32_to_e4m3_bits


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
def _decode_kernel(x_ptr, y_ptr, FP8_CVT: tl.constexpr, INTERPRET: tl.constexpr):
    """Every way the kernels decode 256 bytes, one row of ``y`` [4, 256] fp32 each: bytes, and
    bytes without the unit with the unit applied to a scale of 1; the same from words."""
    o = tl.arange(0, 256)
    b_x = tl.load(x_ptr + o)
    b_one = tl.full([256], 1.0, tl.float32)
    tl.store(y_ptr + o, e4m3_to_f16(b_x, FP8_CVT).to(tl.float32))
    tl.store(y_ptr + 256 + o, e4m3_to_f16(b_x, FP8_CVT, False).to(tl.float32) * e4m3_unit(b_one, FP8_CVT))
    o_w = tl.arange(0, 64)
    b_w = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + o_w)  # the same bytes, 4 per word
    b_v = e4m3_words_to_f16(tl.reshape(b_w, [1, 64]), FP8_CVT, INTERPRET)
    tl.store(y_ptr + 512 + o, tl.reshape(b_v, [256]).to(tl.float32))
    b_v = e4m3_words_to_f16(tl.reshape(b_w, [1, 64]), FP8_CVT, INTERPRET, False)
    b_u = tl.reshape(b_v, [256]).to(tl.float32) * e4m3_unit(b_one, FP8_CVT)
    tl.store(y_ptr + 768 + o, b_u)


@triton.jit
def _encode_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < n, other=0.0)
    tl.store(y_ptr + o, f32_to_e4m3_bits(x).to(tl.uint8), mask=o < n)


def _encode(x, device):
    y = torch.full(x.shape, 0x7F, dtype=torch.uint8, device=device)
    _encode_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(device), y, x.numel(), BLOCK=1024)
    return y.cpu()


def test_e4m3_encoder_matches_torch(device):
    """The integer encoder (kernels/e4m3_encode.py) gives PyTorch's bytes: every finite e4m3
    value, each midpoint of two neighbours (ties to even) and the fp32 values either side of
    it, both signs, zeros and values that round to zero, and random values from 2^-12 to 448;
    past 448 it saturates (from 464 PyTorch gives NaN)."""
    e4m3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    pos = e4m3[:127].double()  # 0 .. 448, increasing (0x7F is NaN)
    mid = ((pos[1:] + pos[:-1]) / 2).float()
    g = torch.Generator().manual_seed(0)
    rand = torch.exp2(torch.rand(4096, generator=g) * (8.807 + 12) - 12)  # 2^-12 .. 448
    x = torch.cat([pos.float(), mid, torch.nextafter(mid, mid * 2), torch.nextafter(mid, mid * 0),
                   rand, torch.tensor([2.0 ** -10, 2.0 ** -11, 2.0 ** -12, 1e-30, 0.0])])
    x = torch.cat([x, -x])
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    got = _encode(x, device)
    bad = got != want
    assert not bad.any(), f"{int(bad.sum())} differ, first at {x[bad][:4].tolist()}"
    big = torch.tensor([448.0, 460.0, 463.9, 464.0, 500.0, 1e6])
    assert _encode(torch.cat([big, -big]), device).tolist() == [0x7E] * 6 + [0xFE] * 6


@pytest.mark.parametrize("level", [0, 1], ids=["integer", "hardware"])
def test_e4m3_decoders_match_torch(level, device):
    """All 256 byte values except the two NaN patterns decode exactly as torch does, through
    each decoder and form the kernels use (bytes or words, with the unit or folded into a
    scale), by integer decoding (SM80/86; on a newer GPU too) and by the hardware conversion
    (SM89 and newer; the interpreter runs both, the second with its own conversion)."""
    if (level > 0 and device.type == "cuda"
            and configs.fp8_cvt_level(torch.cuda.get_device_capability(device)) < level):
        pytest.skip("this conversion needs a newer GPU")
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = raw.view(torch.float8_e4m3fn).float()
    got = torch.full((4, 256), float("nan"), dtype=torch.float32, device=device)
    _decode_kernel[(1,)](raw.to(device), got, FP8_CVT=level, INTERPRET=interpreting())
    finite = ~torch.isnan(want)
    for form, row in zip(("bytes", "bytes, unit folded", "words", "words, unit folded"), got.cpu()):
        assert torch.equal(row[finite], want[finite]), form
