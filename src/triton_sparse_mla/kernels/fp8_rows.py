"""The rows vLLM's DSA layers cache in fp8, built without Triton's fp8 type (SM80/86).

Below SM89 vLLM's fused kernel that normalizes, ropes and quantizes these rows does not compile,
and vllm_plugin/sm8x_model_kernels.py replaces it. These kernels do its quantizing part in one
launch per cache (the rows are then placed by kernels/scatter.py), one program per token, in
fp32 by vLLM's formulas, with power-of-two scales and the bytes encoded by integer operations
(kernels/e4m3_encode.py):

* indexer keys: LayerNorm, rope of the first ``2 HALF`` values (NeoX or interleaved pairs), one
  scale per row, ``2^ceil(log2(max(amax, 1e-4) / 448))``;
* fp8_ds_mla rows: RMS norm of the 512 latent values, one scale per 128-value tile,
  ``2^ceil(log2(max(amax / 448, 1e-4)))``, the values, the four fp32 scales, then the roped
  rope part's 64 bf16 values (vLLM's kernel ropes those), 656 bytes.
"""

import torch
import triton
import triton.language as tl

from .common import LAUNCH_OPTIONS
from .e4m3_encode import f32_to_e4m3_bits

E4M3_MAX = tl.constexpr(448.0)
INDEXER_MIN_AMAX = tl.constexpr(1e-4)  # vLLM's floor on an indexer row's amax
DS_MLA_MIN_SCALE = tl.constexpr(1e-4)  # vLLM's floor on an fp8_ds_mla tile's scale
LAT, TILE, D_PE, ROW_BYTES = 512, 128, 64, 656


@triton.jit
def pow2_ceil(v):
    """The smallest power of two at least ``v`` (fp32, positive and normal), from its bits."""
    bits = v.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def indexer_key_rows_kernel(k_ptr, w_ptr, b_ptr, cos_sin_ptr, pos_ptr, out_ptr, scale_ptr, eps,
                            stride_k, stride_cs, D: tl.constexpr, HALF: tl.constexpr,
                            INTERLEAVE: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, D)
    p_k = k_ptr + i_t * stride_k
    x = tl.load(p_k + o).to(tl.float32)
    mean = tl.sum(x, axis=0) / D
    centred = x - mean
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / D + eps)
    normed = centred * rstd * tl.load(w_ptr + o).to(tl.float32) + tl.load(b_ptr + o).to(tl.float32)
    # the rope pairs: each value of the first 2 HALF with its partner, re-normalized from the input
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
    normed_partner = ((tl.load(p_k + partner).to(tl.float32) - mean) * rstd
                      * tl.load(w_ptr + partner).to(tl.float32) + tl.load(b_ptr + partner).to(tl.float32))
    p_cs = cos_sin_ptr + tl.load(pos_ptr + i_t).to(tl.int64) * stride_cs
    cos = tl.load(p_cs + i_cs, mask=in_rope, other=1.0).to(tl.float32)
    sin = tl.load(p_cs + HALF + i_cs, mask=in_rope, other=0.0).to(tl.float32)
    y = tl.where(in_rope, normed * cos + sign * normed_partner * sin, normed)
    scale = pow2_ceil(tl.div_rn(tl.maximum(tl.max(tl.abs(y), axis=0), INDEXER_MIN_AMAX), E4M3_MAX))
    tl.store(out_ptr + i_t * D + o, f32_to_e4m3_bits(tl.div_rn(y, scale)).to(tl.uint8))
    tl.store(scale_ptr + i_t, scale)


@triton.jit
def ds_mla_rows_kernel(kv_ptr, w_ptr, kpe_ptr, out_ptr, eps, stride_kv, stride_kpe,
                       LAT: tl.constexpr, TILE: tl.constexpr, D_PE: tl.constexpr,
                       ROW_BYTES: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, LAT)
    x = tl.load(kv_ptr + i_t * stride_kv + o).to(tl.float32)
    rrms = tl.rsqrt(tl.sum(x * x, axis=0) / LAT + eps)
    y = tl.reshape(x * rrms * tl.load(w_ptr + o).to(tl.float32), [LAT // TILE, TILE])
    scale = pow2_ceil(tl.maximum(tl.max(tl.abs(y), axis=1) * (1.0 / E4M3_MAX), DS_MLA_MIN_SCALE))
    p_out = out_ptr + i_t * ROW_BYTES
    codes = f32_to_e4m3_bits(tl.div_rn(y, scale[:, None])).to(tl.uint8)
    tl.store(p_out + tl.reshape(tl.arange(0, LAT), [LAT // TILE, TILE]), codes)
    tl.store((p_out + LAT).to(tl.pointer_type(tl.float32), bitcast=True)
             + tl.arange(0, LAT // TILE), scale)
    o_pe = tl.arange(0, D_PE)
    rope = tl.load(kpe_ptr + i_t * stride_kpe + o_pe).to(tl.float32).to(tl.bfloat16)
    tl.store((p_out + LAT + 4 * (LAT // TILE)).to(tl.pointer_type(tl.bfloat16), bitcast=True) + o_pe, rope)


def indexer_key_rows(index_k: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                     cos_sin_cache: torch.Tensor, positions: torch.Tensor, interleave: bool):
    """``(values uint8 [T, D], scales fp32 [T])``: the indexer keys ``index_k [T, D]`` (16-bit,
    unit stride in D) after LayerNorm (``weight``, ``bias`` [D]) and rope (``cos_sin_cache
    [max_pos, 2 HALF]`` at ``positions [T]``), quantized with one power-of-two scale per row."""
    t, d = index_k.shape
    values = torch.empty(t, d, dtype=torch.uint8, device=index_k.device)
    scales = torch.empty(t, dtype=torch.float32, device=index_k.device)
    if t:
        indexer_key_rows_kernel[(t,)](
            index_k, weight, bias, cos_sin_cache, positions, values, scales, float(eps),
            index_k.stride(0), cos_sin_cache.stride(0), D=d, HALF=cos_sin_cache.shape[-1] // 2,
            INTERLEAVE=bool(interleave), num_warps=1, **LAUNCH_OPTIONS)
    return values, scales


def ds_mla_rows(kv_c: torch.Tensor, weight: torch.Tensor, eps: float, k_pe: torch.Tensor):
    """``uint8 [T, 656]`` fp8_ds_mla rows: the latent ``kv_c [T, 512]`` after RMS norm
    (``weight`` [512]) in fp8 with its four tile scales, then ``k_pe [T, 64]`` (roped; stored as
    bf16). Both inputs with unit stride in their last dimension."""
    t = kv_c.shape[0]
    rows = torch.empty(t, ROW_BYTES, dtype=torch.uint8, device=kv_c.device)
    if t:
        ds_mla_rows_kernel[(t,)](kv_c, weight, k_pe, rows, float(eps), kv_c.stride(0), k_pe.stride(0),
                                 LAT=LAT, TILE=TILE, D_PE=D_PE, ROW_BYTES=ROW_BYTES, num_warps=4,
                                 **LAUNCH_OPTIONS)
    return rows
