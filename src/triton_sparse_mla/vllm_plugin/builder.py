"""Attention metadata for ``TRITON_MLA_SPARSE``: vLLM's common sparse-MLA metadata, and a
host-known bound on the cache rows a batch reads and on its valid top-k entries.

The kernel runs one program per (token, head block) with the token's own top-k row and
valid count, so it needs no per-request planning: mixed batches, spec-decode (several query
tokens per request) and padded rows all use the common fields. The bound (the requests'
context lengths summed, from the CPU copy vLLM keeps) lets the fp8_ds_mla prefill workspace
size itself without reading a count back from the device (``sparse_mla_attention``'s
``rows_bound``); the entries' bound (each query token names at most the smaller of its
request's context length and the top-k width) lets its rule see that a batch of short
contexts reads each row a few times only (``entries_bound``).
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
    """The common fields (block_table, req_id_per_token, num_decode_tokens, ...) and
    ``rows_bound``: at least the number of distinct cache rows the batch's tokens can name (the
    sum of its requests' context lengths), or None where vLLM gave no CPU bound on them;
    ``entries_bound``: at least the number of valid top-k entries of the batch's tokens (over
    its requests, query tokens times the smaller of context length and top-k width), or None."""

    rows_bound: int | None = None
    entries_bound: int | None = None


class TritonMLASparseMetadataBuilder(SparseMLACommonMetadataBuilder[TritonMLASparseMetadata]):
    """Builds :class:`TritonMLASparseMetadata`; host work only, no device sync beyond the base's."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    require_uniform_decodes: ClassVar[bool] = False
    metadata_cls = TritonMLASparseMetadata

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # The base class leaves this unset; without it decodes are never reordered to the front.
        self._init_reorder_batch_threshold(REORDER_BATCH_THRESHOLD, supports_spec_as_decode=True)

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        # Each position of a request's context is one cache row, and a token names only rows
        # of its own request's context, at most min(context, top-k) of them: the contexts
        # summed bound the distinct rows, query tokens times that minimum the valid entries.
        num_reqs = common_attn_metadata.num_reqs
        seq_lens = common_attn_metadata.seq_lens_cpu_upper_bound
        if seq_lens is not None:
            seq_lens = seq_lens[:num_reqs].long()
            starts = common_attn_metadata.query_start_loc_cpu.long()
            query_lens = starts[1: num_reqs + 1] - starts[:num_reqs]
            metadata.rows_bound = int(seq_lens.sum())
            metadata.entries_bound = int((query_lens * seq_lens.clamp(max=self.topk_tokens)).sum())
        # vLLM 0.34's ShardQ narrows a copy of the metadata to this rank's tokens inside the
        # base's build, before the bounds are known: they bound that share of the tokens too.
        shardq = getattr(metadata, "shardq", None)
        if shardq is not None:
            shardq.attn_metadata.rows_bound = metadata.rows_bound
            shardq.attn_metadata.entries_bound = metadata.entries_bound
        return metadata
