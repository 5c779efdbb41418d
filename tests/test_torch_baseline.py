"""The plain-PyTorch baseline that ``triton-sparse-mla bench`` times computes the specification:
it matches the float64 reference to fp32 rounding on NaN-poisoned, strided inputs."""

import pytest
import torch

from problems import assert_close, make_problem
from triton_sparse_mla.reference import sparse_mla_reference
from triton_sparse_mla.torch_baseline import sparse_mla_torch


@pytest.mark.parametrize("p", [
    pytest.param(dict(t=5, h=8, k=100, n=300), id="T5-H8-K100-bf16"),
    pytest.param(dict(t=5, h=16, k=100, n=300, fmt="fp8_ds_mla", topk_length="partial", sink=True),
                 id="T5-H16-K100-fp8_ds_mla-partial-sink"),
    pytest.param(dict(t=3, h=4, k=64, n=200, topk_length="zero"), id="T3-H4-K64-bf16-zero"),
    pytest.param(dict(t=3, h=4, k=64, n=200, fmt="fp8_ds_mla", invalid_frac=1.0), id="T3-H4-K64-fp8-all-invalid"),
    pytest.param(dict(t=4, h=3, k=50, n=100, d_qk=512, q_tuple=True), id="T4-H3-K50-nope-tuple"),
])
def test_torch_baseline_matches_reference(p):
    prob = make_problem(**p)
    # chunks of 2 tokens: the last chunk is partial for odd T
    out, lse = sparse_mla_torch(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                topk_length=prob.topk_length, attn_sink=prob.attn_sink, chunk_tokens=2)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    assert out.dtype == torch.float32 and out.shape == ref_out.shape
    assert_close(out, lse, ref_out, ref_lse, rtol_norm=1e-5, lse_atol=1e-5)
