"""The rows vLLM's DSA layers quantize to fp8, built without Triton's fp8 type (SM80/86).

Below SM89 vLLM's fused kernels that normalize, rope and quantize these rows (``fused_norm_rope``
for the caches, ``fused_q`` for the queries) do not compile, and vllm_plugin/sm8x_model_kernels.py
replaces them. These kernels do that work, one program per row, in fp32 by vLLM's formulas, with
power-of-two scales and the bytes encoded by integer operations (kernels/e4m3_encode.py); cached
rows go straight to their token's slot of the paged cache (``slot = block * block_size +
position``; a negative slot, a padding token, is not written), one launch a cache:

* indexer keys: LayerNorm, rope of the first ``2 HALF`` values (NeoX or interleaved pairs), one
  scale per row, ``2^ceil(log2(max(amax, 1e-4) / 448))``; indexer queries likewise without
  the LayerNorm, one scale per head, and the heads' weights times it (``fused_q``'s part);
* fp8_ds_mla rows: RMS norm of the 512 latent values, one scale per 128-value tile,
  ``2^ceil(log2(max(amax / 448, 1e-4)))``, the values, the four fp32 scales, then the roped
  rope part's 64 bf16 values (vLLM's kernel ropes those), 656 bytes;
* the MLA query's rope part, roped in neighbouring pairs (``fused_q``'s other part).
"""

import torch
import triton
import triton.language as tl

from .. import formats
from .common import LAUNCH_OPTIONS, scalar_mask
from .e4m3_encode import f32_to_e4m3_bits
from .launch import launch

E4M3_MAX = tl.constexpr(formats.E4M3_MAX)
INDEXER_MIN_AMAX = tl.constexpr(1e-4)  # vLLM's floor on an indexer row's amax
DS_MLA_MIN_SCALE = tl.constexpr(1e-4)  # vLLM's floor on an fp8_ds_mla tile's scale
# the fp8_ds_mla row (formats.py): latent, its tile scales, the bf16 rope
LAT, TILE, D_PE, ROW_BYTES = formats.D_NOPE, formats.FP8_TILE, formats.D_ROPE, formats.FP8_ROW_BYTES


@triton.jit
def pow2_ceil(v):
    """The smallest power of two at least ``v`` (fp32, positive and normal), from its bits."""
    bits = v.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def slot_place(slot_ptr, i_t, block_size, block_stride):
    """``(block's byte offset, position in the block, written)`` of token ``i_t``'s slot."""
    slot = tl.load(slot_ptr + i_t).to(tl.int64)
    kept = tl.maximum(slot, 0)
    return (kept // block_size) * block_stride, kept % block_size, slot >= 0


@triton.jit
def indexer_rows_kernel(x_ptr, ln_w_ptr, ln_b_ptr, cos_sin_ptr, pos_ptr, out_ptr, slot_ptr, w_ptr,
                        w_out_ptr, eps, w_factor_a, w_factor_b, n_heads, block_size, block_stride,
                        stride_xt, stride_xh, stride_cs, stride_wt, D: tl.constexpr,
                        HALF: tl.constexpr, INTERLEAVE: tl.constexpr, LN: tl.constexpr,
                        WEIGHTS: tl.constexpr):
    """Row ``(token, head)`` (program ids 0 and 1) of ``x``: with LN its LayerNorm, then the
    rope of its first 2 HALF values, quantized with one power-of-two scale. With ``slot_ptr``
    (keys) the bytes and the scale go to the token's slot of the indexer K cache ``out``
    (indexer/cache_layout.py: a block's values, then its scales); without, the bytes to row
    ``token * n_heads + head`` of ``out``. With WEIGHTS the head's weight times the scale and
    the two factors, in vLLM's order, to ``w_out``."""
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    i_r = i_t * n_heads + i_h
    o = tl.arange(0, D)
    p_x = x_ptr + i_t * stride_xt + i_h * stride_xh
    y = tl.load(p_x + o).to(tl.float32)
    if LN:
        mean = tl.sum(y, axis=0) / D
        centred = y - mean
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / D + eps)
        y = centred * rstd * tl.load(ln_w_ptr + o).to(tl.float32) + tl.load(ln_b_ptr + o).to(tl.float32)
    # the rope pairs: each value of the first 2 HALF with its partner, reloaded (and normalized)
    in_rope = o < 2 * HALF
    if INTERLEAVE:
        partner = o ^ 1
        i_cs = o // 2
        sign = tl.where(o % 2 == 0, -1.0, 1.0)
    else:
        partner = o ^ HALF
        i_cs = o % HALF
        sign = tl.where(o < HALF, -1.0, 1.0)
    partner = tl.where(in_rope, partner, o)
    y_partner = tl.load(p_x + partner).to(tl.float32)
    if LN:
        y_partner = ((y_partner - mean) * rstd * tl.load(ln_w_ptr + partner).to(tl.float32)
                     + tl.load(ln_b_ptr + partner).to(tl.float32))
    p_cs = cos_sin_ptr + tl.load(pos_ptr + i_t).to(tl.int64) * stride_cs
    cos = tl.load(p_cs + i_cs, mask=in_rope, other=1.0).to(tl.float32)
    sin = tl.load(p_cs + HALF + i_cs, mask=in_rope, other=0.0).to(tl.float32)
    y = tl.where(in_rope, y * cos + sign * y_partner * sin, y)
    scale = pow2_ceil(tl.div_rn(tl.maximum(tl.max(tl.abs(y), axis=0), INDEXER_MIN_AMAX), E4M3_MAX))
    codes = f32_to_e4m3_bits(tl.div_rn(y, scale)).to(tl.uint8)
    if slot_ptr is not None:
        base, at, written = slot_place(slot_ptr, i_t, block_size, block_stride)
        tl.store(out_ptr + base + at * D + o, codes, mask=scalar_mask(o, written))
        p_scale = out_ptr + base + block_size * D + 4 * at
        tl.store(p_scale.to(tl.pointer_type(tl.float32), bitcast=True), scale, mask=written)
    else:
        tl.store(out_ptr + i_r * D + o, codes)
    if WEIGHTS:
        w = tl.load(w_ptr + i_t * stride_wt + i_h).to(tl.float32)
        w = w * scale
        w = w * w_factor_a
        w = w * w_factor_b
        tl.store(w_out_ptr + i_r, w)


