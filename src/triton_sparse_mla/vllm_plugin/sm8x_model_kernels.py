"""DeepSeek-V3.2 / GLM-5 model kernels that Triton cannot compile below SM89, done without
Triton's fp8 type.

vLLM's DSA attention layer (``vllm.models.deepseek_v32.attention``) runs two fused Triton
kernels per layer: ``fused_norm_rope`` (norms, rope, and the writes of the indexer K cache and
of an fp8_ds_mla MLA cache) and ``fused_q`` (query rope; the indexer query's fp8 quantization
and weights). Both take float8_e4m3fn tensors, and Triton refuses that type below SM89, even as
an unused argument: on SM80/86 every forward fails. :func:`install` replaces the two names in
that module, and vLLM's sequence packer's fp8 use in its indexer: the call
(``pack_seq_triton``, fp8 queries packed as bytes) and its start-up compile, which the indexer
registers for fp8 (``get_warmup_keys`` of vLLM's packer, so that start-up compiles the byte
kernel the call uses; the fp8 one fails to compile there):

* ``fused_norm_rope``: vLLM's own kernel still does the query's norm and the rope of the MLA
  rows' rope part (kept in bf16 by the cache), but is handed no fp8 cache; the rows to be
  quantized (the MLA latent after its RMS norm, the indexer key after its LayerNorm and rope)
  are computed again in fp32, with vLLM's formulas, and quantized from fp32 as the fused kernel
  does (not from the bf16 outputs, whose second rounding moved about one value in thirty by a
  whole fp8 step), with vLLM's scales (a power of two per indexer row; per 128-value tile for
  fp8_ds_mla), by one kernel per cache that encodes e4m3 with integer operations and writes
  the rows to their slots (:mod:`triton_sparse_mla.kernels.fp8_rows`): two launches beside
  vLLM's one.
* ``fused_q``: by two kernels of the same module: the interleaved rope of the MLA query's rope
  part (bf16 queries only: fp8 MLA queries are refused, and this backend never asks for them),
  and the indexer query's rope (NeoX or interleaved), its fp8 quantization with a power-of-two
  scale per (token, head) and the weights multiplied by that scale and the two softmax factors
  in vLLM's order.

Installed where a layer of ours is built, below SM89 (or on any GPU with
``TRITON_SPARSE_MLA_INDEXER=on``, to compare with vLLM's kernels), with the DSA indexer's
scores (:mod:`.indexer_fallback`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging

import torch

from triton_sparse_mla.kernels.fp8_rows import (indexer_query_rows, interleaved_rope,
                                                write_ds_mla_rows, write_indexer_key_rows)

logger = logging.getLogger("vllm.plugins.triton_sparse_mla")

ATTENTION_MODULE = "vllm.models.deepseek_v32.attention"
INDEXER_MODULE = "vllm.model_executor.layers.sparse_attn_indexer"
PACKER_MODULE = "vllm.v1.attention.ops.common"  # _PACK_SEQ_TRITON_KERNEL, vLLM's packer
_MARK = "_triton_sparse_mla_sm8x"
_FP8 = torch.float8_e4m3fn


def needs_model_kernels(capability: tuple[int, int]) -> bool:
    """Whether Triton lacks the fp8 type vLLM's DSA kernels use: below SM89."""
    return capability < (8, 9)


def install(capability: tuple[int, int], setting: str) -> bool:
    """Replace vLLM's fp8 DSA model kernels below SM89 (``setting`` ``auto``), or on any GPU
    (``on``); returns whether ours serve. Idempotent."""
    if setting == "off" or (setting == "auto" and not needs_model_kernels(capability)):
        return False
    try:
        attention = importlib.import_module(ATTENTION_MODULE)
        indexer = importlib.import_module(INDEXER_MODULE)
        packer = importlib.import_module(PACKER_MODULE)._PACK_SEQ_TRITON_KERNEL
        targets = [(attention, "fused_norm_rope", _fused_norm_rope),
                   (attention, "fused_q", _fused_q),
                   (indexer, "pack_seq_triton", _pack_seq),
                   (packer, "get_warmup_keys", _pack_warmup_keys)]
        originals = [getattr(module, name) for module, name, _ in targets]
    except (ImportError, AttributeError) as exc:
        logger.warning("triton-sparse-mla: cannot replace vLLM's fp8 DSA kernels (%s); the "
                       "model will fail below SM89", exc)
        return False
    fresh = [(t, original) for t, original in zip(targets, originals)
             if not getattr(original, _MARK, False)]
    for (module, name, make), original in fresh:
        replacement = make(original)
        setattr(replacement, _MARK, True)
        setattr(module, name, replacement)
    if fresh:
        logger.info("triton-sparse-mla: vLLM's fp8 DSA kernels (fused_norm_rope, fused_q, the "
                    "fp8 sequence packer) replaced on sm_%d%d", *capability)
    return True


