"""``TRITON_MLA_SPARSE`` attention impl: vLLM's sparse-MLA base with our kernel in the MQA hook.

vLLM's ``SparseMLACommonImpl.forward_mqa`` turns the indexer's request-local top-k positions
into flat physical row ids (``block * block_stride_rows + offset``; invalid entries ``-1``,
valid ones compacted to the front) and per-token valid counts, then calls
:meth:`TritonMLASparseImpl._forward_mqa_kernel`, which hands them to
:func:`triton_sparse_mla.sparse_mla_attention` over a flat row view of the paged cache.
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.attention.sparse_mla_attention import SparseMLACommonImpl
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.mla.sparse_utils import flat_kv_row_view

from triton_sparse_mla import sparse_mla_attention, warmup

from . import indexer_fallback, sm8x_model_kernels
from .backend import KV_LORA_RANK, ROPE_DIM, TritonMLASparseBackend
from .builder import TritonMLASparseMetadata
from .selection import BACKEND_NAME

# Zero rope queries for NoPE models on fp8_ds_mla rows, shared by all layers:
# (device, dtype, heads) -> [rows, heads, 64] zeros.
_ZERO_Q_PE: dict[tuple, torch.Tensor] = {}


WORKSPACE_ENV = "TRITON_SPARSE_MLA_FP8_WORKSPACE"


def fp8_workspace_setting(environ=None):
    """``fp8_workspace`` for every call, from ``TRITON_SPARSE_MLA_FP8_WORKSPACE``: ``auto``
    (default: fp8_ds_mla prefill of 1024 or more tokens through the workspace of distinct rows,
    :mod:`triton_sparse_mla.workspace`) or ``off`` (the rows are always converted in the
    kernel; no workspace memory)."""
    env = os.environ if environ is None else environ
    value = env.get(WORKSPACE_ENV, "auto").strip().lower()
    if value not in ("auto", "off"):
        raise ValueError(f"{WORKSPACE_ENV}: expected 'auto' or 'off', got {value!r}")
    return None if value == "auto" else False


WARMUP_ENV = "TRITON_SPARSE_MLA_WARMUP"
# Kinds of call already warmed up in this process (triton_sparse_mla.warmup's arguments).
_WARMED: set[tuple] = set()


def warmup_setting(environ=None) -> bool:
    """Whether layers compile their kernels when they are built, from
    ``TRITON_SPARSE_MLA_WARMUP``: ``on`` (default) or ``off`` (compile on first use)."""
    env = os.environ if environ is None else environ
    value = env.get(WARMUP_ENV, "on").strip().lower()
    if value not in ("on", "off"):
        raise ValueError(f"{WARMUP_ENV}: expected 'on' or 'off', got {value!r}")
    return value == "on"


def _warm_up(num_heads, kv_cache_dtype, d_qk, need_lse, topk_indices_buffer) -> None:
    """Compile, once per kind of call in this process, every kernel variant this layer's calls
    can take (triton_sparse_mla.warmup), so that none compiles while serving."""
    config = get_current_vllm_config()
    dtype = config.model_config.dtype
    fp8 = kv_cache_dtype == "fp8_ds_mla"
    kind = dict(num_heads=num_heads, q_dtype=dtype,
                kv_format="fp8_ds_mla" if fp8 else "bf16" if dtype == torch.bfloat16 else "fp16",
                d_qk=KV_LORA_RANK + ROPE_DIM if fp8 else d_qk,
                topk=topk_indices_buffer.shape[1],
                max_tokens=max(config.scheduler_config.max_num_batched_tokens,
                               topk_indices_buffer.shape[0]),
                topk_length=True, return_lse=need_lse, attn_sink=False,
                device=topk_indices_buffer.device)
    key = tuple(sorted((k, str(v)) for k, v in kind.items()))
    if key not in _WARMED:
        warmup.warmup(**kind)
        _WARMED.add(key)


class TritonMLASparseImpl(SparseMLACommonImpl[TritonMLASparseMetadata]):
    """Sparse MLA decode and prefill through one top-k kernel; no dense-MHA prefill path.

    ShardQ (vLLM 0.34, ``sparse_mla_shard_q``): under tensor parallelism, vLLM may run a long
    prefill step's tokens sharded by token instead of by head, so that a rank's call carries
    every rank's heads (``tensor_parallel_size * num_heads``) for its share of the tokens, with
    the top-k rows read from ``topk_start`` on. The kernel takes any head count; the layer
    reserves its zero rope queries and compiles its kernels for both head counts.
    """

    supports_dense_mha_prefill: ClassVar[bool] = False
    supports_pcp: ClassVar[bool] = False
    supports_dcp: ClassVar[bool] = False
    supports_shardq: ClassVar[bool] = True
    can_return_lse_for_decode: ClassVar[bool] = True
    lse_base_on_e: ClassVar[bool] = True

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes,
        sliding_window,
        kv_cache_dtype: str,
        logits_soft_cap,
        attn_type: str,
        kv_sharing_target_layer_name,
        indexer=None,
        **mla_args,
    ) -> None:
        _check_features(alibi_slopes, sliding_window, logits_soft_cap, attn_type)
        if kv_cache_dtype not in TritonMLASparseBackend.cache_dtypes:
            raise ValueError(
                f"{BACKEND_NAME}: kv_cache_dtype must be one of "
                f"{list(TritonMLASparseBackend.cache_dtypes)}, got {kv_cache_dtype!r} "
                "(pass --kv-cache-dtype fp8_ds_mla for the fp8 cache)"
            )
        if head_size not in TritonMLASparseBackend.get_supported_head_sizes():
            raise ValueError(f"{BACKEND_NAME}: head_size must be 576 or 512, got {head_size}")
        topk_indices_buffer = mla_args.pop("topk_indices_buffer", None)
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            indexer=indexer,
            topk_indices_buffer=topk_indices_buffer,
            **mla_args,
        )
        if self.kv_lora_rank != KV_LORA_RANK:
            raise ValueError(f"{BACKEND_NAME}: kv_lora_rank must be {KV_LORA_RANK}, got {self.kv_lora_rank}")
        if self.qk_rope_head_dim not in (0, ROPE_DIM):
            raise ValueError(
                f"{BACKEND_NAME}: qk_rope_head_dim must be {ROPE_DIM} or 0, got {self.qk_rope_head_dim}"
            )
        # The kernel reads bf16/fp16 queries; never hand it an fp8-quantized query.
        self.supports_quant_query_input = False
        self._zero_q_pe: torch.Tensor | None = None
        self._fp8_workspace = fp8_workspace_setting()
        # The current batch's host-known bounds (TritonMLASparseMetadata), for the fp8 workspace.
        self._bounds: dict[str, int | None] = {}
        # Head counts this layer's calls carry: its own, and with ShardQ (vLLM 0.34's base sets
        # use_shardq) every tensor-parallel rank's.
        head_counts = [num_heads]
        if getattr(self, "use_shardq", False):
            head_counts.append(num_heads * get_current_vllm_config().parallel_config.tensor_parallel_size)
        if kv_cache_dtype == "fp8_ds_mla" and self.qk_rope_head_dim == 0:
            self._zero_q_pe = _reserve_zero_q_pe(max(head_counts), self.topk_indices_buffer)
        _serve_indexer(self.topk_indices_buffer, warmup_setting())
        if warmup_setting() and self.topk_indices_buffer is not None:
            for heads in head_counts:
                _warm_up(heads, kv_cache_dtype, self.kv_lora_rank + self.qk_rope_head_dim,
                         self.need_to_return_lse_for_decode, self.topk_indices_buffer)

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        """vLLM's ``forward_mqa``, which calls :meth:`_forward_mqa_kernel`, with the batch's
        bounds on the rows and entries it reads kept for that call."""
        self._bounds = {name: getattr(attn_metadata, name, None)
                        for name in ("rows_bound", "entries_bound")}
        try:
            return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)
        finally:
            self._bounds = {}

    def _forward_mqa_kernel(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        topk_indices: torch.Tensor,
        valid_counts: torch.Tensor,
        *,
        layer,
        block_size: int,
        is_decode: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend over the paged cache.

        Args:
            q: ``(ql_nope [T, H, 512], q_pe [T, H, 64 or 0])`` or ``[T, H, 576 | 512]``, any strides.
            kv_cache: ``[num_blocks, block_size, C]``: C = 576/512 values, or 656 bytes (fp8_ds_mla).
            topk_indices: int32 ``[T, K]`` flat row ids, ``-1`` for invalid entries.
            valid_counts: int32 ``[T]``, number of valid entries at the front of each row.

        Returns:
            ``(out [T, H, 512], lse [T, H] fp32 natural log)``; lse is None unless vLLM asked
            for it (``need_to_return_lse_for_decode``). Rows with no valid entry give zeros.
        """
        kv_rows, _ = flat_kv_row_view(kv_cache, block_size)
        if self.kv_cache_dtype == "fp8_ds_mla" and kv_rows.dtype != torch.uint8:
            kv_rows = kv_rows.view(torch.uint8)
        result = sparse_mla_attention(
            self._kernel_query(q),
            kv_rows,
            topk_indices,
            self.scale,
            topk_length=valid_counts,
            return_lse=self.need_to_return_lse_for_decode,
            fp8_workspace=self._fp8_workspace,
            **self._bounds,
        )
        if self.need_to_return_lse_for_decode:
            return result
        return result, None

    def _kernel_query(self, q):
        """The query as the kernel takes it: 576-wide (tuple or tensor) or 512-wide."""
        if isinstance(q, tuple):
            q_nope, q_pe = q
            if q_pe.shape[-1] != 0:
                return q_nope, q_pe
        else:
            if q.shape[-1] != KV_LORA_RANK:
                return q
            q_nope = q
        if self._zero_q_pe is None:
            return q_nope
        # NoPE rows in the 576-wide fp8_ds_mla layout: the rope slot meets a zero query.
        tokens, heads = q_nope.shape[:2]
        if heads > self._zero_q_pe.shape[1]:
            raise ValueError(f"{BACKEND_NAME}: a query of {heads} heads, more than the "
                             f"{self._zero_q_pe.shape[1]} this layer reserved zero rope queries for")
        return q_nope, self._zero_q_pe[:tokens, :heads]


