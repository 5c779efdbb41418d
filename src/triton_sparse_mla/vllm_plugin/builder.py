"""Attention metadata for ``TRITON_MLA_SPARSE``: vLLM's common sparse-MLA metadata as is.

The kernel runs one program per (token, head block) with the token's own top-k row and
valid count, so it needs no per-request planning: mixed batches, spec-decode (several query
tokens per request) and padded rows all use the common fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonMetadata,
    SparseMLACommonMetadataBuilder,
)
from vllm.v1.attention.backend import AttentionCGSupport

REORDER_BATCH_THRESHOLD = 1
"""Requests with at most this many query tokens (plus spec-decode drafts) go first as decodes."""


@dataclass(kw_only=True)
class TritonMLASparseMetadata(SparseMLACommonMetadata):
    """No fields beyond the common ones (block_table, req_id_per_token, num_decode_tokens, ...)."""


class TritonMLASparseMetadataBuilder(SparseMLACommonMetadataBuilder[TritonMLASparseMetadata]):
    """Builds :class:`TritonMLASparseMetadata`; host work only, no device sync beyond the base's."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    require_uniform_decodes: ClassVar[bool] = False
    metadata_cls = TritonMLASparseMetadata

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # The base class leaves this unset; without it decodes are never reordered to the front.
        self._init_reorder_batch_threshold(REORDER_BATCH_THRESHOLD, supports_spec_as_decode=True)
