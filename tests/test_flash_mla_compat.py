"""FlashMLA-shaped entry points against the float64 reference: prefill, paged decode, errors."""

import math

import pytest
import torch

from problems import assert_close, make_problem, tol
from triton_sparse_mla import sparse_mla_reference
from triton_sparse_mla.flash_mla_compat import (
    MLASchedule,
    flash_mla_sparse_fwd,
    flash_mla_with_kvcache,
    get_mla_metadata,
)
from triton_sparse_mla.formats import row_values


def reference_max_logits(q, kv, indices, sm_scale, topk_length=None):
    """Float64 ``max sm_scale * q . x`` over the counted valid entries; -inf when none."""
    vals = row_values(kv.cpu())  # [N, D_QK]
    qd = q.double().cpu()
    idx = indices.cpu().long()
    valid = (idx >= 0) & (idx < vals.shape[0])
    if topk_length is not None:
        valid &= torch.arange(idx.shape[1])[None, :] < topk_length.cpu().long()[:, None]
    result = torch.full(qd.shape[:2], float("-inf"), dtype=torch.float64)
    for t in range(qd.shape[0]):
        rows = vals[idx[t][valid[t]]]
        if rows.shape[0]:
            result[t] = (qd[t] @ rows.T * sm_scale).amax(dim=-1)
    return result


def prefill_case(t, h, k, n, fmt="bf16", **kw):
    name = f"T{t}-H{h}-K{k}-N{n}-{fmt}" + "".join(f"-{a}" for a, v in kw.items() if v)
    return pytest.param(dict(t=t, h=h, k=k, n=n, fmt=fmt, **kw), id=name)


@pytest.mark.parametrize("p", [
    prefill_case(3, 16, 64, 300, topk_length="partial", sink=True),
    prefill_case(2, 64, 64, 512, "fp8_ds_mla"),
    prefill_case(4, 16, 100, 257, empty_row=True),
])
def test_sparse_fwd_matches_reference(p, device):
    p = dict(p)
    empty_row = p.pop("empty_row", False)
    prob = make_problem(device=device, **p)
    if empty_row:
        # Token 1 selects nothing: every entry -1.
        prob.indices[1] = -1
    kv = prob.kv[:, None, :]  # [s_kv, 1, C]
    indices = prob.indices[:, None, :]  # [s_q, 1, topk]
    out, max_logits, lse = flash_mla_sparse_fwd(prob.q, kv, indices, prob.sm_scale,
                                                attn_sink=prob.attn_sink,
                                                topk_length=prob.topk_length)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    assert out.shape == (p["t"], p["h"], 512) and out.dtype == torch.bfloat16
    assert lse.shape == (p["t"], p["h"]) and lse.dtype == torch.float32
    assert_close(out, lse, ref_out, ref_lse, **tol(p["fmt"]))

    ref_max = reference_max_logits(prob.q, prob.kv, prob.indices, prob.sm_scale, prob.topk_length)
    assert max_logits.shape == (p["t"], p["h"]) and max_logits.dtype == torch.float32
    got = max_logits.double().cpu()
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref_max)), "max_logits -inf pattern differs"
    fin = torch.isfinite(ref_max)
    assert (got[fin] - ref_max[fin]).abs().max().item() < 1e-3
    # The max never exceeds the log-sum-exp it belongs to.
    assert torch.all(got[fin] <= lse.double().cpu()[fin] + 1e-3)
    if empty_row:
        assert torch.isneginf(got[1]).all() and torch.isneginf(lse[1].cpu()).all()
        assert torch.all(out[1] == 0)


def test_sparse_fwd_without_max_logits(device):
    prob = make_problem(t=2, h=16, k=64, n=200, device=device)
    out, max_logits, lse = flash_mla_sparse_fwd(prob.q, prob.kv[:, None], prob.indices[:, None],
                                                prob.sm_scale, return_max_logits=False)
    assert max_logits is None
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale)
    assert_close(out, lse, ref_out, ref_lse, **tol("bf16"))


