"""fp8_ds_mla rows through the bf16 workspace of distinct rows (triton_sparse_mla.workspace)."""

import os

import pytest
import torch

from problems import assert_close, make_problem, tol
from triton_sparse_mla import sparse_mla_attention, sparse_mla_reference, workspace
from triton_sparse_mla.formats import dequantize_fp8_ds_mla

CASES = [
    dict(t=3, h=8, k=100, n=300, topk_length="partial"),
    dict(t=3, h=16, k=100, n=300, scale_style="pow2", sink=True),
    dict(t=5, h=64, k=64, n=40, rising=True, q_tuple=True),
    dict(t=4, h=16, k=64, n=300, topk_length="zero"),
    dict(t=2, h=16, k=64, n=300, invalid_frac=1.0),
]


def _bf16_rows(kv):
    """fp8_ds_mla rows dequantized to bf16 as the device rounds: to nearest even on a GPU; the
    interpreter's fp32 -> bf16 conversion drops the low 16 bits (Triton 3.6 and 3.8)."""
    rows = dequantize_fp8_ds_mla(kv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        rows = (rows.view(torch.int32) & -65536).view(torch.float32)
    return rows.to(torch.bfloat16)


def _call(prob, **kw):
    return sparse_mla_attention(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                topk_length=prob.topk_length, attn_sink=prob.attn_sink,
                                return_lse=True, **kw)


@pytest.mark.parametrize("p", CASES, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_matches_reference_and_the_bf16_kernel_on_dequantized_rows(p, device):
    prob = make_problem(fmt="fp8_ds_mla", device=device, **p)
    out, lse = _call(prob, fp8_workspace=True)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    assert_close(out, lse, ref_out, ref_lse, **tol("fp8_ds_mla"))
    # The same values gathered in the same order: bit for bit the bf16 kernel's result.
    rows = _bf16_rows(prob.kv)
    want, want_lse = sparse_mla_attention(prob.q, rows, prob.indices, prob.sm_scale,
                                          topk_length=prob.topk_length,
                                          attn_sink=prob.attn_sink, return_lse=True)
    assert torch.equal(out, want)
    assert torch.equal(lse, want_lse)


def test_workspace_holds_each_distinct_row_once(device):
    prob = make_problem(t=6, h=8, k=64, n=50, fmt="fp8_ds_mla", device=device,
                        topk_length="partial")
    built = workspace.build(prob.kv, prob.indices, prob.topk_length, 0, force=True)
    assert built is not None
    ws, new_idx = built
    idx, lens = prob.indices.long().cpu(), prob.topk_length.long().cpu()
    counted = (idx >= 0) & (idx < 50) & (torch.arange(64)[None, :] < lens[:, None])
    distinct = len(torch.unique(idx[counted]))
    assert ws.shape == (50, 576) and ws.dtype == torch.bfloat16  # min(N, T x K) slots
    new_idx = new_idx.long().cpu()
    assert torch.equal(new_idx < 0, ~counted)
    # Slots 0 .. distinct - 1, one per distinct row.
    assert torch.equal(new_idx[counted].unique(), torch.arange(distinct))
    want = _bf16_rows(prob.kv).cpu()[idx[counted]]
    assert torch.equal(ws.cpu()[new_idx[counted]], want)


@pytest.mark.parametrize("p", CASES[:2], ids=["partial", "sink"])
def test_rows_kept_at_their_ids(p, device, monkeypatch):
    """Where the slots are the whole cache and converting it costs less than remapping, each row
    is converted to the slot of its own id and the indices are kept; the result is the same, bit
    for bit, as through the remapped workspace."""
    prob = make_problem(fmt="fp8_ds_mla", device=device, **p)
    monkeypatch.setattr(workspace, "ENTRY_BYTES", 0)  # remap
    remapped, remapped_lse = _call(prob, fp8_workspace=True)
    monkeypatch.setattr(workspace, "ENTRY_BYTES", 1 << 20)  # keep the ids
    ws, new_idx = workspace.build(prob.kv, prob.indices, prob.topk_length, 0, force=True)
    assert new_idx is prob.indices
    # (every row, those no entry names too: the problem poisons them, NaN either way)
    torch.testing.assert_close(ws.cpu(), _bf16_rows(prob.kv).cpu(), rtol=0, atol=0, equal_nan=True)
    out, lse = _call(prob, fp8_workspace=True)
    assert torch.equal(out, remapped) and torch.equal(lse, remapped_lse)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    assert_close(out, lse, ref_out, ref_lse, **tol("fp8_ds_mla"))


def test_ids_kept_only_where_converting_the_cache_pays(device):
    # 8 x 64 entries: remapping them (ENTRY_BYTES each) is worth converting 9 rows, not 10.
    for n, kept in ((9, True), (10, False)):
        prob = make_problem(t=8, h=8, k=64, n=n, fmt="fp8_ds_mla", device=device, invalid_frac=0)
        assert workspace._keeps_ids(n, 8 * 64) == kept
        ws, new_idx = workspace.build(prob.kv, prob.indices, None, 0, force=True)
        assert ws.shape[0] == n and (new_idx is prob.indices) == kept


def test_little_reuse_keeps_the_in_kernel_conversion(device):
    # 4 x 64 entries over 10000 rows: about one entry per distinct row.
    prob = make_problem(t=4, h=8, k=64, n=10000, fmt="fp8_ds_mla", device=device, invalid_frac=0)
    assert workspace.build(prob.kv, prob.indices, None, 0, force=False) is None
    # 8 x 64 entries over 40 rows: at least 12 per row.
    prob = make_problem(t=8, h=8, k=64, n=40, fmt="fp8_ds_mla", device=device, invalid_frac=0)
    ws, _ = workspace.build(prob.kv, prob.indices, None, 0, force=False)
    assert ws.shape[0] == 40  # min(N, T x K) slots: known without counting


def test_reuse_threshold_follows_the_in_kernel_path(device, monkeypatch):
    # 8 x 64 entries over 40 rows: 12.8 per row. Enough against the Triton tiles' conversion;
    # not against sm90's few-head Gluon tiles, which the workspace never beats up to 16 heads
    # and beats only from 256 at 32; enough again with 128 heads, where it beats the Gluon tile
    # at any measured reuse.
    prob = make_problem(t=8, h=8, k=64, n=40, fmt="fp8_ds_mla", device=device, invalid_frac=0)

    def taken(h, gluon):
        return workspace.build(prob.kv, prob.indices, None, 0, force=False,
                               reuse=workspace.min_reuse(h, gluon),
                               counted_reuse=workspace.min_reuse(h, gluon, counted=True)) is not None

    for h, gluon, want in ((8, False, True), (8, True, False), (16, True, False), (32, True, False),
                           (128, True, True)):
        assert taken(h, gluon) == want, (h, gluon)
    assert workspace.min_reuse(8, True) is None and workspace.min_reuse(8, True, counted=True) is None
    assert workspace.min_reuse(16, True) is None and workspace.min_reuse(32, True) == 256
    assert workspace.min_reuse(64, False) == workspace.MIN_REUSE
    assert workspace.min_reuse(64, False, counted=True) == workspace.MIN_REUSE
    assert workspace.min_reuse(16, True, counted=True) is None
    assert workspace.min_reuse(64, True) == 64 and workspace.min_reuse(64, True, counted=True) == 256
    # Where the rows are counted (the shapes' 40 slots over SHAPE_MAX_BYTES), the few-head tiles
    # never take it, whatever the reuse.
    with monkeypatch.context() as m:
        m.setattr(workspace, "SHAPE_MAX_BYTES", 10 * workspace.ROW_BYTES)
        m.setattr(workspace, "MIN_REUSE_GLUON", ((16, 8, None), (None, 8, 8)))
        assert not taken(16, True) and taken(32, True)


def test_slots_over_the_shape_limit_are_counted(device, monkeypatch):
    prob = make_problem(t=8, h=8, k=64, n=40, fmt="fp8_ds_mla", device=device, invalid_frac=0)
    monkeypatch.setattr(workspace, "SHAPE_MAX_BYTES", 10 * workspace.ROW_BYTES)
    ws, _ = workspace.build(prob.kv, prob.indices, None, 0, force=True)
    assert ws.shape[0] == len(torch.unique(prob.indices.cpu()))


def test_rows_counted_where_the_shapes_do_not_bound_them(device, monkeypatch):
    # 6 x 64 entries over 5000 rows, all inside a window of 30: the bound (min(N, T x K) = 384
    # slots) fails the reuse test, the counted 30 rows pass it.
    prob = make_problem(t=6, h=16, k=64, n=5000, fmt="fp8_ds_mla", device=device,
                        topk_length="partial")
    idx = torch.where(prob.indices >= 0, prob.indices % 30, prob.indices)
    idx = torch.where(idx < 5000, idx, -1)
    kv = _fresh_rows(prob.kv, 30)
    ws, _ = workspace.build(kv, idx, prob.topk_length, 0, force=False)
    assert ws.shape[0] <= 30
    monkeypatch.setattr(workspace, "MAX_BYTES", 10 * workspace.ROW_BYTES)
    assert workspace.build(kv, idx, prob.topk_length, 0, force=False) is None
    out, lse = sparse_mla_attention(prob.q, kv, idx, prob.sm_scale, topk_length=prob.topk_length,
                                    return_lse=True, fp8_workspace=True)
    ref_out, ref_lse = sparse_mla_reference(prob.q, kv, idx, prob.sm_scale,
                                            topk_length=prob.topk_length)
    assert_close(out, lse, ref_out, ref_lse, **tol("fp8_ds_mla"))


def test_rows_bound_sizes_the_workspace_without_counting(device, monkeypatch):
    """A caller's bound on the distinct rows gives the slots where the shapes do not: nothing is
    read back from the device (no count), the result is the counted workspace's, bit for bit;
    an understated bound drops the entries of the rows past it, never writing past the
    workspace."""
    prob = make_problem(t=6, h=16, k=64, n=5000, fmt="fp8_ds_mla", device=device,
                        topk_length="partial")
    idx = torch.where(prob.indices >= 0, prob.indices % 30, prob.indices)
    idx = torch.where(idx < 5000, idx, -1)
    kv = _fresh_rows(prob.kv, 30)
    counted, counted_lse = sparse_mla_attention(prob.q, kv, idx, prob.sm_scale,
                                                topk_length=prob.topk_length, return_lse=True,
                                                fp8_workspace=True)
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "__int__", lambda self: pytest.fail("count read back"))
        ws, new_idx = workspace.build(kv, idx, prob.topk_length, 0, force=False, rows_bound=30)
        # A bound that does not pay decides alone: the in-kernel path, nothing counted.
        assert workspace.build(kv, idx, prob.topk_length, 0, force=False, reuse=13,
                               rows_bound=30) is None
    assert ws.shape[0] == 30
    out, lse = sparse_mla_attention(prob.q, kv, idx, prob.sm_scale, topk_length=prob.topk_length,
                                    return_lse=True, fp8_workspace=True, rows_bound=30)
    assert torch.equal(out, counted) and torch.equal(lse, counted_lse)
    # Understated: the slots hold the 10 lowest row ids named, the other entries are dropped.
    ws, new_idx = workspace.build(kv, idx, prob.topk_length, 0, force=True, rows_bound=10)
    assert ws.shape[0] == 10
    lens = prob.topk_length.long().cpu()
    valid = (idx.cpu() >= 0) & (torch.arange(64)[None, :] < lens[:, None])
    kept = torch.unique(idx.cpu()[valid])[:10]
    want = torch.where(valid & torch.isin(idx.cpu(), kept), idx.cpu(), -1)
    assert torch.equal(new_idx.cpu() >= 0, want >= 0)
    assert torch.equal(ws.cpu()[new_idx.cpu()[want >= 0].long()], _bf16_rows(kv).cpu()[want[want >= 0].long()])


def test_entries_bound_reads_the_reuse_over_valid_entries(device, monkeypatch):
    """T x K entries over-read the reuse of a batch of short contexts (each token its own
    request, its valid entries at the front): with the caller's bound on the valid entries the
    rule sees each row read once and keeps the in-kernel path, while without it the same shapes
    and row bound take the workspace. Either way the output is the in-kernel one."""
    t, k, context = 8, 64, 8
    prob = make_problem(t=t, h=16, k=k, n=t * context, fmt="fp8_ds_mla", device=device)
    own = torch.arange(t, device=device)[:, None] * context
    idx = torch.full((t, k), -1, dtype=torch.int32, device=device)
    idx[:, :context] = (own + torch.arange(context, device=device)[None, :]).to(torch.int32)
    lengths = torch.full((t,), context, dtype=torch.int32, device=device)
    kv = prob.kv
    bounds = dict(rows_bound=t * context)  # every row named once: reuse 1, read as k / context
    assert workspace.build(kv, idx, lengths, 0, force=False, reuse=k // context, **bounds) is not None
    assert workspace.build(kv, idx, lengths, 0, force=False, reuse=k // context,
                           entries_bound=t * context, **bounds) is None
    monkeypatch.setattr(workspace, "MIN_TOKENS", 1)
    monkeypatch.setattr(workspace, "MIN_REUSE_GLUON", ((None, k // context, k // context),))
    monkeypatch.setattr(workspace, "MIN_REUSE", k // context)
    built = []
    build = workspace.build
    monkeypatch.setattr(workspace, "build", lambda *a, **kw: built.append(build(*a, **kw)) or built[-1])
    out = sparse_mla_attention(prob.q, kv, idx, prob.sm_scale, topk_length=lengths,
                               entries_bound=t * context, **bounds)
    assert built == [None]
    in_kernel = sparse_mla_attention(prob.q, kv, idx, prob.sm_scale, topk_length=lengths,
                                     fp8_workspace=False)
    assert torch.equal(out, in_kernel)


def test_first_tokens_counted_first(device, monkeypatch):
    """Where the rows are counted, the first tokens' rows are counted alone first, and a call
    whose first tokens already name more rows than pay keeps the in-kernel conversion without
    marking the rest; the decision is the one the whole count gives."""
    monkeypatch.setattr(workspace, "SHAPE_MAX_BYTES", 10 * workspace.ROW_BYTES)  # rows to count
    marked = []
    mark = workspace._mark
    monkeypatch.setattr(workspace, "_mark", lambda *a: marked.append(a[3:5]) or mark(*a))
    # 16 x 64 entries at reuse 8: the workspace pays for at most 128 distinct rows, and the
    # first 9 tokens (4 x 128 + 1 entries or more) are counted alone.
    prob = make_problem(t=16, h=8, k=64, n=5000, fmt="fp8_ds_mla", device=device, invalid_frac=0)
    spread = prob.indices
    narrow = prob.indices % 40
    late = torch.cat([narrow[:9], spread[9:]])  # the first tokens in 40 rows, the rest anywhere
    for idx, taken, ranges in ((spread, False, [(0, 9)]), (late, False, [(0, 9), (9, 16)]),
                               (narrow, True, [(0, 9), (9, 16)])):
        marked.clear()
        distinct = len(torch.unique(idx.cpu()))
        assert workspace._pays(16 * 64, distinct, workspace.MAX_BYTES, 8) == taken
        built = workspace.build(prob.kv, idx, None, 0, force=False, reuse=8)
        assert (built is not None) == taken and marked == ranges
        if taken:
            assert built[0].shape[0] == distinct
    # Forced, every token is marked at once.
    marked.clear()
    assert workspace.build(prob.kv, spread, None, 0, force=True) is not None
    assert marked == [(0, 16)]


def _fresh_rows(kv, n_used):
    """``kv`` with its first ``n_used`` rows replaced by unpoisoned fp8_ds_mla rows."""
    from triton_sparse_mla.formats import quantize_fp8_ds_mla
    g = torch.Generator().manual_seed(5)
    kv = kv.clone()
    kv[:n_used] = quantize_fp8_ds_mla(torch.randn(n_used, 576, generator=g)).to(kv.device)
    return kv


def test_automatic_choice(device, monkeypatch):
    bf16, fp16 = torch.bfloat16, torch.float16
    assert not workspace.wanted(workspace.MIN_TOKENS - 1, bf16, None)
    assert workspace.wanted(workspace.MIN_TOKENS, bf16, None)
    assert not workspace.wanted(workspace.MIN_TOKENS, fp16, None)
    assert not workspace.wanted(workspace.MIN_TOKENS, bf16, False)
    assert workspace.wanted(1, bf16, True)
    with pytest.raises(ValueError, match="fp8_workspace: needs a bf16 query"):
        workspace.wanted(1, fp16, True)
    # Through the API: with the threshold lowered, a call takes the workspace by itself.
    prob = make_problem(t=8, h=8, k=64, n=40, fmt="fp8_ds_mla", device=device)
    monkeypatch.setattr(workspace, "MIN_TOKENS", 8)
    # (12.8 entries per row: enough whichever in-kernel path it replaces)
    monkeypatch.setattr(workspace, "MIN_REUSE_GLUON",
                        ((None, workspace.MIN_REUSE, workspace.MIN_REUSE),))
    taken = []
    build = workspace.build
    monkeypatch.setattr(workspace, "build", lambda *a, **k: taken.append(build(*a, **k)) or taken[-1])
    out, lse = _call(prob)
    assert len(taken) == 1 and taken[0] is not None
    assert torch.equal(out, _call(prob, fp8_workspace=True)[0])


def test_argument_errors(device):
    prob = make_problem(t=2, h=8, k=64, n=100, fmt="fp8_ds_mla", device=device)
    with pytest.raises(TypeError, match="fp8_workspace: expected None, True or False, got 1"):
        _call(prob, fp8_workspace=1)
    q16 = prob.q.to(torch.float16)
    with pytest.raises(ValueError, match="fp8_workspace: needs a bf16 query"):
        sparse_mla_attention(q16, prob.kv, prob.indices, 0.1, fp8_workspace=True)
    bf16_rows = make_problem(t=2, h=8, k=64, n=100, fmt="bf16", device=device)
    with pytest.raises(ValueError, match="fp8_workspace: True needs fp8_ds_mla rows .* got kv of "
                                         "dtype torch.bfloat16"):
        _call(bf16_rows, fp8_workspace=True)
    for name in ("rows_bound", "entries_bound"):
        for bad, err, msg in ((1.5, TypeError, f"{name}: expected None or an int, got 1.5"),
                              (True, TypeError, f"{name}: expected None or an int, got True"),
                              (-1, ValueError, f"{name}: expected an int >= 0, got -1")):
            with pytest.raises(err, match=msg):
                _call(prob, **{name: bad})
    # False (and None) on bf16 rows is the plain kernel, as without the argument.
    assert torch.equal(_call(bf16_rows, fp8_workspace=False)[0], _call(bf16_rows)[0])


@pytest.mark.gpu
def test_graph_capture(monkeypatch):
    """A workspace whose slots follow from the shapes is captured, and replays with new index
    values like an eager call; where the rows would have to be counted on the host, the captured
    call converts inside the kernel, and forcing the workspace there is an error."""
    dev = torch.device("cuda")
    monkeypatch.setattr(workspace, "MIN_TOKENS", 1)
    # (reuse 128 below: enough whichever in-kernel path the workspace replaces; on sm90 the
    # Gluon tiles' threshold at 16 heads is 256)
    monkeypatch.setattr(workspace, "MIN_REUSE_GLUON",
                        ((None, workspace.MIN_REUSE, workspace.MIN_REUSE),))
    a = make_problem(t=32, h=16, k=2048, n=512, fmt="fp8_ds_mla", device=dev, seed=4)
    b = make_problem(t=32, h=16, k=2048, n=512, fmt="fp8_ds_mla", device=dev, seed=5,
                     invalid_frac=0)
    kv = _fresh_rows(a.kv, 512)  # every row valid, so b's indices may name any of them
    idx = a.indices.clone()
    out = torch.empty(32, 16, 512, dtype=torch.bfloat16, device=dev)

    def capture():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            sparse_mla_attention(a.q, kv, idx, 0.07, out=out)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            sparse_mla_attention(a.q, kv, idx, 0.07, out=out)
        return graph

    graph = capture()  # 512 slots, reuse 128: captured with the workspace
    idx.copy_(b.indices)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, sparse_mla_attention(a.q, kv, idx, 0.07, fp8_workspace=True))

    monkeypatch.setattr(workspace, "SHAPE_MAX_BYTES", 100 * workspace.ROW_BYTES)  # rows to count
    graph = capture()
    idx.copy_(a.indices)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, sparse_mla_attention(a.q, kv, idx, 0.07, fp8_workspace=False))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="cannot be done while a CUDA graph is captured"):
        sparse_mla_attention(a.q, kv, idx, 0.07, fp8_workspace=True)
