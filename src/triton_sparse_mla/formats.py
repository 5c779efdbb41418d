"""KV cache row formats.

A cache row holds one token's latent key/value. Three formats exist:

* ``bf16`` / ``fp16`` with 576 values: ``[nope 512 | rope 64]`` (DeepSeek-V3.2, GLM-5).
* ``bf16`` / ``fp16`` with 512 values: NoPE models (GLM-5.3-Flash).
* ``fp8_ds_mla``: 656 bytes (uint8) per row, 576 geometry::

      bytes [0, 512)    512 x float8_e4m3fn, four tiles of 128 values
      bytes [512, 528)  4 x float32 scale, one per tile (value = fp8 * scale)
      bytes [528, 656)  64 x bfloat16 rope

The first 512 values of a row are also the value vector (D_V = 512).
"""

from __future__ import annotations

import torch

D_NOPE = 512
D_ROPE = 64
D_V = 512
FP8_TILE = 128
FP8_NUM_TILES = D_NOPE // FP8_TILE
FP8_SCALE_OFFSET = D_NOPE
FP8_ROPE_OFFSET = D_NOPE + 4 * FP8_NUM_TILES
FP8_ROW_BYTES = FP8_ROPE_OFFSET + 2 * D_ROPE  # 656
E4M3_MAX = 448.0

SCALE_STYLES = ("amax", "pow2")


def quantize_fp8_ds_mla(rows: torch.Tensor, scale_style: str = "amax",
                        min_scale: float = 0.0) -> torch.Tensor:
    """Quantize latent rows to the 656-byte fp8_ds_mla layout.

    Args:
        rows: ``[N, 576]`` floating tensor (bf16, fp16 or fp32), ``[nope 512 | rope 64]``.
        scale_style: ``"amax"`` stores ``amax / 448`` per 128-value tile; ``"pow2"`` stores the
            smallest power of two that is ``>= amax / 448``. Both writers exist in vLLM.
        min_scale: a floor on ``amax / 448`` before it is rounded (vLLM's Triton writer: 1e-4).

    Returns:
        ``[N, 656]`` uint8 on the same device.
    """
    if rows.dim() != 2 or rows.shape[1] != D_NOPE + D_ROPE:
        raise ValueError(f"rows: expected shape [N, {D_NOPE + D_ROPE}], got {list(rows.shape)}")
    if not rows.is_floating_point():
        raise TypeError(f"rows: expected a floating dtype, got {rows.dtype}")
    if scale_style not in SCALE_STYLES:
        raise ValueError(f"scale_style: expected one of {SCALE_STYLES}, got {scale_style!r}")
    n = rows.shape[0]
    nope = rows[:, :D_NOPE].float().reshape(n, FP8_NUM_TILES, FP8_TILE)
    amax = nope.abs().amax(dim=-1).clamp_min(1e-30)  # [N, 4]
    scale = (amax / E4M3_MAX).clamp_min(min_scale)
    if scale_style == "pow2":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (nope / scale[:, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.empty(n, FP8_ROW_BYTES, dtype=torch.uint8, device=rows.device)
    out[:, :D_NOPE] = q.reshape(n, D_NOPE).view(torch.uint8)
    out[:, FP8_SCALE_OFFSET:FP8_ROPE_OFFSET] = scale.to(torch.float32).contiguous().view(torch.uint8)
    rope = rows[:, D_NOPE:].to(torch.bfloat16).contiguous()
    out[:, FP8_ROPE_OFFSET:] = rope.view(torch.uint8)
    return out


def dequantize_fp8_ds_mla(packed: torch.Tensor) -> torch.Tensor:
    """Unpack fp8_ds_mla rows back to values.

    Args:
        packed: ``[N, 656]`` uint8 (any row stride).

    Returns:
        ``[N, 576]`` float32: ``fp8 * scale`` for the 512 latent values, then the 64 rope values.
    """
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed: expected torch.uint8, got {packed.dtype}")
    if packed.dim() != 2 or packed.shape[1] != FP8_ROW_BYTES:
        raise ValueError(f"packed: expected shape [N, {FP8_ROW_BYTES}], got {list(packed.shape)}")
    n = packed.shape[0]
    q = packed[:, :D_NOPE].contiguous().view(torch.float8_e4m3fn).float()
    scale = packed[:, FP8_SCALE_OFFSET:FP8_ROPE_OFFSET].contiguous().view(torch.float32)  # [N, 4]
    nope = (q.reshape(n, FP8_NUM_TILES, FP8_TILE) * scale[:, :, None]).reshape(n, D_NOPE)
    rope = packed[:, FP8_ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)


def row_format(kv: torch.Tensor) -> str:
    """Name the format of flat cache rows ``[N, C]``: ``"fp8_ds_mla"``, ``"bf16"`` or ``"fp16"``.

    Raises ``ValueError``/``TypeError`` when dtype and width match no format.
    """
    width = kv.shape[-1]
    if kv.dtype == torch.uint8:
        if width != FP8_ROW_BYTES:
            raise ValueError(
                f"kv: uint8 rows must be fp8_ds_mla with {FP8_ROW_BYTES} bytes, got width {width}"
            )
        return "fp8_ds_mla"
    if kv.dtype in (torch.bfloat16, torch.float16):
        if width not in (D_NOPE, D_NOPE + D_ROPE):
            raise ValueError(
                f"kv: {kv.dtype} rows must have {D_NOPE + D_ROPE} or {D_NOPE} values, got {width}"
            )
        return "bf16" if kv.dtype == torch.bfloat16 else "fp16"
    raise TypeError(f"kv: expected torch.bfloat16, torch.float16 or torch.uint8, got {kv.dtype}")


def row_values(kv: torch.Tensor) -> torch.Tensor:
    """Rows ``[N, C]`` of any format as float64 values ``[N, D_QK]`` (for the reference)."""
    if row_format(kv) == "fp8_ds_mla":
        return dequantize_fp8_ds_mla(kv).double()
    return kv.double()
