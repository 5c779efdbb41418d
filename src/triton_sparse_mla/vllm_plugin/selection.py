"""Where ``TRITON_MLA_SPARSE`` ranks among vLLM's sparse-MLA backends, and why.

Pure policy, no vLLM import. The rank is one of:

* ``"first"``: ahead of vLLM's native sparse backends.
* ``"last"``: after them, used only when none of them accepts the configuration.
* ``"absent"``: not offered to automatic selection (``--attention-backend`` still works).
"""

from __future__ import annotations

import os
from typing import NamedTuple

BACKEND_NAME = "TRITON_MLA_SPARSE"
BACKEND_CLASS_PATH = "triton_sparse_mla.vllm_plugin.backend.TritonMLASparseBackend"

SELECT_ENV = "TRITON_SPARSE_MLA_SELECT"
"""Environment variable: ``auto`` (default), ``off`` (opt out) or ``force`` (rank first)."""

SELECT_MODES = ("auto", "off", "force")

FP8_ALIASES = ("fp8", "fp8_e4m3")
"""``--kv-cache-dtype`` spellings of an fp8 cache that a layer of ours reads as fp8_ds_mla (as
vLLM's FLASHMLA_SPARSE does; GLM-5's config picks fp8_e4m3 on SM100)."""

MIN_CAPABILITY_MAJOR = 8
"""Triton's tensor-core and bf16 paths the kernels use need SM80 or newer."""

TESTED_VLLM = ("0.33", "0.34")
"""vLLM release series the plugin's tests have passed against (``tests/vllm``; the extra
``triton-sparse-mla[vllm]`` allows these). Another version still loads the plugin, with a
warning: the interfaces it uses are vLLM internals."""


class Ranking(NamedTuple):
    rank: str
    reason: str


def select_mode(environ=None) -> str:
    """Read :data:`SELECT_ENV` (case-insensitive, default ``auto``).

    Raises:
        ValueError: for a value outside :data:`SELECT_MODES`.
    """
    env = os.environ if environ is None else environ
    mode = env.get(SELECT_ENV, "auto").strip().lower() or "auto"
    if mode not in SELECT_MODES:
        raise ValueError(f"{SELECT_ENV}: expected one of {list(SELECT_MODES)}, got {mode!r}")
    return mode


def rank_backend(capability_major: int, mode: str) -> Ranking:
    """Decide the rank of ``TRITON_MLA_SPARSE`` on a GPU of compute capability major ``capability_major``."""
    if mode not in SELECT_MODES:
        raise ValueError(f"mode: expected one of {list(SELECT_MODES)}, got {mode!r}")
    sm = f"SM{capability_major}x"
    if capability_major < MIN_CAPABILITY_MAJOR:
        return Ranking("absent", f"{sm} is below SM80, which the Triton kernels need")
    if mode == "off":
        return Ranking("absent", f"{SELECT_ENV}=off")
    if mode == "force":
        return Ranking("first", f"{SELECT_ENV}=force")
    if capability_major == 8:
        return Ranking("first", f"{sm}: vLLM has no sparse MLA backend for this GPU")
    if capability_major == 12:
        return Ranking(
            "first",
            f"{sm}: preferred over FLASHINFER_MLA_SPARSE_SM120 (fp8_ds_mla and index_topk 2048 only; "
            "livelocks reported)",
        )
    return Ranking(
        "last",
        f"{sm}: native sparse backends stay first; set {SELECT_ENV}=force to prefer this one",
    )


def vllm_tested(version: str) -> bool:
    """Whether vLLM ``version`` (as ``vllm.__version__`` gives it, ``"0.34.0"``) is of a
    series in :data:`TESTED_VLLM`."""
    return ".".join(version.split(".")[:2]) in TESTED_VLLM


def vllm_version_note(version: str) -> str:
    """``"tested with this plugin"``, or why a vLLM ``version`` outside :data:`TESTED_VLLM` may
    not work."""
    if vllm_tested(version):
        return "tested with this plugin"
    return (f"not tested with this plugin (tested: {', '.join(TESTED_VLLM)}); the backend uses "
            "vLLM internals that may have changed")


def describe_selection(environ=None) -> str:
    """A short report for ``triton-sparse-mla vllm``: vLLM's presence, the selection mode, and
    where ``TRITON_MLA_SPARSE`` ranks on this machine's GPUs (or on every family without one).
    Imports vLLM only to read its version; starts no CUDA work beyond a capability query."""
    import importlib.metadata

    import torch

    lines = []
    try:
        version = importlib.metadata.version("vllm")
        lines.append(f"vLLM: {version} installed, {vllm_version_note(version)}")
    except importlib.metadata.PackageNotFoundError:
        lines.append('vLLM: not installed (pip install "triton-sparse-mla[vllm]")')
    mode = select_mode(environ)
    lines.append(f"{SELECT_ENV}={mode}")
    if torch.cuda.is_available():
        targets = []
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            targets.append((f"GPU {i} {torch.cuda.get_device_name(i)} (sm_{major}{minor})", (major, minor)))
    else:
        lines.append("no CUDA GPU here; what each GPU family would get:")
        targets = [(f"SM{m}x", (m, 9 if m == 8 else 0)) for m in (8, 9, 10, 12)]
    from .indexer_fallback import describe as describe_indexer

    for label, capability in targets:
        ranking = rank_backend(capability[0], mode)
        lines.append(f"  {label}: {BACKEND_NAME} {ranking.rank}: {ranking.reason}")
        lines.append(f"    DSA indexer scores: {describe_indexer(capability, environ)}")
    lines.append(f"KV cache: --kv-cache-dtype fp8_ds_mla (656 bytes a token and layer; "
                 f"{' and '.join(FP8_ALIASES)} are read as it), or the model's dtype (auto; 1152 bytes)")
    lines.append(f"force it with --attention-backend {BACKEND_NAME} (or CUSTOM) or {SELECT_ENV}=force")
    return "\n".join(lines)