# --- the replacements ----------------------------------------------------------------------


def _by_name(body):
    """Make ``body(original, arguments)`` a replacement of ``original`` that takes the same
    call (``arguments``: every parameter by name, defaults filled in)."""

    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def replacement(*args, **kwargs):
            call = signature.bind(*args, **kwargs)
            call.apply_defaults()
            return body(original, call.arguments)

        return replacement

    return make


@_by_name
def _fused_norm_rope(original, a):
    split_k = a["has_indexer"] and a["indexer_k_cache"] is not None
    split_mla = a["mla_kv_cache"] is not None and a["mla_kv_cache_dtype"] == "fp8_ds_mla"
    if not (split_k or split_mla):
        return original(**a)
    if split_k and a.get("indexer_cache_shuffled"):
        raise NotImplementedError("triton-sparse-mla: vLLM's shuffled indexer cache layout (ROCm's) "
                                  "is not written by the SM80/86 replacement")
    k_cache, k_slots = a["indexer_k_cache"], a["indexer_slot_mapping"]
    mla_cache, mla_slots = a["mla_kv_cache"], a["slot_mapping"]
    if k_slots is None:
        k_slots = mla_slots
    if split_k:
        a["indexer_k_cache"] = None
    if split_mla:
        a["mla_kv_cache"] = None
        if a["k_pe_out"] is None:  # (the roped rope part, which the cache keeps in bf16)
            a["k_pe_out"] = torch.empty_like(a["k_pe"])
    q_c_out = original(**a)
    if split_k:
        write_indexer_key_rows(
            _last_unit(a["index_k"]), a["index_k_layer_norm_w"], a["index_k_layer_norm_bias"],
            a["index_k_layer_norm_eps"], _last_unit(a["index_k_rope_cos_sin_cache"]), a["positions"],
            a["index_rope_interleave"], k_cache, k_slots)
    if split_mla:
        write_ds_mla_rows(_last_unit(a["kv_c"]), a["kv_rms_norm_w"], a["kv_rms_eps"],
                          _last_unit(a["k_pe_out"]), mla_cache, mla_slots)
    return q_c_out


def _last_unit(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy with unit stride in its last dimension (the row kernels' layout)."""
    return x if x.stride(-1) == 1 else x.contiguous()


@_by_name
def _fused_q(original, a):
    if a["quantize_mqa"]:
        raise NotImplementedError("triton-sparse-mla: fp8 MLA queries (quantize_mqa) below "
                                  "SM89 are not supported; TRITON_MLA_SPARSE takes bf16 queries")
    q_pe, positions = a["q_pe"], a["positions"]
    q_pe_out = interleaved_rope(_last_unit(q_pe), _last_unit(a["q_pe_cos_sin_cache"]), positions)
    if not a["has_indexer"] or a["index_q"] is None:
        # (shared layers: vLLM's placeholders, which its callers do not read)
        return (torch.empty(1, 1, 1, dtype=_FP8, device=q_pe.device),
                torch.empty(1, 1, dtype=torch.float32, device=q_pe.device), q_pe_out)
    index_q, weights = indexer_query_rows(
        _last_unit(a["index_q"]), _last_unit(a["index_q_cos_sin_cache"]), positions,
        a["index_rope_interleave"], a["index_weights"], a["index_weights_softmax_scale"],
        a["index_weights_head_scale"])
    return index_q.view(_FP8), weights, q_pe_out


@_by_name
def _pack_seq(original, a):
    """fp8 queries packed as bytes, padded with 0 (vLLM's pads are masked by the rows' lengths
    downstream, as its comment there says); other dtypes unchanged."""
    if a["x"].dtype != _FP8:
        return original(**a)
    a["x"], a["pad_value"] = a["x"].view(torch.uint8), 0
    return original(**a).view(_FP8)


@_by_name
def _pack_warmup_keys(original, a):
    """The packer's start-up compile keys for what :func:`_pack_seq` launches: bytes, pad 0,
    where an fp8 key is asked for."""
    if a["dtype"] == _FP8:
        a["dtype"], a["pad_value"] = torch.uint8, 0
    return original(**a)
