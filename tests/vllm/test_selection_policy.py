"""Ranking policy of TRITON_MLA_SPARSE (pure Python; runs without vLLM)."""

from __future__ import annotations

import pytest

from triton_sparse_mla.vllm_plugin.selection import SELECT_ENV, rank_backend, select_mode


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
