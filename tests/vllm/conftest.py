"""Fixtures for the vLLM plugin tests: real vLLM objects (0.33 or 0.34), no GPU required.

Without a CUDA driver, vLLM's CUDA platform module needs a stub ``libcuda.so.1`` on
``LD_LIBRARY_PATH`` (``.ci/vllm-tests`` provides one); tests that need it skip otherwise.
"""

from __future__ import annotations

import pytest

from plugin_models import write_model_dir


@pytest.fixture(autouse=True)
def _no_kernel_warmup(monkeypatch):
    """Layers built here skip the kernel warm-up (test_forward.py tests it on its own), so that
    the GPU run of this suite does not compile every kind of call its layers would take."""
    monkeypatch.setenv("TRITON_SPARSE_MLA_WARMUP", "off")


@pytest.fixture(scope="session")
def cuda_platform():
    """vLLM's ``CudaPlatform`` class (importable with a real or stub libcuda)."""
    pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package
    try:
        from vllm.platforms.cuda import CudaPlatform
    except (ImportError, OSError) as exc:
        pytest.skip(f"vllm.platforms.cuda not importable (no libcuda.so.1?): {exc}")
    return CudaPlatform


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """``{"deepseek_v32": Path, "glm_moe_dsa": Path}`` of tiny local model configs."""
    pytest.importorskip("vllm.plugins")  # not just "vllm": tests/vllm itself is a namespace package
    root = tmp_path_factory.mktemp("models")
    return {name: write_model_dir(root, name) for name in ("deepseek_v32", "glm_moe_dsa")}


@pytest.fixture(scope="session")
def registered(cuda_platform):
    """Run the plugin's register() in this process (what vLLM's plugin loader calls).

    After the CUDA platform module is imported, as on a GPU machine, so the selector hook is installed.
    """
    from triton_sparse_mla.vllm_plugin import register

    register()


def make_vllm_config(model_dir, *, kv_cache_dtype="auto", block_size=64, dtype="bfloat16",
                     max_num_batched_tokens=256, max_num_seqs=8, num_speculative_tokens=None):
    """A real ``VllmConfig`` for a local model directory, built without a GPU."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype,
                               max_model_len=1024)
    kwargs = {}
    if num_speculative_tokens is not None:
        from vllm.config import SpeculativeConfig

        kwargs["speculative_config"] = SpeculativeConfig(
            method="mtp", num_speculative_tokens=num_speculative_tokens, target_model_config=model_config
        )
    return VllmConfig(
        model_config=model_config,
        device_config=DeviceConfig(device="cuda"),
        cache_config=CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            max_model_len=1024, is_encoder_decoder=False,
        ),
        **kwargs,
    )


@pytest.fixture(scope="session")
def cpu_vllm(cuda_platform):
    """Let vLLM's metadata code run without a CUDA driver (no-op on a GPU machine).

    Pinned host memory needs a driver, so vLLM's sparse-MLA builder must not pin; and vLLM
    keeps its Triton kernels only when it sees an active driver or an empty
    ``CUDA_VISIBLE_DEVICES`` (``.ci/vllm-tests`` sets the latter before Python starts).
    """
    import torch

    if torch.cuda.is_available():
        return
    import vllm.model_executor.layers.attention.sparse_mla_attention as sparse_mla

    sparse_mla.PIN_MEMORY = False
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        pytest.skip("vLLM disabled Triton (run with CUDA_VISIBLE_DEVICES= on a machine without GPU)")
