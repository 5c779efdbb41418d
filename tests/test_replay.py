"""replay.py: which calls share a key, what a recorded call hands its launchers when replayed
(with a stand-in for Triton, on the CPU), and on a GPU that replayed calls give the
reference's answer for each kind of call."""

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from problems import SM90_ONLY, CompiledStandIn, aligned_rows, assert_close, make_problem, tol
from triton_sparse_mla import replay, sparse_mla_attention, sparse_mla_reference
from triton_sparse_mla.kernels import launch


def _step(a_ptr, b_ptr, s_ptr, n, scale, BLOCK: tl.constexpr):
    pass


@pytest.fixture
def stand_in(monkeypatch):
    """``(kernel, compiled)``: ``_step`` as a JIT function whose Triton path returns one
    stand-in compiled kernel (on device 0, stream 7, no hooks); replay's keys not interpreted."""
    kernel, compiled = JITFunction(_step), CompiledStandIn()
    monkeypatch.setattr(JITFunction, "__getitem__", lambda self, grid: lambda *a, **k: compiled)
    monkeypatch.setattr(launch, "_RUNTIME", [lambda: 0, lambda device: 7, lambda: True])
    monkeypatch.setattr(launch, "FAST", True)
    monkeypatch.setattr(replay, "INTERPRETED", False)
    return kernel, compiled


