"""Rows past 2^31 elements: every kernel forms its offsets into the cache, q, the indices and
the output in 64 bits.

Peers shipped kernels whose row offsets (row id x row stride) were 32-bit products, which wrap
once a cache passes 2^31 elements: 4 GiB of bf16 rows, 2 GiB of fp8_ds_mla rows (about 3.2M
tokens of one layer). Here a small problem's rows are placed past that point in a much larger
cache (only the rows named are written; on a GPU the rest is poisoned), its valid indices moved
with them and its invalid ones kept invalid, and the result is compared with the float64
reference of the small problem. The large cache has few rows far apart (a row stride of about
900K elements, a multiple of 16 as the Gluon kernels' copies need): the same products past
2^31 as millions of rows at vLLM's stride, without passes over millions of rows in the
interpreter (the workspace's upconvert pass visits every row). On a CPU it is address space
only: no page but the written rows' is touched. The same holds for tokens: q, the indices and
the output of a call whose last token lies past 2^31 elements of each (a 32K-token prefill with
128 heads has 2^31 output elements).
"""

import pytest
import torch

from problems import SM90_ONLY, assert_close, beyond_this_gpu_skips, make_problem, tol
from triton_sparse_mla import api, configs, sparse_mla_attention, sparse_mla_reference

LIMIT = 2**31  # elements of the cache before the first far row


def _reserve(shape, dtype, device):
    """``torch.empty(shape)``, or the test skipped where that much cannot be reserved (on a
    CPU it is address space, not memory: conftest's poisoning of new memory is held off here,
    since it would touch every page)."""
    poison = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except (RuntimeError, MemoryError) as exc:
        gib = torch.Size(shape).numel() * dtype.itemsize / 2**30
        pytest.skip(f"cannot reserve {gib:.1f} GiB here: {exc}")
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = poison