def paged_cache(kv, block_size, gap_blocks=0):
    """Copy flat rows ``[N, C]`` into ``[N / block_size, block_size, 1, C]`` pages.

    ``gap_blocks`` extra pages of poison sit after every block, so the block stride exceeds
    ``block_size`` rows; rows are padded too, so the row stride exceeds C.
    """
    n, width = kv.shape
    assert n % block_size == 0
    num_blocks = n // block_size
    pad = 0xFF if kv.dtype == torch.uint8 else float("nan")
    store = torch.full((num_blocks, block_size * (1 + gap_blocks), 1, width + 16), pad,
                       dtype=kv.dtype, device=kv.device)
    cache = store[:, :block_size, :, :width]
    cache.copy_(kv.reshape(num_blocks, block_size, 1, width))
    assert cache.stride(0) > block_size * cache.stride(1) or gap_blocks == 0
    return cache


def decode_case(b, s_q, h, k, n, fmt="bf16", block_size=64, gap_blocks=0, **kw):
    name = f"B{b}-S{s_q}-H{h}-K{k}-N{n}-{fmt}-bs{block_size}" + (
        f"-gap{gap_blocks}" if gap_blocks else "") + "".join(f"-{a}" for a, v in kw.items() if v)
    return pytest.param(dict(b=b, s_q=s_q, h=h, k=k, n=n, fmt=fmt, block_size=block_size,
                             gap_blocks=gap_blocks, **kw), id=name)


@pytest.mark.parametrize("p", [
    decode_case(2, 2, 16, 64, 256, lengths=True, sink=True, gap_blocks=1),
    decode_case(3, 1, 16, 64, 256, "fp8_ds_mla", lengths=True),
    decode_case(1, 2, 64, 64, 512, "fp8_ds_mla", block_size=32, gap_blocks=2, fp8_dtype=True),
    decode_case(2, 1, 16, 100, 192, block_size=1, gap_blocks=3, sink=True),
])
def test_with_kvcache_matches_reference(p, device):
    t = p["b"] * p["s_q"]
    prob = make_problem(t=t, h=p["h"], k=p["k"], n=p["n"], fmt=p["fmt"], sink=p.get("sink", False),
                        seed=t + p["h"], device=device)
    b, s_q, h = p["b"], p["s_q"], p["h"]
    cache = paged_cache(prob.kv, p["block_size"], p["gap_blocks"])
    if p.get("fp8_dtype"):
        cache = cache.view(torch.float8_e4m3fn)
    lengths = None
    if p.get("lengths"):
        g = torch.Generator().manual_seed(7)
        lengths = torch.randint(0, p["k"] + 1, (b,), generator=g, dtype=torch.int32).to(device)
        lengths[-1] = 0
    q = prob.q.view(b, s_q, h, prob.q.shape[-1])  # non-contiguous, as make_problem builds it
    indices = prob.indices.view(b, s_q, p["k"])
    sched, num_splits = get_mla_metadata()
    out, lse = flash_mla_with_kvcache(q, cache, None, None, 512, sched, num_splits,
                                      softmax_scale=prob.sm_scale, indices=indices,
                                      attn_sink=prob.attn_sink, topk_length=lengths,
                                      extra_k_cache=None, extra_indices_in_kvcache=None)
    per_token = None if lengths is None else lengths.repeat_interleave(s_q)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=per_token, attn_sink=prob.attn_sink)
    assert out.shape == (b, s_q, h, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (b, h, s_q) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert_close(out.reshape(t, h, 512), lse.transpose(1, 2).reshape(t, h), ref_out, ref_lse,
                 **tol(p["fmt"]))
    if lengths is not None:
        assert torch.isneginf(lse[-1].cpu()).all(), "topk_length 0 must leave the batch row empty"


def test_with_kvcache_default_scale(device):
    prob = make_problem(t=2, h=16, k=64, n=128, device=device)
    cache = paged_cache(prob.kv, 64)
    out, lse = flash_mla_with_kvcache(prob.q[:, None], cache, None, None, 512, MLASchedule(),
                                      indices=prob.indices[:, None], is_fp8_kvcache=False)
    scale = 1.0 / math.sqrt(576)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, scale)
    assert_close(out[:, 0], lse[:, :, 0], ref_out, ref_lse, **tol("bf16"))


