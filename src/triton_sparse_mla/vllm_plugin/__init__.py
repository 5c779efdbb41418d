"""vLLM plugin: the ``TRITON_MLA_SPARSE`` sparse-MLA attention backend.

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in every
process (API server, engine core, each worker) before the model is built. Importing this
package needs neither vLLM nor a GPU; all vLLM imports happen inside :func:`register`.
"""

from __future__ import annotations

from .selection import BACKEND_NAME, SELECT_ENV

__all__ = ["register", "backend_member", "BACKEND_NAME", "SELECT_ENV"]

_registered = False


def register() -> None:
    """Register ``TRITON_MLA_SPARSE`` (and the ``CUSTOM`` alias) with vLLM.

    Idempotent: a second call in the same process does nothing. Creates no CUDA context. A
    vLLM whose internals it cannot use gets one warning, and runs on without the backend.
    """
    global _registered
    if _registered:
        return
    try:
        from .registration import register_with_vllm

        register_with_vllm()
    except Exception as exc:  # (vLLM calls this unguarded: a failure here would stop it for every model)
        import logging

        logging.getLogger("vllm.plugins.triton_sparse_mla").warning(
            "triton-sparse-mla: not registered with this vLLM, which runs without %s (%s: %s)",
            BACKEND_NAME, type(exc).__name__, exc)
        return
    _registered = True


def backend_member():
    """vLLM's ``AttentionBackendEnum`` member ``TRITON_MLA_SPARSE``, registering it first: how
    the member unpickles (``registration.register_with_vllm`` sets it), so that a configuration
    naming it reaches spawned and Ray workers, which read it before vLLM loads plugins."""
    register()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[BACKEND_NAME]
