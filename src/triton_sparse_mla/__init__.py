"""Portable Triton kernels for sparse Multi-head Latent Attention (DeepSeek-V3.2, GLM-5).

Importing this package touches no GPU and needs no vLLM.
"""

from .api import sparse_mla_attention
from .formats import dequantize_fp8_ds_mla, quantize_fp8_ds_mla
from .reference import sparse_mla_reference

__version__ = "0.1.0"

__all__ = [
    "sparse_mla_attention",
    "sparse_mla_reference",
    "quantize_fp8_ds_mla",
    "dequantize_fp8_ds_mla",
    "__version__",
]
