"""kernels/fp8_rows.py: the rows the SM80/86 replacements cache in fp8, against float64 values
rounded once (vLLM's formulas: tests/vllm/test_sm8x_model_kernels.py also compares them with
vLLM's own kernel). Cached rows are written to their slots of a poisoned paged cache, in
shuffled order with padding tokens (negative slots): every other byte must stay."""

import pytest
import torch

from problems import rope_reference
from triton_sparse_mla.indexer.cache_layout import unpack_indexer_k_cache
from triton_sparse_mla.kernels.fp8_rows import (indexer_query_rows, interleaved_rope,
                                               write_ds_mla_rows, write_indexer_key_rows)

FP8 = torch.float8_e4m3fn
POISON = 0xA5
BLOCK_SIZE = 4


def _slots(g, t, n_blocks):
    """``t`` distinct slots in shuffled order over ``n_blocks`` blocks, every third one -1 (a
    padding token), none 0 (where a padding token's row would land were its mask lost):
    ``(slots int64 [t], written [t] bool)``."""
    slots = torch.randperm(n_blocks * BLOCK_SIZE - 1, generator=g)[:t] + 1
    slots[::3] = -1
    return slots, slots >= 0


def _pow2_ceil(v):
    return torch.exp2(torch.ceil(torch.log2(v)))


def _rounded_once(got, exact, scale):
    """The bytes of ``exact / scale`` rounded to e4m3, but for a few (fp32 arithmetic can cross
    a midpoint), each of those the neighbouring code of the same sign and never NaN's."""
    want = (exact / scale).to(FP8).view(torch.uint8)
    differ = got != want
    assert differ.sum() <= max(2, differ.numel() // 200), f"{int(differ.sum())} of {differ.numel()} differ"
    g, w = got[differ].int(), want[differ].int()
    assert torch.all(((g ^ w) & 0x80) == 0) and torch.all((g - w).abs() == 1), (g, w)
    assert torch.all((g & 0x7F) != 0x7F), "a NaN byte"


@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "interleaved"])
def test_indexer_query_rows(device, interleave):
    g = torch.Generator().manual_seed(5 + int(interleave))
    t, h, d, n_pos = 5, 6, 128, 40
    q = (torch.randn(t, h, d, generator=g) * 3).bfloat16()
    q[1, 2] = 0  # a row whose amax is under vLLM's floor
    cos_sin = torch.randn(n_pos, 64, generator=g)
    pos = torch.randint(0, n_pos, (t,), generator=g)
    weights = torch.randn(t, h, generator=g).bfloat16()
    values, w = indexer_query_rows(q.to(device), cos_sin.to(device), pos.to(device), interleave,
                                   weights.to(device), 128 ** -0.5, h ** -0.5)
    roped = rope_reference(q.double(), cos_sin, pos, interleave)
    scale = _pow2_ceil(roped.abs().amax(-1).clamp_min(1e-4) / 448).float()
    _rounded_once(values.cpu(), roped, scale.double()[..., None])
    assert torch.equal(w.cpu(), weights.float() * scale * (128 ** -0.5) * (h ** -0.5))


def test_interleaved_rope(device):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 3, 64, generator=g).bfloat16()
    cos_sin = torch.randn(20, 64, generator=g)
    pos = torch.tensor([3, 0, 19, 3])
    got = interleaved_rope(x.to(device), cos_sin.to(device), pos.to(device)).cpu()
    assert got.dtype == torch.bfloat16
    want = rope_reference(x.double(), cos_sin, pos, True)
    # (one bf16 step: the interpreter's bf16 conversion does not round to nearest)
    assert torch.allclose(got.double(), want, rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "interleaved"])