def _serve_indexer(topk_indices_buffer: torch.Tensor | None, warm_up: bool) -> None:
    """On a GPU DeepGEMM has no kernels for, the model's DSA indexer scores with ours
    (:mod:`.indexer_fallback`; this backend is the only sparse MLA one there, so every such
    model builds its layers here), compiled now with ``warm_up``; below SM89 also the model's
    fp8 kernels Triton cannot compile there (:mod:`.sm8x_model_kernels`)."""
    if topk_indices_buffer is None or topk_indices_buffer.device.type != "cuda":
        return
    device = topk_indices_buffer.device
    capability = torch.cuda.get_device_capability(device)
    sm8x_model_kernels.install(capability, indexer_fallback.indexer_setting())
    if indexer_fallback.install(capability) and warm_up:
        hf_config = get_current_vllm_config().model_config.hf_config
        indexer_fallback.warm_up(device, getattr(hf_config, "index_n_heads", None),
                                 getattr(hf_config, "index_head_dim", None))


def _check_features(alibi_slopes, sliding_window, logits_soft_cap, attn_type) -> None:
    unsupported = {
        "alibi_slopes": alibi_slopes,
        "sliding_window": sliding_window,
        "logits_soft_cap": logits_soft_cap,
    }
    given = [name for name, value in unsupported.items() if value]
    if given:
        raise ValueError(f"{BACKEND_NAME} does not support {', '.join(given)}")
    if attn_type != AttentionType.DECODER:
        raise ValueError(f"{BACKEND_NAME} supports decoder self-attention only, got attn_type={attn_type!r}")


def _reserve_zero_q_pe(num_heads: int, topk_indices_buffer: torch.Tensor | None) -> torch.Tensor:
    """Zeros ``[max_tokens, H, 64]`` in the model dtype, allocated once before graph capture."""
    if topk_indices_buffer is None:
        raise ValueError(f"{BACKEND_NAME}: a topk_indices_buffer is required (sparse MLA model path)")
    config = get_current_vllm_config()
    dtype = config.model_config.dtype
    rows = max(config.scheduler_config.max_num_batched_tokens, topk_indices_buffer.shape[0])
    key = (topk_indices_buffer.device, dtype, num_heads)
    buffer = _ZERO_Q_PE.get(key)
    if buffer is None or buffer.shape[0] < rows:
        buffer = torch.zeros(rows, num_heads, ROPE_DIM, dtype=dtype, device=topk_indices_buffer.device)
        _ZERO_Q_PE[key] = buffer
    return buffer