def _sources(seed):
    """A call's sources as api.py lists them: q (as both halves), kv, indices, no lengths or
    sink, out, lse."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 576, generator=g)
    kv = torch.randn(10, 576, generator=g)
    indices = torch.zeros(2, 8, dtype=torch.int32)
    return [q, q, kv, indices, None, None, torch.empty(2, 4, 512), torch.empty(2, 4)]


def test_a_replay_hands_each_launcher_this_calls_addresses(stand_in):
    """Recorded: two launches over q's halves, the cache, a shared buffer and two scratch tensors.
    Replayed over new tensors: the same launchers, grids and stream, each tensor's place holding
    the new tensor's address plus the recorded offset, scratch allocated anew, the shared buffer
    itself, every other value as recorded; the recipe keeps no tensor of the recorded call."""
    kernel, compiled = stand_in
    shared_buf = torch.zeros(16)
    first = _sources(0)
    q, _, kv, indices, _, _, out, lse = first
    q_nope, q_pe = q[..., :512], q[..., 512:]
    with launch.recording() as rec:
        part, part_lse = launch.scratch(((2, 3, 4), (5,)), torch.float32, torch.device("cpu"))
        launch.shared(shared_buf)
        launch.launch(kernel, (4, 2), q_nope, q_pe, part, n=10, scale=0.5, BLOCK=16)
        launch.launch(kernel, (2,), part_lse, kv, shared_buf, n=3, scale=1.5, BLOCK=32)
    assert rec.complete and len(rec.launches) == 2
    recipe = replay.Recipe.build(rec, first, [(t, i) for i, t in enumerate(first)]
                                 + [(q_nope, 0), (q_pe, 1)])
    assert recipe is not None
    held = [v for _, _, template, _ in recipe.launches for v in template]
    assert not any(v is t for v in held for t in (q, kv, q_nope, q_pe, part, part_lse))

    second = _sources(1)
    out2, lse2 = recipe(second[0], second[2], second[3], None, None, None)
    assert out2.shape == (2, 4, 512) and lse2.shape == (2, 4)
    a, b = compiled.launches
    assert a[:9] == (4, 2, 1, 7, "function", "metadata", None, None, None)
    assert b[:9] == (2, 1, 1, 7, "function", "metadata", None, None, None)
    q2 = second[0]
    assert a[9] == q2.data_ptr() and a[10] == q2.data_ptr() + 512 * 4
    assert b[10] == second[2].data_ptr() and b[11] is shared_buf
    # the scratch: one new allocation, the second tensor (24 floats after the first) 256 bytes on
    assert b[9] - a[11] == replay.SCRATCH_ALIGN and a[11] != part.data_ptr()
    assert a[12:] == (10, 0.5, 16) and b[12:] == (3, 1.5, 32)


def test_a_call_that_cannot_be_replayed(stand_in):
    """A launch handed a tensor the call made (a copy), or one that took Triton's path, leaves
    no recipe; a launch outside the recording (a one-off query) is no part of it."""
    kernel, compiled = stand_in
    first = _sources(0)
    with launch.recording() as rec:
        launch.launch(kernel, (1,), first[0].clone(), None, None, n=1, scale=1.0, BLOCK=16)
    assert replay.Recipe.build(rec, first, [(t, i) for i, t in enumerate(first)]) is None
    with launch.recording() as rec:
        launch.launch(kernel, (1,), first[0], None, None, n=1, scale=1.0, BLOCK=16)
        launch.launch(kernel, (1,), first[0], None, None, n=1, scale=(1, 2), BLOCK=16)
    assert not rec.complete
    with launch.recording() as rec:
        with launch.unrecorded():
            launch.launch(kernel, (1,), torch.zeros(1), None, None, n=1, scale=1.0, BLOCK=16)
        launch.launch(kernel, (1,), first[2], None, None, n=1, scale=1.0, BLOCK=16)
    assert len(rec.launches) == 1
    assert replay.Recipe.build(rec, first, [(t, i) for i, t in enumerate(first)]) is not None


def _key(q, kv, indices, **kw):
    args = dict(sm_scale=0.1, topk_length=None, attn_sink=None, out=None, return_lse=False,
                fp8_workspace=None, rows_bound=None, entries_bound=None)
    args.update(kw)
    return replay.find(q, kv, indices, args.pop("sm_scale"), **args)[0]


def test_keys_are_the_calls_facts(stand_in):
    """Calls of equal dtypes, shapes, strides, alignments, scale (and its type) and outputs
    share a key whatever their values; any of these changed gives another key; calls whose
    launches depend on more than these (the fp8 workspace forced, an invalid bound) have none."""
    q, _, kv, indices, *_ = _sources(0)
    base = _key(q, kv, indices)
    assert base is not None
    q2, _, kv2, indices2, *_ = _sources(1)
    assert _key(q2, kv2, indices2) == base
    # (bounds steer only the workspace, whose calls are never replayed)
    assert _key(q2, kv2, indices2, rows_bound=7, entries_bound=100) == base
    others = [
        _key(q.to(torch.float16), kv, indices),
        _key(q[:1], kv, indices),
        _key(q.transpose(0, 1).contiguous().transpose(0, 1), kv, indices),
        _key(torch.empty(q.numel() + 1)[1:].view(q.shape), kv, indices),  # (not 16-byte aligned)
        _key(q, kv[:9], indices),
        _key(q, kv, indices, sm_scale=0.2),
        _key(q, kv, indices, return_lse=True),
        _key(q, kv, indices, fp8_workspace=False),
        _key((q[..., :512], q[..., 512:]), kv, indices),
        _key(q, kv, indices, topk_length=torch.zeros(2, dtype=torch.int32)),
        _key(q, kv, indices, out=torch.empty(2, 4, 512)),
    ]
    assert base not in others and len(set(others)) == len(others)
    assert _key(q, kv, indices, sm_scale=1) != _key(q, kv, indices, sm_scale=True)
    for kw in (dict(fp8_workspace=True), dict(fp8_workspace=1), dict(rows_bound=-1),
               dict(entries_bound=2.0), dict(rows_bound=True), dict(sm_scale=[0.1])):
        assert _key(q, kv, indices, **kw) is None, kw
    assert _key([q], kv, "indices") is None


def test_no_key_while_hooked_or_turned_off(stand_in, monkeypatch):
    q, _, kv, indices, *_ = _sources(0)
    monkeypatch.setattr(launch, "_RUNTIME", [lambda: 0, lambda device: 7, lambda: False])
    assert _key(q, kv, indices) is None
    monkeypatch.setattr(launch, "_RUNTIME", [lambda: 0, lambda device: 7, lambda: True])
    monkeypatch.setattr(launch, "FAST", False)
    assert _key(q, kv, indices) is None


def _replays(monkeypatch):
    """Count the replayed calls."""
    calls = []
    original = replay.Recipe.__call__

    def spy(self, *args):
        calls.append(self)
        return original(self, *args)

    monkeypatch.setattr(replay.Recipe, "__call__", spy)
    return calls


def _compare(prob, fmt, out=None, q=None, kv=None, indices=None, lse=True):
    result = sparse_mla_attention(prob.q if q is None else q, prob.kv if kv is None else kv,
                                  prob.indices if indices is None else indices, prob.sm_scale,
                                  topk_length=prob.topk_length, attn_sink=prob.attn_sink, out=out,
                                  return_lse=lse)
    got_out, got_lse = result if lse else (result, None)
    if out is not None:
        assert got_out is out
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length,
                                            attn_sink=prob.attn_sink)
    assert_close(got_out, got_lse, ref_out, ref_lse, **tol(fmt))


# (name, make_problem's arguments): split top-k axes and their combine (T = 1), the few-head and
# 64-head tiles, both row formats, lengths, a sink, a tuple q, a NoPE q
CASES = {
    "T1-H64-bf16-splits": dict(t=1, h=64, k=2048, n=4096),
    "T1-H16-fp8-splits": dict(t=1, h=16, k=2048, n=4096, fmt="fp8_ds_mla"),
    "T40-H16-bf16-lengths-sink-tuple": dict(t=40, h=16, k=256, n=1000, topk_length="partial",
                                            sink=True, q_tuple=True),
    "T8-H64-fp8-lengths": dict(t=8, h=64, k=512, n=1000, fmt="fp8_ds_mla", topk_length="partial"),
    "T4-H32-bf16-nope": dict(t=4, h=32, k=300, n=700, d_qk=512),
}


@pytest.mark.gpu
@pytest.mark.parametrize("aligned", [False, True], ids=["strided", "aligned"])
@pytest.mark.parametrize("case", list(CASES))
def test_replayed_calls_match_the_reference(monkeypatch, device, case, aligned):
    """A second call of a shape, over new values, is a replay and gives the reference's answer
    (caches at make_problem's odd row stride, and at one aligned as vLLM's, which sm90's Gluon
    kernels take); so is a third writing into a given ``out``, and a 3-D cache and indices."""
    calls = _replays(monkeypatch)
    args = CASES[case]
    fmt = args.get("fmt", "bf16")
    probs = [make_problem(**args, seed=seed, device=device) for seed in range(3)]
    kvs = [aligned_rows(p.kv) if aligned else p.kv for p in probs]
    _compare(probs[0], fmt, kv=kvs[0])
    assert not calls
    _compare(probs[1], fmt, kv=kvs[1])
    assert len(calls) == 1, "a second call of the same shape should be a replay"
    t, h = probs[0].indices.shape[0], args["h"]
    for _ in range(2):  # (recorded, then replayed)
        out = torch.full((t, h, 512), float("nan"), dtype=torch.bfloat16, device=device)
        _compare(probs[2], fmt, out=out, kv=kvs[2], lse=False)
    for _ in range(2):
        _compare(probs[2], fmt, kv=kvs[2].unsqueeze(1), indices=probs[2].indices.unsqueeze(1))
    assert len(calls) == 3


@pytest.mark.gpu
def test_workspace_calls_are_not_replayed(monkeypatch, device):
    """fp8_ds_mla rows with the workspace forced, or considered by its rule, run the full path
    every time (what runs depends on the rows named), and give the reference's answer."""
    calls = _replays(monkeypatch)
    prob = make_problem(t=1024, h=16, k=64, n=3000, fmt="fp8_ds_mla", device=device)
    for forced in (True, None, True, None):
        out, lse = sparse_mla_attention(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                        return_lse=True, fp8_workspace=forced)
        ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale)
        assert_close(out, lse, ref_out, ref_lse, **tol("fp8_ds_mla"))
    assert not calls


@pytest.mark.gpu
@SM90_ONLY
def test_a_query_the_gluon_kernel_copies_is_never_replayed(monkeypatch, device):
    """sm90's 64-head bf16 kernel copies a query not 16-byte aligned: the launches are handed a
    tensor of the call's own, so the shape is kept as never replayed; each call still right."""
    calls = _replays(monkeypatch)
    prob = make_problem(t=128, h=64, k=256, n=1000, device=device)
    kv = aligned_rows(prob.kv)
    shifted = torch.empty(prob.q.numel() + 1, dtype=prob.q.dtype, device=device)[1:]
    shifted = shifted.view(prob.q.shape).copy_(prob.q)
    assert shifted.data_ptr() % 16 != 0
    for _ in range(2):
        _compare(prob, "bf16", q=shifted, kv=kv)
    assert not calls
    assert None in replay._RECIPES.values()
