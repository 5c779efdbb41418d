"""Kernel warm-up (:mod:`triton_sparse_mla.warmup`): after it, calls of the warmed kind compile
nothing, whatever their token count, cache size, indices or lengths."""

import pytest
import torch

from triton_sparse_mla import configs, quantize_fp8_ds_mla, sparse_mla_attention, warmup, workspace
from triton_sparse_mla.kernels.attention import split_layout

FAMILIES = [("sm90", 132, 1), ("sm86", 170, 1), ("sm80", 108, 0)]


@pytest.mark.parametrize("family,sms,cvt", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize("heads", [8, 16, 64, 128])
@pytest.mark.parametrize("fp8,bf16_query", [(False, True), (True, True), (True, False)],
                         ids=["bf16", "fp8", "fp8-fp16q"])
def test_every_token_count_takes_a_warmed_variant(family, sms, cvt, heads, fp8, bf16_query):
    """Each token count from 1 to max_tokens plans a kernel variant (tile; split or not, and
    the combine kernel's power-of-two block for the split count) that one of the listed
    warm-up calls runs (fp8_ds_mla rows with a bf16 query: both the in-kernel variant and,
    from workspace.MIN_TOKENS on, the workspace's bf16 one), and no two calls run the same."""
    max_tokens = 3000
    calls = warmup.variant_token_counts(heads, fp8=fp8, bf16_query=bf16_query, topk=2048,
                                        max_tokens=max_tokens, family=family, sm_count=sms,
                                        fp8_cvt=cvt)

    def variant(t, in_kernel_fp8):
        plan = configs.plan_launch(family, sms, cvt, t_count=t, h_count=heads, topk=2048,
                                   fp8=in_kernel_fp8)
        splits = split_layout(2048, plan.splits, plan.tile.block_n)[1]  # as launched
        return in_kernel_fp8, plan.tile, splits > 1 and max(2, 1 << (splits - 1).bit_length())

    warmed = [variant(t, fp8 and ws is not True) for t, ws in calls]
    assert len(set(warmed)) == len(warmed), calls
    for t in range(1, max_tokens + 1):
        assert variant(t, fp8) in warmed, t
        if fp8 and bf16_query and t >= workspace.MIN_TOKENS:
            assert variant(t, False) in warmed, t
    assert all(ws is not True for t, ws in calls) or (fp8 and bf16_query)


def test_argument_errors_and_cpu():
    with pytest.raises(ValueError, match="kv_format: expected 'bf16', 'fp16' or 'fp8_ds_mla', got 'fp8'"):
        warmup.warmup(16, kv_format="fp8")
    with pytest.raises(ValueError, match="d_qk: fp8_ds_mla rows carry the rope part"):
        warmup.warmup(16, kv_format="fp8_ds_mla", d_qk=512)
    with pytest.raises(ValueError, match="num_heads: expected a positive int, got 0"):
        warmup.warmup(0)
    assert warmup.warmup(16, device="cpu") == []  # nothing to compile for the interpreter


def _calls_of_the_kind(fmt, heads, t, n_rows, seed, named=None, **kw):
    """A call over ``n_rows`` cache rows whose indices name rows below ``named`` (default: any)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, heads, 576, generator=g).bfloat16().cuda()
    rows = torch.randn(n_rows, 576, generator=g)
    kv = (quantize_fp8_ds_mla(rows) if fmt == "fp8_ds_mla" else rows.bfloat16()).cuda()
    idx = torch.randint(-1, named or n_rows, (t, 2048), generator=g, dtype=torch.int32).cuda()
    lengths = torch.randint(0, 2049, (t,), generator=g, dtype=torch.int32).cuda()
    return sparse_mla_attention(q, kv, idx, 0.05, topk_length=lengths, **kw)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt,heads", [("bf16", 16), ("fp8_ds_mla", 16), ("fp8_ds_mla", 64)])
def test_nothing_compiles_after_warmup(fmt, heads, monkeypatch):
    """Warm up one kind of call, then make calls of that kind with token counts across every
    phase, caches of other sizes (not multiples of 16: the workspace's slot count follows
    them), random indices and lengths, and prefill over a large cache with a bound on the rows
    it names (the workspace then finds its rows instead of keeping their ids, as in vLLM): no
    kernel compiles. The control: a kernel new to the
    process does compile under the same hook, so the hook sees compiles."""
    import triton
    import triton.language as tl
    from triton import knobs

    ran = warmup.warmup(heads, kv_format=fmt, topk=2048, max_tokens=1500)
    assert ran
    compiled = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook",
                        lambda **kw: compiled.append(kw.get("repr")))
    for seed, (t, n_rows) in enumerate([(1, 999), (2, 5000), (5, 1000), (8, 3001), (9, 777),
                                        (40, 4097), (133, 2000), (512, 5000), (513, 1500),
                                        (1024, 3001), (1500, 999)]):
        _calls_of_the_kind(fmt, heads, t, n_rows, seed)
    _calls_of_the_kind(fmt, heads, 1024, 60001, 11, named=3000, rows_bound=3000)
    torch.cuda.synchronize()
    assert compiled == []

    @triton.jit
    def control_kernel(x_ptr):
        tl.store(x_ptr, 1.0)

    control_kernel[(1,)](torch.zeros(1, device="cuda"))
    assert len(compiled) == 1 and "control_kernel" in compiled[0]
