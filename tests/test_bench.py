"""The benchmark's own output check: ``bench.reference_error`` compares a workload's first tokens
with the float64 reference while reading only the cache rows they select."""

import torch

from problems import make_problem
from triton_sparse_mla import bench, sparse_mla_reference


def test_reference_error_tells_right_from_wrong():
    for fmt in ("bf16", "fp8_ds_mla"):
        p = make_problem(t=6, h=8, k=64, n=300, fmt=fmt, topk_length="partial")
        ref, _ = sparse_mla_reference(p.q, p.kv, p.indices, p.sm_scale, topk_length=p.topk_length)
        right = ref.to(torch.bfloat16)
        # only the first tokens are checked, so what follows them may be anything
        right[4:] = float("nan")
        assert bench.reference_error(p.q, p.kv, p.indices, p.topk_length, p.sm_scale, right) < 1e-2
        wrong = right.clone()
        wrong[:4] = right[:4].roll(1, dims=1)  # heads swapped
        assert bench.reference_error(p.q, p.kv, p.indices, p.topk_length, p.sm_scale, wrong) > 0.1