def test_indexer_key_rows(device, interleave):
    g = torch.Generator().manual_seed(int(interleave))
    t, d, half, n_pos, n_blocks = 7, 128, 32, 50, 3
    keys = (torch.randn(t, d, generator=g) * 3).bfloat16()
    keys[4] = 0  # a row whose amax is under vLLM's floor
    w, b = torch.rand(d, generator=g) + 0.5, torch.randn(d, generator=g) * 0.1
    cos_sin = torch.randn(n_pos, 2 * half, generator=g)
    pos = torch.randint(0, n_pos, (t,), generator=g)
    slots, written = _slots(g, t, n_blocks)
    got = torch.full((n_blocks, BLOCK_SIZE, 1, d + 4), POISON, dtype=torch.uint8, device=device)
    write_indexer_key_rows(keys.to(device), w.to(device), b.to(device), 1e-6, cos_sin.to(device),
                           pos.to(device), interleave, got, slots.to(device))
    x = keys.double()
    centred = x - x.mean(-1, keepdim=True)
    y = centred * torch.rsqrt((centred * centred).mean(-1, keepdim=True) + 1e-6) * w.double() + b.double()
    roped = rope_reference(y, cos_sin, pos, interleave)
    want_scale = _pow2_ceil(roped.abs().amax(-1).clamp_min(1e-4) / 448).float()
    values, scales = unpack_indexer_k_cache(got.cpu())
    values, scales = values.reshape(-1, d).view(torch.uint8), scales.reshape(-1)
    kept = slots[written]
    assert torch.equal(scales[kept], want_scale[written])
    _rounded_once(values[kept], roped[written], want_scale.double()[written, None])
    # every byte of every slot no token was written to is as it was
    untouched = torch.ones(n_blocks * BLOCK_SIZE, dtype=torch.bool)
    untouched[kept] = False
    assert (values[untouched] == POISON).all()
    assert (scales[untouched].view(torch.uint8) == POISON).all()


def test_ds_mla_rows(device):
    g = torch.Generator().manual_seed(3)
    t, n_blocks = 8, 3
    tile_size = torch.tensor([1.0, 30.0, 1e-3, 5.0]).repeat_interleave(128)
    kv = (torch.randn(t, 512, generator=g) * tile_size).bfloat16()
    kv[2] = 0  # every tile's scale at vLLM's floor
    w = torch.rand(512, generator=g) + 0.5
    k_pe = torch.randn(t, 64, generator=g).bfloat16()
    slots, written = _slots(g, t, n_blocks)
    # rows padded to 700 bytes (a strided view), as a cache with padded entries would be
    got = torch.full((n_blocks, BLOCK_SIZE, 700), POISON, dtype=torch.uint8, device=device)
    write_ds_mla_rows(kv.to(device), w.to(device), 1e-6, k_pe.to(device), got[:, :, :656],
                      slots.to(device))
    got = got.cpu().reshape(-1, 700)
    rows = got[slots[written], :656]
    x = kv.double()[written]
    latent = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w.double()
    tiles = latent.reshape(-1, 4, 128)
    want_scale = _pow2_ceil((tiles.abs().amax(-1) / 448).clamp_min(1e-4)).float()
    assert torch.equal(rows[:, 512:528].contiguous().view(torch.float32), want_scale)
    _rounded_once(rows[:, :512].reshape(-1, 4, 128), tiles, want_scale.double()[:, :, None])
    assert torch.equal(rows[:, 528:].contiguous().view(torch.bfloat16), k_pe[written])
    untouched = torch.ones(n_blocks * BLOCK_SIZE, dtype=torch.bool)
    untouched[slots[written]] = False
    assert (got[untouched] == POISON).all() and (got[:, 656:] == POISON).all()


def test_no_rows(device):
    empty = torch.zeros(0, 128, dtype=torch.bfloat16, device=device)
    ones = torch.ones(128, device=device)
    no_slots = torch.zeros(0, dtype=torch.int64, device=device)
    cache = torch.full((1, BLOCK_SIZE, 1, 132), POISON, dtype=torch.uint8, device=device)
    write_indexer_key_rows(empty, ones, ones, 1e-6, torch.ones(4, 64, device=device), no_slots,
                           False, cache, no_slots)
    mla = torch.full((1, BLOCK_SIZE, 656), POISON, dtype=torch.uint8, device=device)
    write_ds_mla_rows(torch.zeros(0, 512, device=device), torch.ones(512, device=device), 1e-6,
                      torch.zeros(0, 64, device=device), mla, no_slots)
    assert (cache == POISON).all() and (mla == POISON).all()


def test_bad_caches_and_slots_are_named(device):
    keys = torch.zeros(2, 128, dtype=torch.bfloat16, device=device)
    ones = torch.ones(128, device=device)
    cs, pos = torch.ones(4, 64, device=device), torch.zeros(2, dtype=torch.int64, device=device)
    cache = torch.zeros(1, BLOCK_SIZE, 1, 132, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="slots: expected int32/int64 \\[2\\]"):
        write_indexer_key_rows(keys, ones, ones, 1e-6, cs, pos, False, cache, pos[:1])
    with pytest.raises(ValueError, match="cache: expected .*132"):
        write_indexer_key_rows(keys, ones, ones, 1e-6, cs, pos, False, cache[..., :100], pos)
    with pytest.raises(ValueError, match="cache: expected .*656"):
        write_ds_mla_rows(torch.zeros(2, 512, device=device), torch.ones(512, device=device), 1e-6,
                          torch.zeros(2, 64, device=device), cache, pos)
