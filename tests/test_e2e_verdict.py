"""The verdict rule of the vLLM end-to-end comparison (benchmarks/vllm_e2e.py), on made-up runs.

The script itself needs vLLM and a GPU; its comparison of two engines' greedy outputs does not.
"""

import importlib.util
from pathlib import Path

import pytest

from triton_sparse_mla.indexer import fp8_products

from problems import indexer_tolerance

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_e2e.py"
_spec = importlib.util.spec_from_file_location("vllm_e2e", _PATH)
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)

TOL = 0.05


def run(tokens, logprobs, gaps, prompt_logprobs=(None, -4.0, -4.1)):
    seq = dict(prompt_len=3, tokens=list(tokens), logprobs=list(logprobs), top2_gap=list(gaps),
               prompt_logprobs=list(prompt_logprobs))
    return dict(seqs=[seq])


def test_identical_runs_match():
    a = run([5, 6, 7], [-4.0, -4.2, -3.9], [0.3, 0.2, 0.4])
    cmp = e2e.compare(a, a, TOL)
    assert cmp["all_tokens_match"] and cmp["splits_only_at_near_ties"]
    assert cmp["max_logprob_diff"] == 0.0 and cmp["max_prompt_logprob_diff"] == 0.0


def test_split_at_a_near_tie_is_accepted_and_compared_up_to_the_split():
    ours = run([5, 6, 9, 1], [-4.00, -4.20, -3.00, -1.0], [0.3, 0.2, 0.0, 0.1])
    ref = run([5, 6, 7, 2], [-4.01, -4.21, -4.50, -9.0], [0.3, 0.2, 0.03, 0.1])
    cmp = e2e.compare(ours, ref, TOL)
    per = cmp["per_prompt"][0]
    assert per["first_divergence"] == 2 and per["divergence_is_near_tie"]
    assert per["top2_gap_at_divergence"] == (0.03, 0.0)
    assert not cmp["all_tokens_match"] and cmp["splits_only_at_near_ties"]
    # up to and including the split: |-3.00 - -4.50| counts, the step after it (8.0) does not
    assert cmp["max_logprob_diff"] == pytest.approx(1.5)


def test_split_with_a_clear_margin_is_rejected():
    ours = run([5, 8, 9], [-4.0, -2.0, -3.0], [0.3, 0.5, 0.4])
    ref = run([5, 6, 7], [-4.0, -2.1, -3.1], [0.3, 0.4, 0.4])
    cmp = e2e.compare(ours, ref, TOL)
    assert cmp["per_prompt"][0]["first_divergence"] == 1
    assert not cmp["per_prompt"][0]["divergence_is_near_tie"]
    assert not cmp["splits_only_at_near_ties"]


def test_prompt_logprob_differences_are_reported():
    a = run([5], [-4.0], [0.3], prompt_logprobs=(None, -4.0, -4.1))
    b = run([5], [-4.0], [0.3], prompt_logprobs=(None, -4.0, -4.3))
    assert e2e.compare(a, b, TOL)["max_prompt_logprob_diff"] == pytest.approx(0.2)


def test_each_process_checks_are_merged(tmp_path):
    """With --tp the in-engine checks run in forked workers: each process's records (written to
    a file per pid) are merged, and files of another run's sink are not."""
    sink = tmp_path / "TRITON_MLA_SPARSE.json.checks"
    (tmp_path / (sink.name + ".101")).write_text('{"checks": [{"heads": 8}], "workspace_calls": [2048]}')
    (tmp_path / (sink.name + ".102")).write_text('{"checks": [{"heads": 16}, {"heads": 8}], "workspace_calls": []}')
    (tmp_path / "FLASHMLA_SPARSE.json.checks.103").write_text('{"checks": [{"heads": 99}], "workspace_calls": [1]}')
    checks, workspace_calls, indexer_checks = e2e._merge_checks(str(sink))
    assert sorted(c["heads"] for c in checks) == [8, 8, 16] and workspace_calls == [2048]
    assert indexer_checks == []
    assert e2e._merge_checks(str(tmp_path / "none.checks")) == ([], [], [])


def test_in_engine_indexer_checks(device, monkeypatch):
    """``--indexer ours``: the wrapped indexer calls, as the plugin makes them, record their
    error against the float64 reference, a small one for correct kernels and a large one for a
    wrong result."""
    import torch

    from triton_sparse_mla.indexer import pack_indexer_k_cache
    from triton_sparse_mla.vllm_plugin import indexer_fallback as fallback

    monkeypatch.setattr(fallback, "mqa_logits", fallback.mqa_logits)
    monkeypatch.setattr(fallback, "paged_mqa_logits", fallback.paged_mqa_logits)
    paged = fallback.paged_mqa_logits
    checks = []
    e2e._check_indexer_against_reference(checks, lambda: None)
    g = torch.Generator().manual_seed(0)
    fp8 = lambda *s: (torch.randn(*s, generator=g) * 2).to(torch.float8_e4m3fn).to(device)  # noqa: E731
    heads, d = 8, 128
    ends = torch.arange(1, 31, dtype=torch.int32, device=device)
    fallback._mqa_logits_impl((fp8(30, heads, d), None), (fp8(30, d), torch.ones(30, device=device)),
                              torch.randn(30, heads, generator=g).to(device),
                              torch.zeros_like(ends), ends, 30)
    cache = pack_indexer_k_cache(fp8(2, 16, d).cpu(), torch.ones(2, 16)).to(device)
    lens = torch.tensor([[20], [5]], dtype=torch.int32, device=device)
    tables = torch.tensor([[1, 0], [0, 1]], dtype=torch.int32, device=device)
    fallback._paged_mqa_logits_impl((fp8(2, 1, heads, d), None), cache,
                                    torch.randn(2, heads, generator=g).to(device), lens, tables,
                                    None, 32)
    assert [c["kind"] for c in checks] == ["prefill", "decode"]
    # The fp8 tensor cores accumulate with fewer bits than fp32 (the prefill call gave 1.3e-4 on
    # an H100): the indexer's tolerance there; exact fp16 products (the interpreter, SM80/86) keep
    # 1e-6.
    bound = indexer_tolerance(device) if fp8_products(device) else 1e-6
    assert all(c["rel_err"] < bound for c in checks), checks
    # a kernel 1% off
    monkeypatch.setattr(fallback, "paged_mqa_logits", lambda *a, **k: paged(*a, **k).mul_(1.01))
    bad = []
    e2e._check_indexer_against_reference(bad, lambda: None)
    fallback._paged_mqa_logits_impl((fp8(2, 1, heads, d), None), cache,
                                    torch.randn(2, heads, generator=g).to(device), lens, tables,
                                    None, 32)
    assert len(bad) == 1 and 5e-3 < bad[0]["rel_err"] < 2e-2
