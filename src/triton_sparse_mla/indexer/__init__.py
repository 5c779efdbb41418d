"""The DSA indexer's scores (vLLM's DeepGEMM ``fp8_mqa_logits`` and ``fp8_paged_mqa_logits``)
for GPUs DeepGEMM has no kernels for (SM80/86/89)."""

from .api import fp8_products, mqa_logits, paged_mqa_logits
from .cache_layout import pack_indexer_k_cache, unpack_indexer_k_cache
from .reference import mqa_logits_reference, paged_mqa_logits_reference
from .warmup import warmup

__all__ = [
    "fp8_products",
    "mqa_logits",
    "paged_mqa_logits",
    "mqa_logits_reference",
    "paged_mqa_logits_reference",
    "pack_indexer_k_cache",
    "unpack_indexer_k_cache",
    "warmup",
]
