"""validate_configuration and vLLM's selector (get_valid_backends) with the plugin registered."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package

import torch  # noqa: E402

from conftest import make_vllm_config  # noqa: E402

CAPS_OURS = [(8, 0), (8, 6), (8, 9), (12, 0), (12, 1)]


def _selector(head_size=576, kv_cache_dtype="auto", block_size=64):
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return AttentionSelectorConfig(head_size=head_size, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,
                                   block_size=block_size, use_mla=True, use_sparse=True)


@pytest.mark.parametrize("model", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_ds_mla", "fp8", "fp8_e4m3"])
@pytest.mark.parametrize("cap", CAPS_OURS + [(9, 0), (10, 0)], ids=lambda c: f"sm{c[0]}{c[1]}")
def test_validate_configuration_accepts(model, kv_dtype, cap, model_dirs, registered, cuda_platform):
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability

    from triton_sparse_mla.vllm_plugin.backend import TritonMLASparseBackend

    config = make_vllm_config(model_dirs[model], kv_cache_dtype=kv_dtype)
    with set_current_vllm_config(config):
        reasons = TritonMLASparseBackend.validate_configuration(
            device_capability=DeviceCapability(*cap), **_selector(kv_cache_dtype=kv_dtype)._asdict()
        )
    assert reasons == []


@pytest.mark.parametrize(
    "kwargs,cap,reason",
    [
        pytest.param(dict(block_size=32), (12, 0), "block_size", id="block32"),
        pytest.param(dict(kv_cache_dtype="fp8_e5m2"), (12, 0), "--kv-cache-dtype fp8_ds_mla", id="fp8-e5m2"),
        pytest.param(dict(head_size=512), (8, 6), "NoPE", id="512-with-rope"),
        pytest.param({}, (7, 5), "compute capability", id="sm75"),
    ],
)
def test_validate_configuration_rejects(kwargs, cap, reason, model_dirs, registered, cuda_platform):
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability

    from triton_sparse_mla.vllm_plugin.backend import TritonMLASparseBackend

    config = make_vllm_config(model_dirs["deepseek_v32"])
    with set_current_vllm_config(config):
        reasons = TritonMLASparseBackend.validate_configuration(
            device_capability=DeviceCapability(*cap), **_selector(**kwargs)._asdict()
        )
    assert any(reason in r for r in reasons), reasons


def _chosen(cuda_platform, config, cap, kv_dtype):
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability

    with set_current_vllm_config(config):
        try:
            valid, _ = cuda_platform.get_valid_backends(DeviceCapability(*cap), _selector(kv_cache_dtype=kv_dtype),
                                                        num_heads=16)
        except RuntimeError as exc:
            if torch.cuda.is_available():
                raise
            # Some backend modules allocate CUDA memory at import (CUTLASS_MLA on SM100).
            pytest.skip(f"needs a CUDA driver to import every candidate: {str(exc)[:80]}")
    return [c.backend.name for c in sorted(valid, key=lambda c: c.priority)]


@pytest.mark.parametrize("model", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_ds_mla", "fp8"])
@pytest.mark.parametrize("cap", CAPS_OURS, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_selector_picks_ours(model, kv_dtype, cap, model_dirs, registered, cuda_platform, monkeypatch):
    monkeypatch.delenv("TRITON_SPARSE_MLA_SELECT", raising=False)
    config = make_vllm_config(model_dirs[model], kv_cache_dtype=kv_dtype)
    assert _chosen(cuda_platform, config, cap, kv_dtype)[0] == "TRITON_MLA_SPARSE"


@pytest.mark.parametrize("cap", [(9, 0), (10, 0)], ids=lambda c: f"sm{c[0]}{c[1]}")
def test_selector_keeps_native_first(cap, model_dirs, registered, cuda_platform, monkeypatch):
    monkeypatch.delenv("TRITON_SPARSE_MLA_SELECT", raising=False)
    config = make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype="fp8_ds_mla")
    names = _chosen(cuda_platform, config, cap, "fp8_ds_mla")
    assert names[0] != "TRITON_MLA_SPARSE" and names[-1] == "TRITON_MLA_SPARSE", names


@pytest.mark.parametrize("mode,first", [("force", True), ("off", False)])
def test_selector_env(mode, first, model_dirs, registered, cuda_platform, monkeypatch):
    monkeypatch.setenv("TRITON_SPARSE_MLA_SELECT", mode)
    config = make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype="fp8_ds_mla")
    names = _chosen(cuda_platform, config, (9, 0), "fp8_ds_mla")
    assert (names[0] == "TRITON_MLA_SPARSE") is first
    assert ("TRITON_MLA_SPARSE" in names) is (mode != "off")


def test_fp8_spellings_build_fp8_ds_mla_layers(registered):
    """vLLM resolves a layer's cache dtype by its backend when it builds the layer: for ours,
    fp8 and fp8_e4m3 become fp8_ds_mla (as for FLASHMLA_SPARSE), the others stay; other
    backends keep vLLM's own rule."""
    from vllm.model_executor.layers.attention import mla_attention
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    ours = AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class()
    resolve = mla_attention._canonicalize_sparse_mla_kv_cache_dtype
    assert [resolve(ours, d) for d in ("fp8", "fp8_e4m3", "fp8_ds_mla", "auto", "bfloat16")] == [
        "fp8_ds_mla", "fp8_ds_mla", "fp8_ds_mla", "auto", "bfloat16"]

    class Other:
        @staticmethod
        def get_name():
            return "TRITON_MLA"

    assert resolve(Other, "fp8") == resolve.__wrapped__(Other, "fp8") == "fp8"


