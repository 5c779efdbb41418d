"""vLLM plugin: the ``TRITON_MLA_SPARSE`` sparse-MLA attention backend.

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in every
process (API server, engine core, each worker) before the model is built. Importing this
package needs neither vLLM nor a GPU; all vLLM imports happen inside :func:`register`.
"""

from __future__ import annotations

from .selection import BACKEND_NAME, SELECT_ENV

__all__ = ["register", "BACKEND_NAME", "SELECT_ENV"]

_registered = False


def register() -> None:
    """Register ``TRITON_MLA_SPARSE`` (and the ``CUSTOM`` alias) with vLLM.

    Idempotent: a second call in the same process does nothing. Creates no CUDA context.
    """
    global _registered
    if _registered:
        return
    from .registration import register_with_vllm

    register_with_vllm()
    _registered = True
