"""The DSA indexer's scores on GPUs DeepGEMM has no kernels for (SM80/86/89).

DeepSeek-V3.2 and GLM-5 run an indexer beside the attention: it scores the cache with vLLM's
DeepGEMM calls ``fp8_fp4_mqa_logits`` (prefill), ``fp8_fp4_paged_mqa_logits`` (decode) and
``get_paged_mqa_logits_metadata`` (decode scheduling). vLLM 0.33/0.34 ship DeepGEMM, but it has
no kernels below SM90 except SM120's, so on SM8x the engine fails when it captures its CUDA
graphs. :func:`install` points those three calls at :mod:`triton_sparse_mla.indexer`.

How: vLLM's wrappers (``vllm.utils.deep_gemm``) look up their implementation in a module
global at each call (``_fp8_fp4_mqa_logits_impl`` and its two siblings); :func:`install` runs
DeepGEMM's own ``_lazy_init`` first (which resolves every global once, and would resolve
nothing more after one is set: DeepGEMM's GEMMs, which vLLM uses on SM90/100, stay served),
then sets those three. It runs where a layer of ours is built, in a worker that already holds
its GPU (``_lazy_init`` asks the device for its capability).

``TRITON_SPARSE_MLA_INDEXER``: ``auto`` (default) installs on SM8x only, ``off`` never, ``on``
on every GPU (to compare with DeepGEMM where it has kernels). Only the fp8 indexer cache
(vLLM's default) is served; vLLM's fp4 one (``indexer_kv_dtype=mxfp4``) is refused by vLLM
itself below SM100.
"""

from __future__ import annotations

import logging
import os

import torch

from triton_sparse_mla import indexer
from triton_sparse_mla.indexer import mqa_logits, paged_mqa_logits

logger = logging.getLogger("vllm.plugins.triton_sparse_mla")

INDEXER_ENV = "TRITON_SPARSE_MLA_INDEXER"
IMPL_GLOBALS = ("_fp8_fp4_mqa_logits_impl", "_fp8_fp4_paged_mqa_logits_impl",
                "_get_paged_mqa_logits_metadata_impl")
# vLLM reserves each decode row of logits rounded up to this many columns (0.34's profile run)
LOGITS_ROW_ALIGN = 256


def indexer_setting(environ=None) -> str:
    """``TRITON_SPARSE_MLA_INDEXER``: ``auto`` (default: where DeepGEMM has no kernels), ``off``
    or ``on`` (every GPU)."""
    env = os.environ if environ is None else environ
    value = env.get(INDEXER_ENV, "auto").strip().lower()
    if value not in ("auto", "off", "on"):
        raise ValueError(f"{INDEXER_ENV}: expected 'auto', 'off' or 'on', got {value!r}")
    return value


def needs_fallback(capability: tuple[int, int]) -> bool:
    """Whether DeepGEMM lacks the indexer's kernels on this architecture: SM80, SM86, SM89."""
    return capability[0] == 8


def describe(capability: tuple[int, int], environ=None) -> str:
    """Who computes the DSA indexer's scores on ``capability``, for ``triton-sparse-mla vllm``."""
    setting = indexer_setting(environ)
    if setting == "on" or (setting == "auto" and needs_fallback(capability)):
        why = "" if setting == "on" else " (DeepGEMM has no kernels here)"
        if capability < (8, 9):
            why += ("; below SM89 vLLM's fp8 kernels of the DSA layers (fused_norm_rope, "
                    "fused_q), which Triton cannot compile there, are replaced too")
        return "triton_sparse_mla.indexer" + why
    if needs_fallback(capability):
        return f"DeepGEMM, which has no kernels here ({INDEXER_ENV}=off): DSA models fail"
    return "DeepGEMM"


