"""sparse_mla_attention against the float64 reference, over formats, geometries and options."""

import dataclasses

import pytest
import torch
import triton

from problems import SM90_ONLY, aligned_rows, assert_close, beyond_this_gpu_skips, make_problem, tol
from triton_sparse_mla import quantize_fp8_ds_mla, sparse_mla_attention, sparse_mla_reference
from triton_sparse_mla import api, configs


def case(t, h, k, n, fmt="bf16", dtype=torch.bfloat16, d_qk=576, **kw):
    name = f"T{t}-H{h}-K{k}-{fmt}" + ("" if d_qk == 576 else "-nope") + (
        "-fp16" if dtype == torch.float16 else "") + "".join(f"-{a}" for a, v in kw.items() if v)
    return pytest.param(dict(t=t, h=h, k=k, n=n, fmt=fmt, dtype=dtype, d_qk=d_qk, **kw), id=name)


CASES = [
    case(1, 16, 2048, 4096),
    case(1, 8, 2048, 4096, "fp8_ds_mla"),
    case(1, 128, 64, 200, sink=True),
    case(3, 8, 100, 300, "fp8_ds_mla", topk_length="partial"),
    case(3, 16, 100, 300, "fp8_ds_mla", scale_style="pow2", sink=True),
    case(3, 1, 100, 300, q_tuple=True, topk_length="partial"),
    case(63, 16, 64, 500, topk_length="partial"),
    case(63, 8, 64, 500, "fp8_ds_mla"),
    case(3, 16, 100, 300, "fp16", torch.float16),
    case(3, 16, 100, 300, "fp8_ds_mla", torch.float16),
    case(3, 16, 100, 300, d_qk=512, topk_length="partial"),
    case(3, 8, 100, 300, "fp16", torch.float16, d_qk=512, q_tuple=True),
    case(4, 16, 64, 300, topk_length="zero", sink=True),
    case(2, 16, 64, 300, invalid_frac=1.0),
    case(3, 16, 100, 300, topk_length="partial", rising=True),
    case(3, 64, 100, 300, "fp8_ds_mla", rising=True),
]


def _run_case(p, device, **extra):
    prob = make_problem(device=device, **p)
    out, lse = sparse_mla_attention(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                    topk_length=prob.topk_length, attn_sink=prob.attn_sink,
                                    return_lse=True, **extra)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    return out, lse, ref_out, ref_lse


@pytest.mark.parametrize("p", CASES)
def test_matches_reference(p, device):
    out, lse, ref_out, ref_lse = _run_case(p, device)
    assert out.dtype == p["dtype"] and out.shape == (p["t"], p["h"], 512)
    assert_close(out, lse, ref_out, ref_lse, **tol(p["fmt"]))


def test_out_argument_is_written_and_returned(device):
    prob = make_problem(t=3, h=8, k=64, n=200, device=device, topk_length="partial")
    store = torch.full((3, 8, 600), float("nan"), dtype=torch.bfloat16, device=device)
    out = store[:, :, :512]
    got = sparse_mla_attention(prob.q, prob.kv, prob.indices, prob.sm_scale,
                               topk_length=prob.topk_length, out=out)
    assert got.data_ptr() == out.data_ptr()
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length)
    assert_close(out, None, ref_out, ref_lse, **tol("bf16"))
    assert torch.isnan(store[:, :, 512:].float()).all(), "wrote outside out"


def test_three_dim_cache_and_indices(device):
    prob = make_problem(t=3, h=16, k=64, n=200, fmt="fp8_ds_mla", device=device)
    out = sparse_mla_attention(prob.q, prob.kv[:, None, :], prob.indices[:, None, :], prob.sm_scale)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale)
    assert_close(out, None, ref_out, ref_lse, **tol("fp8_ds_mla"))


SHIPPED = sorted({(kind, tile) for family in configs.CONFIGS
                  for _, kind, tile in configs.all_tiles(family)}, key=str)
# and the Triton tiles the Gluon tiles give way to where Gluon does not run
SHIPPED += sorted({(kind, tile.without_gluon()) for kind, tile in SHIPPED if tile.gluon} - set(SHIPPED), key=str)


@pytest.mark.parametrize("kind, tile", [
    pytest.param(kind, tile, id=f"{kind}-{tile.block_h}x{tile.block_n}-w{tile.num_warps}-s{tile.num_stages}")
    for kind, tile in SHIPPED])
def test_every_shipped_config(kind, tile, device):
    """Each distinct tile of every family's table (as its architecture runs it; on a GPU the
    99 KB and 163 KB tiles run here too), and each Gluon tile's Triton tile (where Gluon does
    not run the launcher takes it for a Gluon tile, as the planner does), matches the
    reference, split and not. (On a GPU with less shared memory than SM90, other families'
    tiles that do not fit it are skipped: problems.beyond_this_gpu_skips.)"""
    _check_tile(kind, tile, device)