@triton.jit
def interleaved_rope_kernel(x_ptr, cos_sin_ptr, pos_ptr, out_ptr, stride_xt, stride_xh, stride_cs,
                            stride_ot, stride_oh, HALF: tl.constexpr):
    """Row ``(token, head)`` of ``x``: its first 2 HALF values roped in neighbouring pairs (fp32),
    stored in ``out``'s dtype."""
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o = tl.arange(0, HALF)
    p_x = x_ptr + i_t * stride_xt + i_h * stride_xh
    x1 = tl.load(p_x + 2 * o).to(tl.float32)
    x2 = tl.load(p_x + 2 * o + 1).to(tl.float32)
    p_cs = cos_sin_ptr + tl.load(pos_ptr + i_t).to(tl.int64) * stride_cs
    cos = tl.load(p_cs + o).to(tl.float32)
    sin = tl.load(p_cs + HALF + o).to(tl.float32)
    p_o = out_ptr + i_t * stride_ot + i_h * stride_oh
    tl.store(p_o + 2 * o, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty))
    tl.store(p_o + 2 * o + 1, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty))


@triton.jit
def ds_mla_rows_kernel(kv_ptr, w_ptr, kpe_ptr, out_ptr, slot_ptr, eps, block_size, block_stride,
                       row_stride, stride_kv, stride_kpe, LAT: tl.constexpr, TILE: tl.constexpr,
                       D_PE: tl.constexpr):
    """Row ``token`` (program id 0) of ``kv``: its RMS norm (weights ``w``) quantized with one
    power-of-two scale per TILE values, the scales, then row ``token`` of ``kpe`` as bf16: one
    fp8_ds_mla row, to the token's slot of the cache ``out`` (rows ``row_stride`` bytes apart
    in a block)."""
    i_t = tl.program_id(0).to(tl.int64)
    base, at, written = slot_place(slot_ptr, i_t, block_size, block_stride)
    o = tl.arange(0, LAT)
    x = tl.load(kv_ptr + i_t * stride_kv + o).to(tl.float32)
    rrms = tl.rsqrt(tl.sum(x * x, axis=0) / LAT + eps)
    y = tl.reshape(x * rrms * tl.load(w_ptr + o).to(tl.float32), [LAT // TILE, TILE])
    scale = pow2_ceil(tl.maximum(tl.max(tl.abs(y), axis=1) * (1.0 / E4M3_MAX), DS_MLA_MIN_SCALE))
    p_out = out_ptr + base + at * row_stride
    codes = f32_to_e4m3_bits(tl.div_rn(y, scale[:, None])).to(tl.uint8)
    o_codes = tl.reshape(tl.arange(0, LAT), [LAT // TILE, TILE])
    tl.store(p_out + o_codes, codes, mask=scalar_mask(o_codes, written))
    o_scales = tl.arange(0, LAT // TILE)
    tl.store((p_out + LAT).to(tl.pointer_type(tl.float32), bitcast=True) + o_scales, scale,
             mask=scalar_mask(o_scales, written))
    o_pe = tl.arange(0, D_PE)
    rope = tl.load(kpe_ptr + i_t * stride_kpe + o_pe).to(tl.bfloat16)
    tl.store((p_out + LAT + 4 * (LAT // TILE)).to(tl.pointer_type(tl.bfloat16), bitcast=True) + o_pe,
             rope, mask=scalar_mask(o_pe, written))


def _check_slots(slots: torch.Tensor, t: int) -> None:
    if slots.dim() != 1 or slots.shape[0] != t or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots: expected int32/int64 [{t}] (one per token), got {slots.dtype} "
                         f"{list(slots.shape)}")


def write_indexer_key_rows(index_k: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                           eps: float, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                           interleave: bool, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write the indexer keys ``index_k [T, D]`` (unit stride in D) after LayerNorm (``weight``,
    ``bias`` [D]) and rope (``cos_sin_cache [max_pos, 2 HALF]`` at ``positions [T]``), quantized
    with one power-of-two scale per row, to vLLM's indexer K cache ``cache [blocks,
    block_size, ..., D + 4]`` (any dtype of those bytes; indexer/cache_layout.py) at ``slots
    [T]`` (negative: not written)."""
    t, d = index_k.shape
    _check_slots(slots, t)
    u8 = cache.view(torch.uint8)
    if u8.shape[-1] != d + 4 or u8[0].numel() != u8.shape[1] * (d + 4) or not u8[0].is_contiguous():
        raise ValueError(f"cache: expected [blocks, block_size, ..., {d + 4}] with its blocks' bytes "
                         f"contiguous (D = {d}), got {list(u8.shape)} strides {u8.stride()}")
    if t:
        launch(
            indexer_rows_kernel, (t, 1),
            index_k, weight, bias, cos_sin_cache, positions, u8, slots, None, None, float(eps),
            1.0, 1.0, 1, u8.shape[1], u8.stride(0), index_k.stride(0), 0, cos_sin_cache.stride(0),
            0, D=d, HALF=cos_sin_cache.shape[-1] // 2, INTERLEAVE=bool(interleave), LN=True,
            WEIGHTS=False, num_warps=1, **LAUNCH_OPTIONS)


def indexer_query_rows(index_q: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                       interleave: bool, weights: torch.Tensor, factor_a: float, factor_b: float):
    """``(values uint8 [T, H, D], weights fp32 [T, H])``: the indexer queries ``index_q [T, H,
    D]`` (unit stride in D) after rope, quantized with one power-of-two scale per head, and the
    heads' ``weights [T, H]`` times that scale, ``factor_a`` and ``factor_b`` (vLLM's order)."""
    t, h, d = index_q.shape
    values = torch.empty(t, h, d, dtype=torch.uint8, device=index_q.device)
    w_out = torch.empty(t, h, dtype=torch.float32, device=index_q.device)
    if t and h:
        launch(
            indexer_rows_kernel, (t, h),
            index_q, None, None, cos_sin_cache, positions, values, None, weights, w_out, 0.0,
            float(factor_a), float(factor_b), h, 0, 0, index_q.stride(0), index_q.stride(1),
            cos_sin_cache.stride(0), weights.stride(0), D=d, HALF=cos_sin_cache.shape[-1] // 2,
            INTERLEAVE=bool(interleave), LN=False, WEIGHTS=True, num_warps=1, **LAUNCH_OPTIONS)
    return values, w_out


def interleaved_rope(x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``x [T, H, 2 HALF]`` (unit stride in the last dimension) roped in neighbouring pairs, in
    ``x``'s dtype (the MLA query's rope part)."""
    t, h, _ = x.shape
    out = torch.empty(t, h, x.shape[-1], dtype=x.dtype, device=x.device)
    if t and h:
        launch(interleaved_rope_kernel, (t, h), x, cos_sin_cache, positions, out, x.stride(0),
               x.stride(1), cos_sin_cache.stride(0), out.stride(0), out.stride(1),
               HALF=cos_sin_cache.shape[-1] // 2, num_warps=1, **LAUNCH_OPTIONS)
    return out


def write_ds_mla_rows(kv_c: torch.Tensor, weight: torch.Tensor, eps: float, k_pe: torch.Tensor,
                      cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write fp8_ds_mla rows (656 bytes: the latent ``kv_c [T, 512]`` after RMS norm (``weight``
    [512]) in fp8 with its four tile scales, then ``k_pe [T, 64]``, roped, as bf16) to the MLA
    cache ``cache [blocks, block_size, 656]`` (any dtype of those bytes; rows may be padded) at
    ``slots [T]`` (negative: not written). Both inputs with unit stride in their last
    dimension."""
    t = kv_c.shape[0]
    _check_slots(slots, t)
    u8 = cache.view(torch.uint8)
    if u8.dim() != 3 or u8.shape[-1] != ROW_BYTES or u8.stride(-1) != 1:
        raise ValueError(f"cache: expected [blocks, block_size, {ROW_BYTES}] bytes with unit stride "
                         f"in the last, got {list(u8.shape)} strides {u8.stride()}")
    if t:
        launch(ds_mla_rows_kernel, (t,), kv_c, weight, k_pe, u8, slots, float(eps), u8.shape[1],
               u8.stride(0), u8.stride(1), kv_c.stride(0), k_pe.stride(0), LAT=LAT, TILE=TILE,
               D_PE=D_PE, num_warps=4, **LAUNCH_OPTIONS)