def test_get_mla_metadata_accepts_flash_mla_arguments():
    seqlens = torch.tensor([5, 9], dtype=torch.int32)
    sched, num_splits = get_mla_metadata(seqlens, 64, 1, 128, is_fp8_kvcache=True, topk=2048)
    assert isinstance(sched, MLASchedule) and num_splits is None


@pytest.fixture
def decode_args(device):
    prob = make_problem(t=4, h=16, k=16, n=64, device=device)
    return dict(q=prob.q.view(2, 2, 16, 576), k_cache=paged_cache(prob.kv, 16), block_table=None,
                cache_seqlens=None, head_dim_v=512, tile_scheduler_metadata=MLASchedule(),
                indices=prob.indices.view(2, 2, 16))


def _strided_cache(decode_args):
    # Block stride 16 * 576 + 8 elements: not a whole number of 576-element rows.
    cache = decode_args["k_cache"]
    base = torch.zeros(cache.shape[0] * (16 * 576 + 8), dtype=cache.dtype, device=cache.device)
    return base.as_strided(cache.shape, (16 * 576 + 8, 576, 576, 1))


@pytest.mark.parametrize("over, exc, words", [
    pytest.param(lambda a: dict(head_dim_v=576), ValueError, ["head_dim_v", "512", "576"], id="head_dim_v"),
    pytest.param(lambda a: dict(causal=True), NotImplementedError, ["causal"], id="causal"),
    pytest.param(lambda a: dict(indices=None), NotImplementedError, ["dense"], id="dense"),
    pytest.param(lambda a: dict(extra_k_cache=a["k_cache"]), NotImplementedError, ["extra_k_cache"],
                 id="extra-cache"),
    pytest.param(lambda a: dict(is_fp8_kvcache=True), ValueError, ["is_fp8_kvcache", "bfloat16"],
                 id="fp8-flag"),
    pytest.param(lambda a: dict(q=a["q"][0]), ValueError, ["q", "[b, s_q, h_q, d_qk]"], id="q-rank"),
    pytest.param(lambda a: dict(indices=a["indices"][:1]), ValueError,
                 ["indices", "[2, 2, topk]", "[1, 2, 16]"], id="indices-shape"),
    pytest.param(lambda a: dict(indices=a["indices"].long()), TypeError, ["indices", "int32"],
                 id="indices-dtype"),
    pytest.param(lambda a: dict(topk_length=torch.zeros(3, dtype=torch.int32)), ValueError,
                 ["topk_length", "[2]", "[3]"], id="topk_length-shape"),
    pytest.param(lambda a: dict(k_cache=a["k_cache"].expand(-1, -1, 2, -1)), ValueError,
                 ["k_cache", "[num_blocks, block_size, 1, C]"], id="cache-heads"),
    pytest.param(lambda a: dict(k_cache=_strided_cache(a)), ValueError,
                 ["k_cache", "block stride", "9224"], id="cache-block-stride"),
])
def test_with_kvcache_errors(decode_args, over, exc, words):
    args = dict(decode_args)
    args.update(over(args))
    with pytest.raises(exc) as info:
        flash_mla_with_kvcache(**args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_sparse_fwd_rejects_other_d_v(device):
    prob = make_problem(t=1, h=16, k=16, n=32, device=device)
    with pytest.raises(ValueError, match="d_v.*512.*256"):
        flash_mla_sparse_fwd(prob.q, prob.kv[:, None], prob.indices[:, None], prob.sm_scale, d_v=256)