@pytest.mark.parametrize("kind", ["plain", "fp8"])
def test_probabilities_through_scratch(kind, device):
    """A 64-head tile whose probabilities reach the PV dots through the per-SM scratch slot
    (``exchange_p``) matches the reference, split and not."""
    _check_tile(kind, configs.TileConfig(64, 64, 8, 2, exchange_p=True, prefetch_idx=False), device)


@pytest.mark.parametrize("kind", ["plain", "fp8"])
def test_scores_apart(kind, device):
    """A 64-head tile whose scores and softmax sit in a region of their own (``scores_apart``:
    the probabilities reach the PV dots through the compiler's shared memory) matches the
    reference, split and not. (At 32 rows: at 64, Triton 3.8 needs more shared memory for the
    bf16 tile than sm90 has.)"""
    _check_tile(kind, configs.TileConfig(64, 32, 8, 3, scores_apart=True), device)


GLUON_CASES = [
    case(3, 80, 200, 500, topk_length="partial", sink=True),  # two head tiles, one partial
    case(2, 128, 300, 700, "fp8_ds_mla", sink=True, q_tuple=True),
    case(3, 64, 100, 300, "fp8_ds_mla", topk_length="partial", rising=True),
    case(3, 64, 100, 300, "fp16", torch.float16, topk_length="partial"),
    case(2, 64, 150, 400, rising=True, invalid_frac=0.5),
    case(2, 64, 64, 300, topk_length="zero", sink=True),  # no step runs: zeros, lse -inf
    case(2, 128, 100, 300, "fp8_ds_mla", invalid_frac=1.0),  # every entry invalid
]