def test_impl_refuses_an_unresolved_fp8_spelling():
    """An fp8 spelling that reached the impl unresolved (no hook) is refused by name."""
    from triton_sparse_mla.vllm_plugin.impl import TritonMLASparseImpl

    with pytest.raises(ValueError, match="fp8_ds_mla"):
        TritonMLASparseImpl(16, 576, 0.1, 1, None, None, "fp8", None, "decoder", None)


def test_hisparse_refused(model_dirs, registered, cuda_platform, monkeypatch):
    """HiSparse needs the prefill staging plan that vLLM's base builder makes only beside a
    dense prefill backend: refused at selection, by name."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability

    from triton_sparse_mla.vllm_plugin.backend import TritonMLASparseBackend

    config = make_vllm_config(model_dirs["deepseek_v32"])
    monkeypatch.setattr(config.attention_config, "hisparse_config", object())
    with set_current_vllm_config(config):
        reasons = TritonMLASparseBackend.validate_configuration(
            device_capability=DeviceCapability(12, 0), **_selector()._asdict())
    assert any("HiSparse" in r for r in reasons), reasons


def test_sm12x_auto_cache_warns(model_dirs, registered, cuda_platform, monkeypatch):
    """Chosen on SM12x with --kv-cache-dtype auto (a bf16 cache, where the backend it replaces
    takes fp8_ds_mla): one warning that says how to get the smaller cache."""
    import logging

    from triton_sparse_mla.vllm_plugin import registration

    monkeypatch.delenv("TRITON_SPARSE_MLA_SELECT", raising=False)
    monkeypatch.setattr(registration, "_logged", set())
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    registration.logger.addHandler(handler)
    try:
        for kv_dtype in ("fp8_ds_mla", "auto"):
            config = make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype=kv_dtype)
            assert _chosen(cuda_platform, config, (12, 0), kv_dtype)[0] == "TRITON_MLA_SPARSE"
            warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
            assert len(warnings) == (kv_dtype == "auto"), warnings
    finally:
        registration.logger.removeHandler(handler)
    assert "--kv-cache-dtype fp8_ds_mla" in warnings[0]


def test_selector_refuses_a_wrong_select_value(model_dirs, registered, cuda_platform, monkeypatch):
    """A wrong TRITON_SPARSE_MLA_SELECT stops selection with an error naming it (not a
    warning that the backend was left out)."""
    monkeypatch.setenv("TRITON_SPARSE_MLA_SELECT", "sometimes")
    config = make_vllm_config(model_dirs["deepseek_v32"], kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match="TRITON_SPARSE_MLA_SELECT"):
        _chosen(cuda_platform, config, (8, 6), "fp8_ds_mla")
