"""Ranking policy of TRITON_MLA_SPARSE (pure Python; runs without vLLM)."""

from __future__ import annotations

import pytest

from triton_sparse_mla.vllm_plugin.selection import (SELECT_ENV, describe_selection, rank_backend, select_mode,
                                                     vllm_tested, vllm_version_note)


@pytest.mark.parametrize(
    "major,mode,rank",
    [
        pytest.param(8, "auto", "first", id="sm8x-auto"),
        pytest.param(12, "auto", "first", id="sm12x-auto"),
        pytest.param(9, "auto", "last", id="sm90-auto"),
        pytest.param(10, "auto", "last", id="sm100-auto"),
        pytest.param(9, "force", "first", id="sm90-force"),
        pytest.param(12, "off", "absent", id="sm12x-off"),
        pytest.param(7, "force", "absent", id="sm75-force"),
    ],
)
def test_rank(major, mode, rank):
    assert rank_backend(major, mode).rank == rank


def test_select_mode_reads_env():
    assert select_mode({}) == "auto"
    assert select_mode({SELECT_ENV: " Force "}) == "force"
    with pytest.raises(ValueError, match=SELECT_ENV):
        select_mode({SELECT_ENV: "sometimes"})


@pytest.mark.parametrize(
    "version,tested",
    [("0.33.0", True), ("0.34.0", True), ("0.34.1+cu130", True), ("0.35.0", False),
     ("0.32.0", False), ("0.3.4", False), ("1.33.0", False)],
)
def test_vllm_tested(version, tested):
    assert vllm_tested(version) is tested
    assert (vllm_version_note(version) == "tested with this plugin") is tested


@pytest.mark.parametrize("version,phrase", [("0.34.0", "tested with this plugin"), ("0.35.0", "not tested")])
def test_describe_selection_names_the_vllm_version(monkeypatch, version, phrase):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version if name == "vllm" else real(name))
    first = describe_selection({}).splitlines()[0]
    assert first.startswith(f"vLLM: {version} installed, {phrase}"), first