def _check_gluon(p, tile, device, q_gain=1.0, q_pad=0):
    prob = make_problem(device=device, **p)
    if q_gain != 1.0:  # the same scores from a q of another magnitude (either form of q)
        prob.q = tuple(x * q_gain for x in prob.q) if isinstance(prob.q, tuple) else prob.q * q_gain
        prob.sm_scale = prob.sm_scale / q_gain
    if q_pad:  # q's rows apart by 576 + q_pad elements (the same values)
        t, h, d = prob.q.shape
        prob.q = torch.zeros(t, h, d + q_pad, dtype=prob.q.dtype, device=device)[..., :d].copy_(prob.q)
    kv = aligned_rows(prob.kv)
    ref_out, ref_lse = sparse_mla_reference(prob.q, kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    q_nope, q_pe = api._split_query(prob.q)
    t, h = q_nope.shape[:2]
    for splits in (1, 3):
        out = torch.empty(t, h, 512, dtype=p["dtype"], device=device)
        lse = torch.empty(t, h, dtype=torch.float32, device=device)
        plan = configs.LaunchPlan(tile=tile, splits=splits, fp8_cvt=1)
        compiled = api._run(q_nope, q_pe, kv, prob.indices, prob.topk_length, prob.attn_sink,
                            prob.sm_scale, out, lse, family=None, sm_count=1, fp8_cvt=1,
                            fp8=p["fmt"] == "fp8_ds_mla", plan=plan)
        assert "gluon" in compiled.name, compiled.name
        assert_close(out, lse, ref_out, ref_lse, **tol(p["fmt"]))


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("p", GLUON_CASES)
def test_gluon_tile(p, device):
    """sm90's 64-head tile runs the Gluon kernel (bf16/fp16 rows: the alternate-tile kernel,
    kernels/gluon_pingpong.py; fp8_ds_mla rows: kernels/gluon_fp8_producer.py) and matches the
    reference, split and not: several head tiles, lengths, sink, lse, invalid ids, a rising
    max, separate q_nope and q_pe, bf16, fp16 and fp8_ds_mla rows. (Over make_problem's row
    stride, not a multiple of 16, the same tile runs the Triton kernel:
    test_every_shipped_config.)"""
    tile = configs.pick_tile("sm90", t_count=128, h_count=64, fp8=p["fmt"] == "fp8_ds_mla")
    assert tile.gluon and tile.pingpong != (p["fmt"] == "fp8_ds_mla")
    _check_gluon(p, tile, device)


def test_mid_head_counts_take_the_64_head_tile():
    """On sm90, bf16/fp16 rows with 17-32 heads take the 64-head Gluon tile (heads past H
    masked), and where the Gluon kernels do not apply, the 32x64 Triton tile; 16 heads keep
    theirs."""
    for t in (128, 4096):
        for h in (17, 20, 32):
            plan = configs.plan_launch("sm90", 132, 1, t_count=t, h_count=h, topk=2048, fp8=False)
            assert plan.tile.gluon and plan.tile.pingpong and plan.tile.block_h == 64, (t, h, plan)
            assert plan.splits == 1, (t, h, plan)
            bare = configs.plan_launch("sm90", 132, 1, t_count=t, h_count=h, topk=2048, fp8=False,
                                       gluon=False)
            assert (bare.tile.block_h, bare.tile.block_n, bare.tile.gluon) == (32, 64, False), bare
        assert configs.plan_launch("sm90", 132, 1, t_count=t, h_count=16, topk=2048,
                                   fp8=False).tile.block_h == 16


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("h", [20, 32])
def test_gluon_tile_masked_heads(h, device):
    """The 64-head alternate-tile kernel over fewer heads (the table's choice for 17-32): the
    heads past H get zero q rows and no stores, and the result matches the reference."""
    p = case(3, h, 150, 400, topk_length="partial", sink=True).values[0]
    tile = configs.plan_launch("sm90", 132, 1, t_count=128, h_count=h, topk=2048, fp8=False).tile
    assert tile.pingpong and tile.block_h == 64
    _check_gluon(p, tile, device)


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("q_pad", [8, 1])
def test_gluon_tile_q_strides(q_pad, device):
    """The alternate-tile kernel, whose producer copies q 16 bytes at a time, over a q whose
    head stride is not a multiple of 16 elements (584, 577): the launcher gives it a copy with
    standard strides (gluon_sm90._aligned16), and the result matches the reference."""
    p = case(2, 64, 100, 300, topk_length="partial").values[0]
    tile = configs.pick_tile("sm90", t_count=128, h_count=64, fp8=False)
    assert tile.pingpong
    _check_gluon(p, tile, device, q_pad=q_pad)


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("p", [c for c in GLUON_CASES if c.values[0]["fmt"] == "fp8_ds_mla"])
def test_gluon_fp8_operands(p, device):
    """sm90's fp8_ds_mla 64-head tile dequantizes into fp16 operands (``fp8_f16``, q scaled by
    2^-8) and matches the reference also for a q past fp16's range (entries up to about 4e5);
    without ``fp8_f16`` (bf16 operands) it matches too."""
    tile = configs.pick_tile("sm90", t_count=128, h_count=64, fp8=True)
    assert tile.gluon and tile.fp8_f16
    _check_gluon(p, tile, device, q_gain=1e5)
    _check_gluon(p, dataclasses.replace(tile, fp8_f16=False), device)


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("extra", [{"wide_producer": False}, {"wide_producer": True},
                                   {"wide_producer": False, "fp8_f16": False}],
                         ids=["4 warps", "8 warps", "4 warps bf16 operands"])
@pytest.mark.parametrize("p", [c for c in GLUON_CASES if c.values[0]["fmt"] == "fp8_ds_mla"])
def test_gluon_fp8_producer(p, extra, device):
    """The 64-head Gluon tile over fp8_ds_mla rows (kernels/gluon_fp8_producer.py:
    4 or 8 producer warps copy each tile's raw bytes into the operand slot and dequantize them
    there, into fp16 or bf16 operands) matches the reference, split and not, also for a q past
    fp16's range with fp16 operands."""
    tile = dataclasses.replace(configs.pick_tile("sm90", t_count=128, h_count=64, fp8=True),
                               **extra)
    if tile.fp8_f16:
        _check_gluon(p, tile, device, q_gain=1e5)
    _check_gluon(p, tile, device)


NARROW_CASES = [
    case(3, 16, 200, 500, "fp8_ds_mla", topk_length="partial", sink=True),
    case(2, 8, 300, 700, "fp8_ds_mla", q_tuple=True, rising=True),  # half the tile's heads
    case(2, 24, 100, 300, "fp8_ds_mla", invalid_frac=0.5),  # two head tiles, one partial
    case(2, 16, 100, 300, "fp8_ds_mla", topk_length="zero", sink=True),  # no step runs
    case(2, 16, 100, 300, "fp8_ds_mla", invalid_frac=1.0),  # every entry invalid
]


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("block_h,f16,extra", [
    (8, True, {}), (16, True, {}), (16, False, {}), (32, True, {}), (16, True, {"wide_producer": True}),
    (32, True, {"wide_producer": True}), (32, False, {"wide_producer": True})],
    ids=["8 heads", "16 heads", "16 heads bf16 operands", "32 heads", "16 heads 8 producer warps", "32 heads 8 producer warps",
         "32 heads 8 producer warps bf16 operands"])
@pytest.mark.parametrize("p", NARROW_CASES)
def test_gluon_narrow(p, block_h, f16, extra, device):
    """The few-head Gluon tile over fp8_ds_mla rows (kernels/gluon_narrow.py: rows along the
    wgmma's M, heads along N, the rows gathered and dequantized by the 4 or 8 producer warps of
    kernels/gluon_fp8_producer.py) matches the reference, split and not, into fp16 operands
    (also for a q past fp16's range) and bf16 ones."""
    tile = configs.TileConfig(block_h, 64, 4, 2, gluon=True, fp8_f16=f16, **extra)
    if f16:
        _check_gluon(p, tile, device, q_gain=1e5)
    _check_gluon(p, tile, device)


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("block_h", [8, 16])
@pytest.mark.parametrize("p", NARROW_CASES)
def test_gluon_fp8_regs(p, block_h, device):
    """The few-head Gluon tile whose dots read the raw e4m3 bytes (kernels/gluon_fp8_regs.py:
    the score dots as e4m3 wgmmas on the raw tiles in shared memory against q in two e4m3 parts
    per head, the PV dots from the bytes converted into register operands through a permuted
    view, the output's columns in the same order, scales on the score chains and the
    probabilities) matches the reference, split and not, also for a q past fp16's range and for
    one 1e-30 times as large (q's power-of-two scale into e4m3 about 2^106)."""
    tile = configs.TileConfig(block_h, 64, 4, 2, gluon=True, fp8_f16=True, fp8_regs=True)
    _check_gluon(p, tile, device, q_gain=1e5)
    _check_gluon(p, tile, device, q_gain=1e-30)
    _check_gluon(p, tile, device)


NARROW_PLAIN_CASES = [
    case(3, 16, 200, 500, topk_length="partial", sink=True),
    case(2, 8, 300, 700, q_tuple=True, rising=True),
    case(2, 5, 100, 300, invalid_frac=0.5),  # fewer heads than the tile
    case(2, 24, 100, 300, "fp16", torch.float16, topk_length="partial"),  # two head tiles, one partial
    case(2, 16, 100, 300, topk_length="zero", sink=True),  # no step runs
    case(2, 16, 100, 300, invalid_frac=1.0),  # every entry invalid
]


@pytest.mark.gpu
@SM90_ONLY
@pytest.mark.parametrize("block_h", [8, 16])
@pytest.mark.parametrize("p", NARROW_PLAIN_CASES)
def test_gluon_narrow_plain(p, block_h, device):
    """The few-head Gluon tile over bf16 and fp16 rows (kernels/gluon_narrow_plain.py: the
    consumers of kernels/gluon_narrow.py, rows copied by the plain rows' producer warps) matches
    the reference, split and not."""
    _check_gluon(p, configs.TileConfig(block_h, 64, 4, 2, gluon=True), device)


def test_gluon_runs_where_it_applies(device, monkeypatch):
    """The Gluon kernel is chosen only for tiles that name it, a 576-column q, bf16 with fp8
    rows, and a cache aligned for its copies; never under the interpreter, nor with
    TRITON_SPARSE_MLA_GLUON=0."""
    from triton_sparse_mla.kernels.attention import gluon_applies, gluon_kernels

    interpret = device.type == "cpu"
    tile = configs.TileConfig(64, 64, 8, 2, exchange_p=True, gluon=True)
    q = torch.zeros(2, 64, 576, dtype=torch.bfloat16, device=device)[..., :512]
    kv = torch.zeros(10, 576, dtype=torch.bfloat16, device=device)
    kv8 = torch.zeros(10, 656, dtype=torch.uint8, device=device)
    sm90 = device.type == "cuda" and torch.cuda.get_device_capability()[0] == 9
    assert (gluon_kernels(tile, q, kv, 64, False, interpret) is not None) == sm90
    assert (gluon_kernels(tile, q, kv8, 64, True, interpret) is not None) == sm90
    assert gluon_kernels(dataclasses.replace(tile, gluon=False), q, kv, 64, False, interpret) is None
    # (the refusals with interpret=False, so that they are checked on a CPU too: each is decided
    # before the device's capability is asked)
    assert gluon_kernels(tile, q, kv[:, :512], 0, False, False) is None  # NoPE
    assert gluon_kernels(tile, q.half(), kv8, 64, True, False) is None  # fp16 q, fp8 rows
    wide = torch.zeros(10, 584, dtype=torch.bfloat16, device=device)[:, :576]
    assert gluon_kernels(tile, q, wide, 64, False, False) is None  # row stride 584
    narrow = configs.TileConfig(16, 64, 4, 2, gluon=True)  # either row format
    assert (gluon_kernels(narrow, q, kv8, 64, True, interpret) is not None) == sm90
    assert (gluon_kernels(narrow, q, kv, 64, False, interpret) is not None) == sm90
    with pytest.raises(ValueError, match="gluon.*64 heads x 64 rows.*got 32 x 64"):
        configs.TileConfig(32, 64, 8, 2, gluon=True)
    with pytest.raises(ValueError, match="gluon.*16 or 32 heads.*got 16 x 32 with 4"):
        configs.TileConfig(16, 32, 4, 2, gluon=True)
    # the few-head Gluon tile for 16 heads (the planner never cuts a Gluon tile's heads), in
    # decode the one with fp8_regs, split for one program per SM though two fit (one split at
    # T=128, four at T=32)
    for t, splits in ((128, 1), (32, 4)):
        plan = configs.plan_launch("sm90", 132, 1, t_count=t, h_count=16, topk=2048, fp8=True)
        assert plan.tile.gluon and plan.tile.fp8_regs and plan.splits == splits, plan
        assert configs.programs_per_sm("sm90", plan.tile) == 2
    # where the Gluon kernels do not apply, the planner takes each Gluon tile's Triton tile: the
    # few-head ones' fallback (the Triton tiles they replaced, two programs per SM), the 64-head
    # ones' own shape without Gluon (fp8 operands as the Triton kernel ran them)
    assert gluon_applies(q, kv8, 64, True, interpret) == sm90
    assert not gluon_applies(q.half(), kv8, 64, True, False)
    monkeypatch.setenv("TRITON_SPARSE_MLA_GLUON", "0")
    assert gluon_kernels(tile, q, kv, 64, False, False) is None
    assert not gluon_applies(q, kv8, 64, True, False)
    for h, shape in ((8, (16, 32, 3)), (16, (16, 32, 3)), (32, (32, 32, 2))):
        plan = configs.plan_launch("sm90", 132, 1, t_count=128, h_count=h, topk=2048, fp8=True,
                                   gluon=False)
        assert not plan.tile.gluon and plan.tile.fp8_f16, plan
        assert (plan.tile.block_h, plan.tile.block_n, plan.tile.num_stages) == shape, plan
        assert configs.programs_per_sm("sm90", plan.tile) == 2 and plan.splits == 2, plan
    tile64 = configs.plan_launch("sm90", 132, 1, t_count=128, h_count=64, topk=2048, fp8=True,
                                 gluon=False).tile
    assert not tile64.gluon and tile64.exchange_p and not tile64.fp8_f16 and tile64.block_h == 64
    with pytest.raises(ValueError, match="fallback: a Triton tile"):
        configs.TileConfig(16, 32, 4, 2, fallback=configs.TileConfig(16, 32, 4, 3))
    for name in ("wide_producer", "pingpong", "fp8_regs"):
        with pytest.raises(ValueError, match=f"{name}: only the Gluon kernels read it"):
            configs.TileConfig(16, 64, 4, 2, **{name: True})
    with pytest.raises(ValueError, match="pingpong.*wide_producer"):
        configs.TileConfig(64, 64, 8, 2, gluon=True, pingpong=True, wide_producer=True)
    with pytest.raises(ValueError, match="fp8_regs: the kernel has tiles of 8 or 16 heads, got 32"):
        configs.TileConfig(32, 64, 4, 2, gluon=True, fp8_regs=True)
    with pytest.raises(ValueError, match="fp8_regs: the kernel's producer has 4 warps"):
        configs.TileConfig(16, 64, 4, 2, gluon=True, fp8_regs=True, wide_producer=True)


def test_a_call_asks_once_whether_gluon_applies(device, monkeypatch):
    """A call planned by the library decides once whether the Gluon kernels apply (while
    planning; the launch trusts that plan), and still gives the reference's output; a plan
    handed in from outside is checked at the launch."""
    from triton_sparse_mla.kernels import attention

    asked, applies = [], attention.gluon_applies

    def counted(*args):
        asked.append(args[2:])
        return applies(*args)

    monkeypatch.setattr(api, "gluon_applies", counted)
    monkeypatch.setattr(attention, "gluon_applies", counted)
    prob = make_problem(t=2, h=16, k=64, n=100, device=device)
    kv = aligned_rows(prob.kv)
    out = sparse_mla_attention(prob.q, kv, prob.indices, prob.sm_scale)
    assert len(asked) == 1, asked
    ref_out, ref_lse = sparse_mla_reference(prob.q, kv, prob.indices, prob.sm_scale)
    assert_close(out, None, ref_out, ref_lse, **tol("bf16"))
    # a pinned plan (as the tests and the sweep pass): asked at the launch only if its tile
    # names the Gluon kernels
    asked.clear()
    q_nope, q_pe = api._split_query(prob.q)
    for tile in (configs.TileConfig(16, 32, 4, 3), configs.TileConfig(16, 64, 4, 2, gluon=True)):
        api._run(q_nope, q_pe, kv, prob.indices, None, None, prob.sm_scale, torch.empty_like(out), None,
                 family=None, sm_count=1, fp8_cvt=1, fp8=False,
                 plan=configs.LaunchPlan(tile=tile, splits=1, fp8_cvt=1))
    assert len(asked) == 1, asked


def test_gluon_only_on_its_triton_versions(monkeypatch):
    """The Gluon kernels run only with the Triton versions whose Gluon calls they use
    (kernels.attention.GLUON_TRITON: 3.6 to 3.9, the versions they ran on; 3.9 renamed two of
    the calls): with any other, the module is not imported and the planner takes the Triton
    tiles."""
    from triton_sparse_mla.kernels import attention

    for version, ok in (("3.5.1", False), ("3.6.0", True), ("3.8.0", True), ("3.9.0", True),
                        ("3.10.0", False), ("4.0.0", False)):
        monkeypatch.setattr(attention.triton, "__version__", version)
        assert attention.gluon_triton() == ok, version
    attention.gluon_module.cache_clear()
    try:
        assert attention.gluon_module() is None
    finally:
        monkeypatch.undo()
        attention.gluon_module.cache_clear()


def test_exchange_tile_must_own_its_sm(device):
    """The scratch slot is per SM, so a tile too small to own its SM is refused by name."""
    prob = make_problem(t=2, h=32, k=64, n=200, device=device)
    q_nope, q_pe = api._split_query(prob.q)
    out = torch.empty(2, 32, 512, dtype=torch.bfloat16, device=device)
    plan = configs.LaunchPlan(tile=configs.TileConfig(32, 32, 4, 2, exchange_p=True), splits=1,
                              fp8_cvt=0)
    with pytest.raises(ValueError, match="exchange_p.*block_h=32"):
        api._run(q_nope, q_pe, prob.kv, prob.indices, None, None, prob.sm_scale, out, None,
                 family=None, sm_count=1, fp8_cvt=0, fp8=False, plan=plan)


@pytest.mark.parametrize("kind", ["plain", "fp8"])
@pytest.mark.parametrize("prefetch", [False, True])
def test_row_ids_loaded_a_step_ahead_or_not(kind, prefetch, device):
    """A 3-stage tile with and without loading the next tile's row ids a step ahead
    (``prefetch_idx``) matches the reference, split and not: slices that end inside a tile
    (lengths) and at its edge (split boundaries)."""
    _check_tile(kind, configs.TileConfig(16, 32, 4, 3, prefetch_idx=prefetch), device)


@pytest.mark.parametrize("tile", [configs.TileConfig(16, 32, 4, 2, fp8_f16=True),
                                  configs.TileConfig(64, 64, 8, 2, exchange_p=True, fp8_f16=True)],
                         ids=["16x32", "64x64-exchange"])
def test_fp8_rows_into_fp16_operands(tile, device):
    """fp8_ds_mla rows dequantized into fp16 operands (``fp8_f16``) match the reference, also
    for a q past fp16's range (entries up to about 4e5, with the scale divided to match): the
    launcher scales a bf16 q by 2^-8 on its way to fp16."""
    _check_tile("fp8", tile, device)
    _check_tile("fp8", tile, device, q_gain=1e5)


@pytest.mark.parametrize("tile", [configs.TileConfig(16, 32, 4, 1, fp8_f16=True, rows_ahead=True),
                                  configs.TileConfig(16, 32, 4, 2, rows_ahead=True),
                                  configs.TileConfig(16, 32, 4, 2, rows_ahead=True, rows_early=True),
                                  configs.TileConfig(64, 64, 8, 2, exchange_p=True, rows_ahead=True)],
                         ids=["16x32-f16", "16x32-bf16", "16x32-early", "64x64-exchange"])
def test_fp8_rows_loaded_a_step_ahead(tile, device):
    """fp8_ds_mla rows loaded into registers a step ahead (``rows_ahead``, the loads after the
    scores or before them with ``rows_early``) match the reference, split and not, with fp16
    and bf16 operands; bf16 rows, for which the fields are ignored, still do."""
    _check_tile("fp8", tile, device)
    _check_tile("fp8", tile, device, q_gain=1e5)
    _check_tile("plain", tile, device)


def _check_tile(kind, tile, device, q_gain=1.0):
    fmt = "fp8_ds_mla" if kind == "fp8" else "bf16"
    prob = make_problem(t=3, h=20, k=100, n=300, fmt=fmt, device=device, topk_length="partial",
                        sink=True)
    if q_gain != 1.0:  # the same scores from a q of another magnitude
        prob.q, prob.sm_scale = prob.q * q_gain, prob.sm_scale / q_gain
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length, attn_sink=prob.attn_sink)
    q_nope, q_pe = api._split_query(prob.q)
    fp8_cvt = (configs.fp8_cvt_level(torch.cuda.get_device_capability(device))
               if device.type == "cuda" else 0)
    for splits in (1, 3):
        out = torch.empty(3, 20, 512, dtype=torch.bfloat16, device=device)
        lse = torch.empty(3, 20, dtype=torch.float32, device=device)
        plan = configs.LaunchPlan(tile=tile, splits=splits, fp8_cvt=fp8_cvt)
        with beyond_this_gpu_skips(tile, device):
            api._run(q_nope, q_pe, prob.kv, prob.indices, prob.topk_length, prob.attn_sink,
                     prob.sm_scale, out, lse, family=None, sm_count=1, fp8_cvt=fp8_cvt,
                     fp8=fmt == "fp8_ds_mla", plan=plan)
        assert_close(out, lse, ref_out, ref_lse, **tol(fmt))


