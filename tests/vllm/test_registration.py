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


def test_registration_failure_leaves_vllm_running(monkeypatch):
    """vLLM calls the plugin's register() unguarded: where its internals are not what the
    plugin uses, one warning and no exception, so vLLM runs on without the backend."""
    import logging

    import triton_sparse_mla.vllm_plugin as plugin
    from triton_sparse_mla.vllm_plugin import registration

    def broken():
        raise AttributeError("type object 'AttentionBackendEnum' has no attribute 'is_overridden'")

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(registration, "register_with_vllm", broken)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("vllm.plugins.triton_sparse_mla")
    logger.addHandler(handler)
    try:
        plugin.register()
    finally:
        logger.removeHandler(handler)
    assert plugin._registered is False
    messages = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(messages) == 1 and "is_overridden" in messages[0], messages


def test_selection_failure_keeps_vllms_choice(model_dirs, registered, cuda_platform, monkeypatch):
    """An error while offering the backend leaves vLLM's candidates as vLLM made them, with one
    warning."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from conftest import make_vllm_config
    from triton_sparse_mla.vllm_plugin import registration

    selector = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="fp8_ds_mla",
                                       block_size=64, use_mla=True, use_sparse=True)
    cap = DeviceCapability(8, 6)

    def broken(*args):
        raise ImportError("cannot import name '_BackendCandidate'")

    monkeypatch.setattr(registration, "_logged", set())
    with set_current_vllm_config(make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype="fp8_ds_mla")):
        want = cuda_platform.get_valid_backends.__func__.__wrapped__(cuda_platform, cap, selector, 16)
        assert "TRITON_MLA_SPARSE" in [c.backend.name for c in
                                       cuda_platform.get_valid_backends(cap, selector, num_heads=16)[0]]
        monkeypatch.setattr(registration, "_offer_backend", broken)
        got = cuda_platform.get_valid_backends(cap, selector, num_heads=16)
    assert [c.backend for c in got[0]] == [c.backend for c in want[0]]
    assert set(got[1]) == set(want[1])
    assert any("_BackendCandidate" in m for _, m in registration._logged)


def test_backend_name_reaches_a_fresh_process(registered):
    """A configuration naming TRITON_MLA_SPARSE, pickled, loads in a process that has not
    loaded vLLM's plugins (a spawned or Ray worker reads it first) as that backend."""
    import pickle

    from vllm.config import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    blob = pickle.dumps(AttentionConfig(backend=AttentionBackendEnum["TRITON_MLA_SPARSE"]))
    code = ("import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()); "
            "from triton_sparse_mla.vllm_plugin.backend import TritonMLASparseBackend as B; "
            "print(c.backend.name, c.backend.get_class() is B)")
    proc = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().split() == ["TRITON_MLA_SPARSE", "True"], proc.stdout
