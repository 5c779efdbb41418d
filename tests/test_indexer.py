"""The DSA indexer's score kernels against the float64 specification (indexer/reference.py).

Keys no row may read are NaN (fp8 byte 0x7F, NaN scales) and outputs start as NaN inside a wider
buffer: a stray read shows as a NaN where a value is expected, a stray write as a number where
NaN must stay (past a row's length, or past ``width`` in the buffer's padding).
"""

import pytest
import torch

from triton_sparse_mla.indexer import (
    mqa_logits, mqa_logits_reference, pack_indexer_k_cache, paged_mqa_logits,
    paged_mqa_logits_reference)
from triton_sparse_mla.indexer import flat
from triton_sparse_mla.indexer.reference import row_limits

from problems import indexer_tolerance

D = 128
_FP8_NAN = 0x7F


def _fp8(g, *shape):
    return (torch.randn(*shape, generator=g) * 2).to(torch.float8_e4m3fn)


def _strided_fp8(g, *shape):
    """A float8_e4m3fn tensor whose first dimension has padding: not contiguous."""
    return _fp8(g, *shape[:-1], shape[-1] + 16)[..., : shape[-1]]


def _weights(g, rows, heads):
    """``[rows, heads]`` float32 with padded rows (not contiguous)."""
    return torch.randn(rows, heads + 3, generator=g)[:, :heads]


def _nan_output(rows, width, device):
    """A NaN ``[rows, width]`` view of a buffer 8 columns wider, and the buffer."""
    buf = torch.full((rows, width + 8), float("nan"), device=device)
    return buf[:, :width], buf


def _check(out, buf, ref, width):
    """Valid columns match the reference; every other element of ``buf`` is still NaN."""
    valid = torch.isfinite(ref)
    got = out.double().cpu()
    assert not got[valid].isnan().any(), "NaN in a valid column: a poisoned key was read"
    err = (got[valid] - ref[valid]).abs().max().item() if valid.any() else 0.0
    scale = max(ref[valid].abs().max().item(), 1.0) if valid.any() else 1.0
    assert err <= indexer_tolerance(out.device) * scale, f"max error {err} against max |ref| {scale}"
    assert got[~valid].isnan().all(), "a column past a row's length was written"
    assert buf[:, width:].isnan().all(), "a column past width was written"


def _prefill_ranges(g, seq_lens, width):
    """Causal ranges of a prefill chunk: token ``p`` of a sequence starting at key ``s`` sees
    ``[s, s + p + 1)``; every fifth token's range is cut short at its start (a sliding window),
    and one token sees nothing."""
    starts, ends, base = [], [], 0
    for n in seq_lens:
        for p in range(n):
            lo, hi = base, base + p + 1
            if p % 5 == 4:
                lo = hi - int(torch.randint(1, p + 2, (1,), generator=g))
            starts.append(lo)
            ends.append(min(hi, lo + width))
        base += n
    starts[1] = ends[1]
    return torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32)


@pytest.mark.parametrize("heads, seq_lens, gap, cut", [
    pytest.param(8, (37,), 0, 0, id="H8-one-seq-37"),
    pytest.param(16, (20, 51), 9, 0, id="H16-two-seqs-gap"),
    pytest.param(64, (3, 70), 0, 0, id="H64-two-seqs"),
    pytest.param(8, (45, 30), 0, 6, id="H8-width-cuts"),
])
@pytest.mark.parametrize("heads_along_n", [True, False], ids=["heads-along-n", "per-head"])
def test_mqa_logits(device, monkeypatch, heads, seq_lens, gap, cut, heads_along_n):
    """``cut``: the output is that much narrower than the longest range (the longest are cut).
    Both prefill kernels run, whichever this device's family would pick (the unseen keys' scales
    are NaN, so a scale taken from a key other than the one multiplied shows)."""
    monkeypatch.setattr(flat, "HEADS_ALONG_N", dict.fromkeys(flat.HEADS_ALONG_N, heads_along_n))
    g = torch.Generator().manual_seed(heads)
    width = max(seq_lens) - cut
    starts, ends = _prefill_ranges(g, seq_lens, max(seq_lens))
    # ``gap`` poisoned keys sit between the sequences; keys are ``[N, D]`` with padded rows.
    if gap:
        first = seq_lens[0]
        starts = torch.where(torch.arange(len(starts)) >= first, starts + gap, starts)
        ends = torch.where(torch.arange(len(ends)) >= first, ends + gap, ends)
    n_keys = sum(seq_lens) + gap
    m_rows = len(starts)
    q = _strided_fp8(g, m_rows, heads, D)
    k = _strided_fp8(g, n_keys, D)
    k_scale = torch.rand(n_keys, generator=g) + 0.05
    seen = torch.zeros(n_keys, dtype=torch.bool)
    for lo, hi in zip(starts.tolist(), ends.tolist()):
        seen[lo:hi] = True
    k.view(torch.uint8)[~seen] = _FP8_NAN
    k_scale[~seen] = float("nan")
    weights = _weights(g, m_rows, heads)
    ref = mqa_logits_reference(q, k, k_scale, weights, starts, ends, width)
    out, buf = _nan_output(m_rows, width, device)
    got = mqa_logits(q.to(device), k.to(device), k_scale.to(device), weights.to(device),
                     starts.to(device), ends.to(device), width, out=out)
    assert got.data_ptr() == out.data_ptr()
    _check(out, buf, ref, width)


