"""A CUDA graph captured around a decode call replays with new index values and lengths and
matches an eager call exactly (launch choices depend on shapes only)."""

import pytest
import torch

from problems import make_problem
from triton_sparse_mla import sparse_mla_attention


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 32, 128])
@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
def test_graph_replay_matches_eager(t, fmt):
    dev = torch.device("cuda")
    a = make_problem(t=t, h=16, k=2048, n=8192, fmt=fmt, device=dev, topk_length="partial", seed=1)
    # b counts its whole rows, so every valid id in b.indices names an unpoisoned row of b.kv.
    b = make_problem(t=t, h=16, k=2048, n=8192, fmt=fmt, device=dev, seed=2)
    q, kv = a.q, b.kv
    idx, lens = b.indices.clone(), a.topk_length.clone()
    out = torch.empty(t, 16, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(t, 16, dtype=torch.float32, device=dev)

    def step():
        o, l = sparse_mla_attention(q, kv, idx, 0.07, topk_length=lens, return_lse=True)
        out.copy_(o)
        lse.copy_(l)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up compiles outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        idx.copy_(b.indices[:, torch.randperm(2048, generator=g)])
        lens.copy_(torch.randint(0, 2049, (t,), generator=g, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = sparse_mla_attention(q, kv, idx, 0.07, topk_length=lens, return_lse=True)
        assert torch.equal(out, want)
        assert torch.equal(lse, want_lse)
