"""Register the backend with vLLM and rank it in vLLM's automatic backend selection.

vLLM (0.33, 0.34) has no public hook to add a backend to its per-GPU priority lists, so
:func:`install_selector_hook` wraps ``CudaPlatformBase.get_valid_backends``: it lets vLLM
rank its own backends, then adds ``TRITON_MLA_SPARSE`` first, last or not at all (see
:mod:`.selection`), and logs one line naming the backend that will be used and why.
"""

from __future__ import annotations

import logging
import sys

from .selection import (BACKEND_CLASS_PATH, BACKEND_NAME, FP8_ALIASES, rank_backend, select_mode,
                        vllm_tested, vllm_version_note)

# A child of the "vllm" logger, so the line shows with vLLM's own handler and format.
logger = logging.getLogger("vllm.plugins.triton_sparse_mla")

_HOOK_MARK = "_triton_sparse_mla_hook"
_logged: set = set()


def register_with_vllm() -> None:
    """Add ``TRITON_MLA_SPARSE`` and the ``CUSTOM`` alias; install the selector hook.

    Safe to call repeatedly. Imports vLLM; touches no GPU. Warns (once per process) when the
    installed vLLM is of a series the plugin was not tested against.
    """
    import vllm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if not vllm_tested(vllm.__version__):
        _log_once("version", f"vLLM {vllm.__version__}: {vllm_version_note(vllm.__version__)}",
                  level=logging.WARNING)

    # register_backend(name, ...) raises when the member exists: guard for idempotence.
    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, BACKEND_CLASS_PATH)
    # An enum member pickles as its value (here the class path), which a process that has not
    # loaded plugins yet cannot look up: this one pickles as a call that registers it first.
    from . import backend_member

    AttentionBackendEnum[BACKEND_NAME].__reduce_ex__ = lambda protocol: (backend_member, ())
    custom = AttentionBackendEnum.CUSTOM
    if not custom.is_overridden():
        register_backend(custom, BACKEND_CLASS_PATH)
    elif custom.get_path() != BACKEND_CLASS_PATH:
        logger.warning(
            "triton-sparse-mla: AttentionBackendEnum.CUSTOM already points to %s; leaving it. "
            "Use --attention-backend %s instead.",
            custom.get_path(),
            BACKEND_NAME,
        )
    install_selector_hook()
    install_cache_dtype_hook()


def _canonicalize_module():
    """vLLM's module holding ``_canonicalize_sparse_mla_kv_cache_dtype`` (0.33, 0.34), or None."""
    try:
        from vllm.model_executor.layers.attention import mla_attention
    except ImportError:
        return None
    return mla_attention if hasattr(mla_attention, "_canonicalize_sparse_mla_kv_cache_dtype") else None


def install_cache_dtype_hook() -> bool:
    """Have vLLM read ``--kv-cache-dtype fp8`` / ``fp8_e4m3`` as fp8_ds_mla for a layer of ours.

    vLLM resolves a sparse-MLA layer's cache dtype by its backend's name when it builds the
    layer (``_canonicalize_sparse_mla_kv_cache_dtype``, called at the time, from its module):
    FLASHMLA_SPARSE turns any fp8 spelling into fp8_ds_mla, FLASHINFER_MLA_SPARSE_SM120 also
    ``auto``. Without this, ``fp8`` (the usual spelling, and what GLM-5's config picks on SM100)
    would reject ours, and vLLM would fall back to a native backend where it has one. Wrapped
    once; returns whether it is active."""
    module = _canonicalize_module()
    if module is None:
        _log_once("cache-dtype", "this vLLM has no _canonicalize_sparse_mla_kv_cache_dtype: "
                  f"pass --kv-cache-dtype fp8_ds_mla for the fp8 cache ({', '.join(FP8_ALIASES)} "
                  "are refused)", level=logging.WARNING)
        return False
    original = module._canonicalize_sparse_mla_kv_cache_dtype
    if getattr(original, _HOOK_MARK, False):
        return True

    def canonicalize(attn_backend, kv_cache_dtype):
        if attn_backend.get_name() == BACKEND_NAME and kv_cache_dtype in FP8_ALIASES:
            return "fp8_ds_mla"
        return original(attn_backend, kv_cache_dtype)

    setattr(canonicalize, _HOOK_MARK, True)
    canonicalize.__wrapped__ = original
    module._canonicalize_sparse_mla_kv_cache_dtype = canonicalize
    return True


