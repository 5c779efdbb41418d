"""vLLM's own plugin loader registers the backend, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    load_general_plugins()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    loaded = "TRITON_MLA_SPARSE" in AttentionBackendEnum.__members__
    from triton_sparse_mla.vllm_plugin import register
    register()  # idempotent
    from triton_sparse_mla.vllm_plugin.backend import TritonMLASparseBackend
    print(json.dumps({
        "loaded_by_vllm": loaded,
        "member": AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class() is TritonMLASparseBackend,
        "custom": AttentionBackendEnum.CUSTOM.get_class() is TritonMLASparseBackend,
        "name": TritonMLASparseBackend.get_name(),
        "cuda_initialized": torch.cuda.is_initialized(),
    }))
    """
)


def test_plugin_loader_registers_backend():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"loaded_by_vllm": True, "member": True, "custom": True, "name": "TRITON_MLA_SPARSE", "cuda_initialized": False}, (
        "is the vllm.general_plugins entry point installed? " + json.dumps(result)
    )


def test_untested_vllm_version_warns(registered, monkeypatch):
    """Registering under a vLLM series the plugin was not tested against logs one warning
    naming the version; the installed (tested) version logs none."""
    import logging

    import vllm

    from triton_sparse_mla.vllm_plugin import registration

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    registration.logger.addHandler(handler)
    monkeypatch.setattr(registration, "_logged", set())
    try:
        registration.register_with_vllm()
        assert not [r for r in records if r.levelno >= logging.WARNING], [r.getMessage() for r in records]
        monkeypatch.setattr(vllm, "__version__", "0.99.0")
        registration.register_with_vllm()
        registration.register_with_vllm()
    finally:
        registration.logger.removeHandler(handler)
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "vLLM 0.99.0: not tested" in warnings[0], warnings
