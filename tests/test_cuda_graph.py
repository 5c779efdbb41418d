"""A CUDA graph captured around a decode call replays with new index values and lengths and
matches an eager call exactly (launch choices depend on shapes only)."""

import pytest
import torch

from problems import aligned_rows, assert_close, make_problem
from triton_sparse_mla import replay, sparse_mla_attention, sparse_mla_reference
from triton_sparse_mla.kernels import attention


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 32, 128])
@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("h", [16, 64])  # 64 heads: the Gluon tile on SM90 from T=9 on
def test_graph_replay_matches_eager(t, fmt, h):
    dev = torch.device("cuda")
    a = make_problem(t=t, h=h, k=2048, n=8192, fmt=fmt, device=dev, topk_length="partial", seed=1)
    # b counts its whole rows, so every valid id in b.indices names an unpoisoned row of b.kv.
    b = make_problem(t=t, h=h, k=2048, n=8192, fmt=fmt, device=dev, seed=2)
    q, kv = a.q, aligned_rows(b.kv)  # (a cache the Gluon kernel takes)
    idx, lens = b.indices.clone(), a.topk_length.clone()
    out = torch.empty(t, h, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(t, h, dtype=torch.float32, device=dev)

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


@pytest.mark.gpu
def test_first_call_inside_capture(monkeypatch):
    """A first call made inside a graph capture, before the exchange_p tile's SM-id query could
    run, is captured with the same tile without the exchange and replays correctly."""
    dev = torch.device("cuda")
    monkeypatch.setattr(attention, "_SM_ID_COUNT", {})
    p = make_problem(t=32, h=64, k=2048, n=8192, fmt="bf16", device=dev, seed=3)
    out = torch.empty(32, 64, 512, dtype=torch.bfloat16, device=dev)
    # Compile the fallback outside the capture: an eager call that sees a capture in progress.
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        warm = sparse_mla_attention(p.q, p.kv, p.indices, 0.07)
    assert attention._SM_ID_COUNT == {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparse_mla_attention(p.q, p.kv, p.indices, 0.07, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    monkeypatch.setattr(attention, "_SM_ID_COUNT", {})
    replay.clear()  # (a first call: not the replay of the call on stream s)
    with torch.cuda.graph(graph):
        sparse_mla_attention(p.q, p.kv, p.indices, 0.07, out=out)
    assert attention._SM_ID_COUNT == {}
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = sparse_mla_reference(p.q, p.kv, p.indices, 0.07)
    assert_close(out, None, ref_out, ref_lse, rtol_norm=2e-2)
    assert torch.equal(out, warm)