def cache_dtype_hook_active() -> bool:
    """Whether :func:`install_cache_dtype_hook`'s wrapper is in place."""
    module = _canonicalize_module()
    return module is not None and getattr(module._canonicalize_sparse_mla_kv_cache_dtype, _HOOK_MARK, False)


def _cuda_platform_base():
    """vLLM's CUDA platform class, or None off CUDA (no import of the CUDA module there)."""
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda() or "vllm.platforms.cuda" in sys.modules):
        return None
    from vllm.platforms.cuda import CudaPlatformBase

    return CudaPlatformBase


def install_selector_hook() -> bool:
    """Wrap ``CudaPlatformBase.get_valid_backends`` once. Returns whether the hook is active."""
    platform_cls = _cuda_platform_base()
    if platform_cls is None:
        return False
    current = platform_cls.__dict__.get("get_valid_backends")
    if current is None or not isinstance(current, classmethod):
        logger.warning(
            "triton-sparse-mla: this vLLM has no CudaPlatformBase.get_valid_backends classmethod; "
            "automatic selection is off, use --attention-backend %s",
            BACKEND_NAME,
        )
        return False
    if getattr(current.__func__, _HOOK_MARK, False):
        return True
    original = current.__func__

    def get_valid_backends(cls, device_capability, attn_selector_config, num_heads=None):
        valid, invalid = original(cls, device_capability, attn_selector_config, num_heads)
        if attn_selector_config.use_mla and attn_selector_config.use_sparse:
            mode = select_mode()  # (a wrong TRITON_SPARSE_MLA_SELECT is the user's: raised)
            try:
                _offer_backend(valid, invalid, device_capability, attn_selector_config, mode)
            except Exception as exc:  # (vLLM's own choice stands; never break its selection)
                _log_once("offer", f"{BACKEND_NAME} not offered: {type(exc).__name__}: {exc}",
                          level=logging.WARNING)
        return valid, invalid

    setattr(get_valid_backends, _HOOK_MARK, True)
    get_valid_backends.__wrapped__ = original
    platform_cls.get_valid_backends = classmethod(get_valid_backends)
    return True


def _offer_backend(valid, invalid, device_capability, attn_selector_config, mode) -> None:
    """Add ``TRITON_MLA_SPARSE`` to vLLM's candidates in place (list of candidates, dict of reasons)."""
    from vllm.platforms.cuda import _BackendCandidate
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    member = AttentionBackendEnum[BACKEND_NAME]
    listed = {c.backend for c in valid} | set(invalid)
    if member in listed:
        return
    ranking = rank_backend(device_capability.major, mode)
    sm = f"sm_{device_capability.major}{device_capability.minor}"
    if ranking.rank == "absent":
        _log_once(sm, f"{BACKEND_NAME} not offered on {sm}: {ranking.reason}")
        return
    priorities = [c.priority for c in valid] + [p for p, _ in invalid.values()]
    if ranking.rank == "first":
        priority = min(priorities, default=0) - 1
    else:
        priority = max(priorities, default=-1) + 1
    try:
        backend_cls = member.get_class()
        reasons = backend_cls.validate_configuration(
            device_capability=device_capability, **attn_selector_config._asdict()
        )
    except (ImportError, OSError) as exc:
        backend_cls, reasons = None, [f"{type(exc).__name__}: {exc}"]
    if reasons:
        invalid[member] = (priority, reasons)
    else:
        valid.append(_BackendCandidate(backend_cls, member, priority))
        valid.sort(key=lambda c: c.priority)
    if valid:
        chosen = min(valid, key=lambda c: c.priority).backend.name
        why = f"{BACKEND_NAME} rejected: {'; '.join(reasons)}" if reasons else ranking.reason
        _log_once(sm, f"sparse MLA on {sm}: {chosen} chosen ({why})")
        if chosen == BACKEND_NAME and device_capability.major == 12 and \
                (attn_selector_config.kv_cache_dtype or "auto") == "auto":
            _log_once(sm, "the cache is bf16 (1152 bytes a token and layer) with --kv-cache-dtype "
                      "auto; FLASHINFER_MLA_SPARSE_SM120, which this replaces, makes auto "
                      "fp8_ds_mla (656): pass --kv-cache-dtype fp8_ds_mla for 1.76x the tokens",
                      level=logging.WARNING)
    else:
        _log_once(sm, f"sparse MLA on {sm}: no valid backend; {BACKEND_NAME}: {'; '.join(reasons)}")


def _log_once(key: str, message: str, level: int = logging.INFO) -> None:
    if (key, message) in _logged:
        return
    _logged.add((key, message))
    logger.log(level, "triton-sparse-mla: %s", message)
