"""``TRITON_MLA_SPARSE``: vLLM's view of the backend (capabilities, cache layout, classes).

Imported by vLLM only, after :func:`triton_sparse_mla.vllm_plugin.register`; needs vLLM 0.33 or 0.34.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.attention.backends.mla.sparse_utils import align_blocks_to_rows

from .selection import BACKEND_NAME, FP8_ALIASES, MIN_CAPABILITY_MAJOR

KV_LORA_RANK = 512
ROPE_DIM = 64
BLOCK_MULTIPLE = 64
"""The DSA indexer's cache pages are 64 tokens; the attention kernel takes any block size."""


class TritonMLASparseBackend(AttentionBackend):
    """Sparse MLA (DeepSeek-V3.2, GLM-5) over the Triton kernels of ``triton_sparse_mla``.

    Cache rows: 576 values (``auto``/``bfloat16``/``float16``), 512 values for NoPE models,
    or 656-byte ``fp8_ds_mla`` rows. Blocks: any multiple of 64 tokens, any block stride
    that is a whole number of rows.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16]
    # The caches the impl reads, and the fp8 spellings vLLM resolves to fp8_ds_mla when it builds
    # a layer of ours (registration.install_cache_dtype_hook, as it does for FLASHMLA_SPARSE).
    cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "bfloat16", "float16", "fp8_ds_mla")
    supported_kv_cache_dtypes: ClassVar[list[str]] = [*cache_dtypes, *FP8_ALIASES]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        from .impl import TritonMLASparseImpl

        return TritonMLASparseImpl

    @staticmethod
    def get_builder_cls():
        from .builder import TritonMLASparseMetadataBuilder

        return TritonMLASparseMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(BLOCK_MULTIPLE)]

    @classmethod
    def customize_spec(cls, spec):
        # Flat row ids need the block stride to be a whole number of rows.
        return align_blocks_to_rows(spec)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [KV_LORA_RANK + ROPE_DIM, KV_LORA_RANK]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return capability.major >= MIN_CAPABILITY_MAJOR

    @classmethod
    def supports_combination(
        cls,
        head_size,
        dtype,
        kv_cache_dtype,
        block_size,
        use_mla,
        has_sink,
        use_sparse,
        use_mm_prefix,
        device_capability,
    ) -> str | None:
        cache = kv_cache_dtype or "auto"
        if cache.startswith(("fp8", "nvfp4")) and cache not in ("fp8_ds_mla", *_fp8_aliases()):
            return (f"{BACKEND_NAME} reads a quantized cache only as fp8_ds_mla: pass --kv-cache-dtype "
                    f"fp8_ds_mla, got {cache}")
        if _hisparse():
            return f"{BACKEND_NAME} does not serve HiSparse (attention_config.hisparse_config is set)"
        if cache in ("bfloat16", "float16") and cache != str(dtype).removeprefix("torch."):
            return f"{BACKEND_NAME} needs the kv-cache dtype to match the model dtype, got {cache} cache with {dtype}"
        if head_size == KV_LORA_RANK:
            rope = _model_rope_dim()
            if rope not in (None, 0):
                return f"{BACKEND_NAME} serves head_size 512 only for NoPE models, got qk_rope_head_dim={rope}"
        return None


def _fp8_aliases() -> tuple[str, ...]:
    """The fp8 spellings this process resolves to fp8_ds_mla: none where the hook is not
    installed (a vLLM without the function it wraps)."""
    from .registration import cache_dtype_hook_active

    return FP8_ALIASES if cache_dtype_hook_active() else ()


def _current_config():
    """vLLM's configuration being built or run, or None outside one."""
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


def _hisparse() -> bool:
    """Whether the configuration being built asks for HiSparse (vLLM 0.33's host-staged
    sparse cache, whose prefill staging plan the base metadata builder makes only beside a
    dense prefill backend, which this one has not)."""
    config = _current_config()
    attention = None if config is None else getattr(config, "attention_config", None)
    return getattr(attention, "hisparse_config", None) is not None


def _model_rope_dim() -> int | None:
    """``qk_rope_head_dim`` of the model being configured, or None when no config is set."""
    config = _current_config()
    if config is None or config.model_config is None:
        return None
    return getattr(config.model_config.hf_text_config, "qk_rope_head_dim", None)