@pytest.mark.parametrize("splits", [1, 3])
def test_fp8_row_past_fp16_range_never_reads_as_empty(splits, device):
    """A row holding a value past fp16's range (a valid fp8_ds_mla row: its scales are fp32)
    overflows the tiles that dequantize into fp16 (``fp8_f16``): every head of the token that
    reads it gets non-finite output, and no head an lse of -inf, which says "no valid entry"
    (the kernels once tested l > 0, false for a NaN l); the other token matches the reference."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(64, 576, generator=g)
    rows[5, 0] = 7e4
    kv = quantize_fp8_ds_mla(rows).to(device)
    q = (torch.randn(2, 16, 576, generator=g) * 1e-3).bfloat16().to(device)
    idx = torch.randint(6, 64, (2, 32), generator=g, dtype=torch.int32)
    idx[0, 0] = 5
    idx = idx.to(device)
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, 0.05)
    fp8_cvt = (configs.fp8_cvt_level(torch.cuda.get_device_capability(device))
               if device.type == "cuda" else 0)
    plan = configs.LaunchPlan(tile=configs.TileConfig(16, 32, 4, 2, fp8_f16=True), splits=splits,
                              fp8_cvt=fp8_cvt)
    out = torch.empty(2, 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 16, dtype=torch.float32, device=device)
    q_nope, q_pe = api._split_query(q)
    api._run(q_nope, q_pe, kv, idx, None, None, 0.05, out, lse, family=None, sm_count=1,
             fp8_cvt=fp8_cvt, fp8=True, plan=plan)
    assert torch.isfinite(ref_lse).all()
    assert not out[0].isfinite().all(dim=-1).any(), "a head of token 0 came out finite"
    assert not lse[0].isneginf().any(), "token 0 read as having no valid entry"
    assert_close(out[1:], lse[1:], ref_out[1:], ref_lse[1:], **tol("fp8_ds_mla"))


def test_plan_depends_on_shapes_only():
    """Launch plans cover every head count and phase, and stay within the tiles' rules."""
    for family in configs.CONFIGS:
        for t in (1, 8, 9, 512, 513, 4096):
            for h in (1, 8, 16, 20, 32, 64, 128):
                for fp8 in (False, True):
                    plan = configs.plan_launch(family, 132, True, t_count=t, h_count=h, topk=2048, fp8=fp8)
                    # (a Gluon tile keeps its 64 heads: sm90's 64-head tile for 17-32 heads; the
                    # few-head Gluon tiles go down to 8, the wgmma's smallest N)
                    low = 8 if plan.tile.gluon else 16
                    assert low <= plan.tile.block_h <= max(low, triton.next_power_of_2(h)) or (
                        plan.tile.gluon and plan.tile.block_h == 64), (family, t, h, fp8, plan)
                    phase = configs.phase_of(family, t, h)
                    per_sm, min_tiles = configs.split_rule(family, phase, plan.tile)
                    # the latency phase splits for one program per SM, down to one tile a
                    # split; a tile with fp8_regs for one program per SM in every phase
                    assert (per_sm, min_tiles) == ((1, 1) if phase == "latency" else (
                        1 if plan.tile.fp8_regs else configs.programs_per_sm(family, plan.tile),
                        configs.MIN_TILES_PER_SPLIT))
                    most = 2048 // (plan.tile.block_n * min_tiles)
                    assert 1 <= plan.splits <= most
                    programs = t * -(-h // plan.tile.block_h)
                    wave = per_sm * 132
                    if plan.splits > 1:  # splitting never starts a second wave...
                        assert programs * plan.splits <= wave
                    if most >= 2 and 2 * programs <= wave:  # ...and is used where it fits
                        assert plan.splits >= 2


def test_latency_phase_ends_at_token_heads_on_sm90():
    """On sm90 a few tokens with many heads leave the 16-head latency tiles for the decode
    table's 64-head tile once T x H passes the family's limit; other families keep T <= 8."""
    limit = configs.LATENCY_MAX_TOKEN_HEADS["sm90"]
    for t, h in ((1, 128), (4, 32), (3, 64), (4, 64), (2, 128), (8, 128)):
        tile = configs.pick_tile("sm90", t_count=t, h_count=h, fp8=True)
        assert (tile.block_h == 64) == (t * h > limit), (t, h, tile)
        assert configs.pick_tile("sm86", t_count=t, h_count=h, fp8=True).block_h == 16, (t, h)


@pytest.mark.gpu
def test_split_rule_counts_resident_programs():
    """On the GPU at hand, every tile of its family's table keeps as many programs resident per
    SM as ``configs.programs_per_sm`` counts (from the compiled kernel's registers, shared
    memory and warps), so the split rule fills one wave and no more."""
    dev = torch.device("cuda")
    cap = torch.cuda.get_device_capability(dev)
    cap_key = cap[0] * 10 + cap[1]
    if cap_key not in configs.SMEM_PER_SM_KB:
        pytest.skip(f"shared memory per SM of sm{cap_key} not tabulated")
    family, fp8_cvt = configs.family_of(cap), configs.fp8_cvt_level(cap)
    if family not in ("sm90", "sm86"):
        pytest.skip(f"{family}: its split rule borrows sm90's count, not measured there (configs.py)")
    max_threads = torch.cuda.get_device_properties(dev).max_threads_per_multi_processor
    for phase, kind, tile in configs.all_tiles(family):
        fp8 = kind == "fp8"
        prob = make_problem(t=3, h=tile.block_h, k=100, n=300, fmt="fp8_ds_mla" if fp8 else "bf16",
                            device=dev)
        q_nope, q_pe = api._split_query(prob.q)
        out = torch.empty(3, tile.block_h, 512, dtype=torch.bfloat16, device=dev)
        plan = configs.LaunchPlan(tile=tile, splits=3, fp8_cvt=fp8_cvt,
                                  pin_conversion=configs.pin_fp8_conversion(family, tile.block_h))
        k = api._run(q_nope, q_pe, prob.kv, prob.indices, None, None, prob.sm_scale, out, None,
                     family=family, sm_count=1, fp8_cvt=fp8_cvt, fp8=fp8, plan=plan)
        threads = 32 * k.metadata.num_warps  # (a Gluon kernel's: every partition's warps)
        by_regs = 65536 // (-(-k.n_regs // 8) * 8 * threads)  # registers go out 8 per thread
        by_smem = configs.fit_by_shared_memory(k.metadata.shared, cap_key)
        resident = min(by_regs, by_smem, max_threads // threads)
        assert resident == configs.programs_per_sm(family, tile), (
            phase, kind, tile, k.n_regs, k.metadata.shared)


def test_empty_topk_and_no_tokens(device):
    prob = make_problem(t=2, h=8, k=16, n=50, device=device)
    out, lse = sparse_mla_attention(prob.q, prob.kv, prob.indices[:, :0], 0.1, return_lse=True)
    assert torch.all(out == 0) and torch.isneginf(lse).all()
    q0 = prob.q[:0]
    out0 = sparse_mla_attention(q0, prob.kv, prob.indices[:0], 0.1)
    assert out0.shape == (0, 8, 512)


@pytest.mark.parametrize("tile", [configs.TileConfig(16, 32, 4, 2),
                                  configs.TileConfig(16, 32, 4, 2, fp8_f16=True, rows_ahead=True)],
                         ids=["staged", "rows-ahead"])
@pytest.mark.parametrize("level", [0, 1], ids=["int-decode", "cvt-f32"])
def test_fp8_conversion_paths(level, tile, device):
    """Each way of turning e4m3 bytes into fp32 (SM80/86; SM89 and newer) matches the
    reference, for bytes staged in shared memory and for rows held as words in registers
    (``rows_ahead``: the SM86 family's tile); on an SM89+ GPU both run, so the older
    architectures' path is exercised."""
    if level > 0 and (device.type != "cuda" or configs.fp8_cvt_level(torch.cuda.get_device_capability(device)) < level):
        pytest.skip("this conversion needs a newer GPU")
    prob = make_problem(t=3, h=16, k=100, n=300, fmt="fp8_ds_mla", device=device, topk_length="partial")
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length)
    q_nope, q_pe = api._split_query(prob.q)
    out = torch.empty(3, 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(3, 16, dtype=torch.float32, device=device)
    plan = configs.LaunchPlan(tile=tile, splits=2, fp8_cvt=level)
    api._run(q_nope, q_pe, prob.kv, prob.indices, prob.topk_length, None, prob.sm_scale, out, lse,
             family=None, sm_count=1, fp8_cvt=level, fp8=True, plan=plan)
    assert_close(out, lse, ref_out, ref_lse, **tol("fp8_ds_mla"))


def test_fp8_power_of_two_scales_dequantize_exactly(device):
    """fp8 tiles are dequantized at load into bf16. With power-of-two scales every product is
    exact in bf16, so the LSE matches float64 as closely as with a bf16 cache (about 5e-7);
    ``amax / 448`` scales would round each value once and show at the 1e-3 level."""
    prob = make_problem(t=3, h=16, k=200, n=400, fmt="fp8_ds_mla", scale_style="pow2", device=device)
    out, lse = sparse_mla_attention(prob.q, prob.kv, prob.indices, prob.sm_scale, return_lse=True)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale)
    assert_close(out, lse, ref_out, ref_lse, **tol("fp8_ds_mla"))
    fin = torch.isfinite(ref_lse)
    assert (lse.double().cpu()[fin] - ref_lse[fin]).abs().max().item() < 1e-4