def _tokens_apart(x, fill=0):
    """A copy of ``x [T, ...]`` (T >= 3) whose tokens lie about ``2^31 / (T - 1)`` elements
    apart (a multiple of 16), the last one past 2^31 elements; the rest of its storage is
    ``fill`` on a GPU."""
    t = x.shape[0]
    stride = -(-LIMIT // (t - 1))
    stride += (-stride) % 16
    store = _reserve(((t - 1) * stride + x[0].numel(),), x.dtype, x.device)
    if store.is_cuda:
        store.fill_(fill)
    inner = x[0].contiguous().stride()
    apart = store.as_strided(x.shape, (stride, *inner))
    apart.copy_(x)
    assert apart.stride(0) * (t - 1) >= LIMIT
    return apart


def _far(prob, n):
    """``(kv, indices)``: ``prob``'s ``n`` rows at ids from ``8 n`` on, whose offsets pass 2^31
    elements, in a cache of ``9 n + 8`` rows, and its indices moved to them."""
    near = prob.kv
    width = near.shape[1]
    base = 8 * n
    stride = -(-LIMIT // base)
    stride += (-stride) % 16
    n_far = base + n + 8
    store = _reserve((n_far, stride), near.dtype, near.device)
    if store.is_cuda:  # a stray read shows (NaN rows, NaN fp8 bytes and scales)
        store.fill_(255 if near.dtype == torch.uint8 else float("nan"))
    store[base:base + n, :width] = near
    kv = store[:, :width]
    assert kv.storage_offset() + base * kv.stride(0) >= LIMIT  # the first far row's offset
    idx = prob.indices.long()
    far = torch.where((idx >= 0) & (idx < n), idx + base,
                      torch.where(idx >= n, (idx - n + n_far).clamp(max=2**31 - 1), idx))
    return kv, far.to(torch.int32)


def _problem(t, h, fmt, device):
    n = 300
    prob = make_problem(t=t, h=h, k=100, n=n, fmt=fmt, topk_length="partial", sink=True,
                        device=device)
    ref = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                               topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    return prob, ref, _far(prob, n)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("h", [16, 64])
def test_far_rows(h, fmt, device):
    """The planned kernel for the device (on a CPU the Triton tile through the interpreter)
    reads rows past 2^31 elements of the cache and matches the reference."""
    prob, (ref_out, ref_lse), (kv, indices) = _problem(3, h, fmt, device)
    out, lse = sparse_mla_attention(prob.q, kv, indices, prob.sm_scale,
                                    topk_length=prob.topk_length, attn_sink=prob.attn_sink,
                                    return_lse=True)
    assert_close(out, lse, ref_out, ref_lse, **tol(fmt))


def test_far_rows_through_the_workspace(device):
    """fp8_ds_mla rows past 2^31 bytes through the bf16 workspace: its passes (mark, remap,
    upconvert) read and mark the far rows, and the result matches the reference."""
    prob, (ref_out, ref_lse), (kv, indices) = _problem(3, 16, "fp8_ds_mla", device)
    out, lse = sparse_mla_attention(prob.q, kv, indices, prob.sm_scale,
                                    topk_length=prob.topk_length, attn_sink=prob.attn_sink,
                                    return_lse=True, fp8_workspace=True)
    assert_close(out, lse, ref_out, ref_lse, **tol("fp8_ds_mla"))


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("h", [16, 64])
def test_far_tokens(h, fmt, device):
    """q, the indices and the output with their last token past 2^31 elements:
    the planned kernel (and the split merge, where it splits) reads and writes it, and the
    result matches the reference."""
    prob, (ref_out, ref_lse), _ = _problem(3, h, fmt, device)
    q = _tokens_apart(prob.q, float("nan"))
    indices = _tokens_apart(prob.indices, -1)
    out = _tokens_apart(torch.zeros(3, h, 512, dtype=q.dtype, device=device), float("nan"))
    got, lse = sparse_mla_attention(q, prob.kv, indices, prob.sm_scale,
                                    topk_length=prob.topk_length, attn_sink=prob.attn_sink,
                                    out=out, return_lse=True)
    assert got.data_ptr() == out.data_ptr()
    assert_close(out, lse, ref_out, ref_lse, **tol(fmt))


# Each Gluon kernel of sm90's tables, and the Triton tile each gives way to where Gluon does not
# run.
_GLUON = [
    pytest.param(16, "bf16", configs.TileConfig(16, 64, 4, 2, gluon=True), id="narrow-plain"),
    pytest.param(16, "fp8_ds_mla", configs.TileConfig(16, 64, 4, 2, gluon=True, fp8_f16=True),
                 id="narrow-fp8"),
    pytest.param(64, "bf16", configs.pick_tile("sm90", t_count=128, h_count=64, fp8=False),
                 id="pingpong"),
    pytest.param(64, "fp8_ds_mla", configs.pick_tile("sm90", t_count=128, h_count=64, fp8=True),
                 id="fp8-producer"),
]


_GLUON_RUNS = pytest.param(True, id="gluon", marks=[pytest.mark.gpu, SM90_ONLY])


@pytest.mark.parametrize("gluon", [_GLUON_RUNS, pytest.param(False, id="triton")])
@pytest.mark.parametrize("h, fmt, tile", _GLUON)
def test_far_rows_each_kernel(h, fmt, tile, gluon, device):
    """Each of sm90's Gluon kernels (on SM90), and the Triton tile each gives way to (on every
    device; on a CPU through the interpreter), split and not (the split merge too), over rows
    past 2^31 elements of the cache, with q, the indices and the output's last token past 2^31
    elements of each."""
    assert tile.gluon
    prob, (ref_out, ref_lse), (kv, indices) = _problem(3, h, fmt, device)
    tile = tile if gluon else tile.without_gluon()
    q_nope, q_pe = api._split_query(_tokens_apart(prob.q, float("nan")))
    indices = _tokens_apart(indices, -1)
    out = _tokens_apart(torch.zeros(3, h, 512, dtype=torch.bfloat16, device=device), float("nan"))
    fp8_cvt = (configs.fp8_cvt_level(torch.cuda.get_device_capability(device))
               if device.type == "cuda" else 0)
    for splits in (1, 3):
        out.fill_(float("nan"))
        lse = torch.empty(3, h, dtype=torch.float32, device=device)
        plan = configs.LaunchPlan(tile=tile, splits=splits, fp8_cvt=fp8_cvt)
        with beyond_this_gpu_skips(tile, device):
            compiled = api._run(q_nope, q_pe, kv, indices, prob.topk_length, prob.attn_sink,
                                prob.sm_scale, out, lse, family=None, sm_count=1,
                                fp8_cvt=fp8_cvt, fp8=fmt == "fp8_ds_mla", plan=plan)
        if device.type == "cuda":  # (the interpreter returns no compiled kernel)
            assert ("gluon" in compiled.name) == gluon, compiled.name
        assert_close(out, lse, ref_out, ref_lse, **tol(fmt))