def install(capability: tuple[int, int], environ=None) -> bool:
    """Serve vLLM's three DeepGEMM indexer calls with our kernels on ``capability`` where
    :func:`needs_fallback` (or everywhere with the setting ``on``); returns whether they are
    ours. Idempotent."""
    setting = indexer_setting(environ)
    if setting == "off" or (setting == "auto" and not needs_fallback(capability)):
        return False
    try:
        import vllm.utils.deep_gemm as dg
    except ImportError as exc:
        logger.warning("triton-sparse-mla: cannot serve the DSA indexer (%s)", exc)
        return False
    missing = [name for name in IMPL_GLOBALS if not hasattr(dg, name)]
    if missing:
        logger.warning("triton-sparse-mla: this vLLM has no %s in vllm.utils.deep_gemm; the DSA "
                       "indexer is left to DeepGEMM", ", ".join(missing))
        return False
    if getattr(dg, IMPL_GLOBALS[0]) is not _mqa_logits_impl:
        try:
            dg._lazy_init()
        except Exception as exc:  # noqa: BLE001 - DeepGEMM's other calls are not ours to serve
            logger.warning("triton-sparse-mla: DeepGEMM's initialisation failed (%s: %s); "
                           "serving the DSA indexer anyway", type(exc).__name__, exc)
        dg._fp8_fp4_mqa_logits_impl = _mqa_logits_impl
        dg._fp8_fp4_paged_mqa_logits_impl = _paged_mqa_logits_impl
        dg._get_paged_mqa_logits_metadata_impl = _paged_mqa_logits_metadata_impl
        why = "DeepGEMM has no kernels here" if needs_fallback(capability) else f"{INDEXER_ENV}=on"
        logger.info("triton-sparse-mla: DSA indexer on sm_%d%d served by triton_sparse_mla.indexer "
                    "(%s)", *capability, why)
    return True


_WARMED: set[tuple] = set()


def warm_up(device: torch.device, heads: int | None, head_dim: int | None) -> None:
    """Compile the indexer kernels for this model's indexer geometry (once per process), so
    that the first prefill does not (:func:`triton_sparse_mla.indexer.warmup`). Without the
    geometry in the model's config (``index_n_heads``, ``index_head_dim``) they compile on
    first use."""
    key = (device, heads, head_dim)
    if heads is None or head_dim is None or key in _WARMED:
        return
    indexer.warmup(device, heads, head_dim)
    _WARMED.add(key)


def _fp8_values(q, who: str) -> torch.Tensor:
    values, scale = q
    if scale is not None:
        raise NotImplementedError(f"triton-sparse-mla {who}: fp4 indexer queries (with scales) are "
                                  "not supported; use the default fp8 indexer cache")
    return values


def _mqa_logits_impl(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k, *,
                     logits_dtype=torch.float32):
    """DeepGEMM's ``fp8_fp4_mqa_logits``: compressed ``[M, max_seqlen_k]`` logits."""
    k, k_scale = kv
    out = mqa_logits(_fp8_values(q, "mqa_logits"), k, k_scale, weights, cu_seqlen_ks,
                     cu_seqlen_ke, max_seqlen_k)
    return out if logits_dtype in (None, torch.float32) else out.to(logits_dtype)


def _paged_mqa_logits_impl(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                           max_model_len, *, logits_dtype=torch.float32, indices=None):
    """DeepGEMM's ``fp8_fp4_paged_mqa_logits``: ``[B * next_n, max_model_len]`` logits, valid
    below each row's length. ``schedule_metadata`` is not needed."""
    if indices is not None:
        raise NotImplementedError("triton-sparse-mla paged_mqa_logits: the varlen form "
                                  "(indices) is SM100's")
    values = _fp8_values(q, "paged_mqa_logits")
    rows = values.shape[0] * values.shape[1]
    padded = -(-max_model_len // LOGITS_ROW_ALIGN) * LOGITS_ROW_ALIGN
    out = torch.empty(rows, padded, dtype=torch.float32, device=values.device)[:, :max_model_len]
    paged_mqa_logits(values, kv_cache, weights, context_lens, block_tables, max_model_len, out=out)
    return out if logits_dtype in (None, torch.float32) else out.to(logits_dtype)


_SCHEDULES: dict[tuple, torch.Tensor] = {}


def _paged_mqa_logits_metadata_impl(context_lens, block_size, num_sms, indices=None):
    """DeepGEMM's ``get_paged_mqa_logits_metadata``: an int32 ``[num_sms + 1, 2]`` schedule,
    which vLLM keeps in a buffer of that shape; our decode kernel schedules itself, so zeros."""
    key = (context_lens.device, num_sms)
    schedule = _SCHEDULES.get(key)
    if schedule is None:
        schedule = _SCHEDULES[key] = torch.zeros(num_sms + 1, 2, dtype=torch.int32,
                                                 device=context_lens.device)
    return schedule