def _paged_problem(g, *, context, next_n, heads, block_size, two_d):
    """Requests' caches scattered over NaN-poisoned blocks; block-table entries past a
    request's blocks are out of range (never read)."""
    batch = len(context)
    limits_hi = [max(c, 0) for c in context]
    blocks_per = [-(-c // block_size) for c in limits_hi]
    n_blocks = sum(blocks_per) + 3
    keys = _fp8(g, n_blocks, block_size, D)
    scales = torch.rand(n_blocks, block_size, generator=g) + 0.05
    order = torch.randperm(n_blocks, generator=g)
    max_blocks = max(blocks_per) + 2
    tables = torch.full((batch, max_blocks), 2**31 - 1, dtype=torch.int32)
    used = torch.zeros(n_blocks, dtype=torch.bool)
    at = 0
    for b, nb in enumerate(blocks_per):
        ids = order[at: at + nb]
        at += nb
        tables[b, :nb] = ids.int()
        used[ids] = True
    keys.view(torch.uint8)[~used] = _FP8_NAN
    scales[~used] = float("nan")
    q = _strided_fp8(g, batch, next_n, heads, D)
    weights = _weights(g, batch * next_n, heads)
    if two_d:
        # each row sees up to its own position; the last row the whole context
        offs = torch.arange(next_n) - (next_n - 1)
        lens = (torch.tensor(context)[:, None] + offs[None, :]).clamp_min(0).int()
    else:
        lens = torch.tensor(context, dtype=torch.int32)
    return q, pack_indexer_k_cache(keys, scales), weights, lens, tables


@pytest.mark.parametrize("next_n, two_d, heads, block_size, context, width", [
    pytest.param(1, False, 64, 64, (1, 130, 64, 0), 160, id="n1-H64-bs64"),
    pytest.param(2, True, 16, 16, (5, 40, 71), 80, id="n2-2d-H16-bs16"),
    pytest.param(3, False, 8, 16, (3, 2, 50), 64, id="n3-H8-bs16-short"),
    pytest.param(4, True, 8, 16, (90, 17), 70, id="n4-2d-width-cuts"),
    pytest.param(3, True, 64, 64, (70, 130), 192, id="n3-2d-H64-two-row-groups"),
])
def test_paged_mqa_logits(device, next_n, two_d, heads, block_size, context, width):
    """The unused blocks' scales are NaN, so a scale taken from a block other than the one
    multiplied (the pipeline's copies ahead) shows."""
    g = torch.Generator().manual_seed(next_n * 100 + heads)
    q, cache, weights, lens, tables = _paged_problem(
        g, context=context, next_n=next_n, heads=heads, block_size=block_size, two_d=two_d)
    ref = paged_mqa_logits_reference(q, cache, weights, lens, tables, width)
    out, buf = _nan_output(len(context) * next_n, width, device)
    paged_mqa_logits(q.to(device), cache.to(device), weights.to(device), lens.to(device),
                     tables.to(device), width, out=out)
    _check(out, buf, ref, width)


def test_row_limits():
    """1-D lengths count the request's new tokens, the last of which sees them all."""
    assert row_limits(torch.tensor([5, 1]), 3).tolist() == [3, 4, 5, 0, 0, 1]
    assert row_limits(torch.tensor([[2, 7]]), 2).tolist() == [2, 7]


def test_paged_reference_reads_the_block_layout():
    """The reference's keys are where vLLM's indexer K cache keeps them: a block's values first,
    token after token, then its fp32 scales."""
    g = torch.Generator().manual_seed(1)
    keys, scales = _fp8(g, 2, 16, D), torch.rand(2, 16, generator=g)
    flat = pack_indexer_k_cache(keys, scales).reshape(2, -1)
    assert torch.equal(flat[1, 5 * D: 6 * D], keys[1, 5].view(torch.uint8))
    assert torch.equal(flat[1, 16 * D + 4 * 5: 16 * D + 4 * 6], scales[1, 5:6].view(torch.uint8))


def _flat_args(device):
    g = torch.Generator().manual_seed(0)
    q, k = _fp8(g, 4, 8, D).to(device), _fp8(g, 10, D).to(device)
    rows = torch.zeros(4, dtype=torch.int32, device=device)
    return dict(q=q, k=k, k_scale=torch.ones(10, device=device),
                weights=torch.ones(4, 8, device=device), row_starts=rows, row_ends=rows + 3,
                width=4)


@pytest.mark.parametrize("over, exc, words", [
    (dict(q=torch.zeros(4, 8, D, dtype=torch.bfloat16)), TypeError, "q: expected dtype torch.float8_e4m3fn"),
    (dict(k=torch.zeros(10, 64, dtype=torch.float8_e4m3fn)), ValueError, "k: expected rows of D = 128"),
    (dict(k_scale=torch.ones(9)), ValueError, "k_scale: expected shape [10]"),
    (dict(weights=torch.ones(4, 7)), ValueError, "weights: expected shape [4, 8]"),
    (dict(row_ends=torch.ones(4, dtype=torch.int64)), TypeError, "row_ends: expected dtype torch.int32"),
    (dict(width=-1), ValueError, "width: expected an int >= 0, got -1"),
    (dict(width=4.0), TypeError, "width: expected an int >= 0, got 4.0"),
])
def test_mqa_logits_bad_input(device, over, exc, words):
    args = _flat_args(device)
    args.update({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in over.items()})
    with pytest.raises(exc, match=words.replace("[", r"\[").replace("]", r"\]")):
        mqa_logits(**args)


def test_mqa_logits_unaligned_rows(device):
    """Rows are read as 32-bit words: a q or k whose rows do not start at 4-byte aligned
    addresses is refused, naming it (built on the device: a copy there would align them)."""
    args = _flat_args(device)
    q = torch.zeros(4, 8, D + 2, dtype=torch.float8_e4m3fn, device=device)[..., :D]
    with pytest.raises(ValueError, match="q: expected rows at 4-byte aligned addresses"):
        mqa_logits(**(args | dict(q=q)))
    k = torch.zeros(10 * D + 1, dtype=torch.float8_e4m3fn, device=device)[1:].view(10, D)
    with pytest.raises(ValueError, match="k: expected rows at 4-byte aligned addresses"):
        mqa_logits(**(args | dict(k=k)))


def test_paged_mqa_logits_bad_input(device):
    g = torch.Generator().manual_seed(0)
    q, cache, weights, lens, tables = _paged_problem(g, context=(5, 9), next_n=2, heads=8,
                                                     block_size=16, two_d=False)
    args = [x.to(device) for x in (q, cache, weights, lens, tables)] + [32]
    with pytest.raises(ValueError, match=r"kv_cache: expected shape \[num_blocks, block_size, 1, 132\]"):
        paged_mqa_logits(args[0], args[1][..., :100], *args[2:])
    with pytest.raises(ValueError, match=r"context_lens: expected shape \[2\] or \[2, 2\]"):
        paged_mqa_logits(*args[:3], lens[:1].to(device), *args[4:])
    with pytest.raises(ValueError, match=r"block_tables: expected 2 rows"):
        paged_mqa_logits(*args[:4], args[4][:1], 32)
    with pytest.raises(ValueError, match=r"q: expected rows at 4-byte aligned addresses"):
        unaligned = torch.zeros(*q.shape[:-1], D + 1, dtype=q.dtype, device=device)[..., 1:]
        paged_mqa_logits(unaligned, *args[1:])


@pytest.mark.parametrize("default_dtype", [torch.float32, torch.bfloat16])
def test_warmup_runs_every_kind_of_call(device, default_dtype):
    """The warm-up's tiny calls are valid calls of both kernels (decode with 1 and 2 rows per
    request), at the models' geometry; also under a default dtype of bf16, which vLLM sets
    while it builds the model's layers (their warm-up runs then: found in an engine on an
    H100, where it failed on fp32 arguments made in the default dtype)."""
    from triton_sparse_mla.indexer import warmup

    before = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)
    try:
        warmup(device, 32, D)
    finally:
        torch.set_default_dtype(before)
