"""Builders of test problems (NaN-poisoned caches, strided views, invalid-index menus), their
comparison with the reference, and the markers and skips the GPU tests share."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
import torch
from triton.runtime.errors import OutOfResources

from triton_sparse_mla import configs
from triton_sparse_mla.formats import FP8_ROW_BYTES, quantize_fp8_ds_mla

SM90_ONLY = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="the Gluon kernels run on SM90")

# Invalid row ids the kernels must skip wherever they sit in a row (N is the cache size).
INVALID_MENU = ("-2^31", "-1", "N", "N+7", "2^31-1")


def invalid_value(name: str, n_rows: int) -> int:
    return {"-2^31": -(2**31), "-1": -1, "N": n_rows, "N+7": n_rows + 7, "2^31-1": 2**31 - 1}[name]


@dataclass
class Problem:
    q: object  # tensor [T, H, D] or tuple
    kv: torch.Tensor  # [N, C] strided view
    indices: torch.Tensor  # [T, K] int32 strided view
    topk_length: torch.Tensor | None
    attn_sink: torch.Tensor | None
    sm_scale: float


def make_problem(*, t, h, k, n, fmt="bf16", dtype=torch.bfloat16, d_qk=576, seed=0,
                 invalid_frac=0.1, topk_length=None, sink=False, q_tuple=False,
                 scale_style="amax", rising=False, device="cpu") -> Problem:
    """A seeded problem whose every input is non-contiguous and whose unselected rows are NaN.

    ``topk_length``: None, "partial" (random lengths in [0, K]) or "zero". ``rising``: the rope
    columns of row i are scaled by ``1 + 30 i / N`` and each token's row ids are sorted, so
    scores grow along the top-k axis and a running max rises by more than 8 (base 2) after the
    first tile (rope columns stay bf16 in fp8_ds_mla rows, so the scores stay accurate).
    """
    g = torch.Generator().manual_seed(seed)
    # q is head-major in memory (as vLLM hands it) and padded per token: never contiguous.
    q_store = torch.randn(h, t, d_qk + 64, generator=g)
    q_full = q_store[:, :, :d_qk].transpose(0, 1).to(dtype)
    rows = torch.randn(n, d_qk, generator=g)

    # Indices: random rows (repeats allowed), invalid entries from the menu anywhere.
    idx = torch.randint(0, n, (t, k), generator=g)
    if rising:
        rows[:, 512:] *= 1.0 + 30.0 * torch.arange(n, dtype=torch.float32)[:, None] / n
        idx = idx.sort(dim=1).values
    n_bad = int(invalid_frac * k)
    for ti in range(t):
        pos = torch.randperm(k, generator=g)[:n_bad]
        for j, p in enumerate(pos.tolist()):
            idx[ti, p] = invalid_value(INVALID_MENU[(ti + j) % len(INVALID_MENU)], n)
    lengths = None
    if topk_length == "partial":
        lengths = torch.randint(0, k + 1, (t,), generator=g, dtype=torch.int32)
        lengths[0] = k
    elif topk_length == "zero":
        lengths = torch.zeros(t, dtype=torch.int32)

    # Rows that no counted valid entry selects are poisoned with NaN: a stray read shows.
    counted = (idx >= 0) & (idx < n)
    if lengths is not None:
        counted &= torch.arange(k)[None, :] < lengths[:, None].long()
    used = torch.zeros(n, dtype=torch.bool)
    used[idx[counted]] = True

    if fmt == "fp8_ds_mla":
        packed = quantize_fp8_ds_mla(rows, scale_style=scale_style)
        width, pad_value = FP8_ROW_BYTES, 0xFF
        store = torch.full((n, width + 16), pad_value, dtype=torch.uint8)
        store[:, :width] = packed
        store[~used] = pad_value  # fp8 NaN bytes, NaN scales, NaN rope
    else:
        width = d_qk
        store = torch.full((n, width + 8), float("nan"), dtype=dtype)
        store[:, :width] = rows.to(dtype)
        store[~used] = float("nan")
    kv = store[:, :width]

    idx_store = torch.zeros(t, k + 5, dtype=torch.int32)
    idx_store[:, :k] = idx.to(torch.int32)
    indices = idx_store[:, :k]

    attn_sink = torch.randn(h, generator=g) if sink else None
    q = (q_full[..., :512], q_full[..., 512:]) if q_tuple else q_full
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    q = tuple(to(x) for x in q) if q_tuple else to(q)
    return Problem(q=q, kv=to(kv), indices=to(indices), topk_length=to(lengths),
                   attn_sink=to(attn_sink), sm_scale=1.0 / (d_qk**0.5) * 1.3)


def aligned_rows(kv):
    """The same rows at a row stride that is a multiple of 16 elements, as every cache vLLM
    allocates (make_problem's are not: they catch stride bugs), still not contiguous, the
    padding poisoned. sm90's Gluon kernel takes only such caches (its 16-byte copies)."""
    width = kv.shape[1]
    store = torch.full((kv.shape[0], width + (-width) % 16 + 16),
                       255 if kv.dtype == torch.uint8 else float("nan"), dtype=kv.dtype,
                       device=kv.device)
    store[:, :width] = kv
    return store[:, :width]


# Per row format: the output's relative norm error and the lse's absolute error allowed. The
# lse of bf16/fp16 rows comes from exact products summed in fp32 (under 5e-6 in the interpreter);
# fp8_ds_mla's carries the rounding of q or of the dequantized rows to 16 bits (1e-2 seen in the
# "rising" case).
TOL = {"bf16": 2e-2, "fp16": 2e-2, "fp8_ds_mla": 3e-2}
LSE_ATOL = {"bf16": 1e-3, "fp16": 1e-3, "fp8_ds_mla": 2e-2}


def tol(fmt):
    """assert_close's tolerances for rows of format ``fmt``."""
    return dict(rtol_norm=TOL[fmt], lse_atol=LSE_ATOL[fmt])


def assert_close(out, lse, ref_out, ref_lse, *, rtol_norm, lse_atol=None):
    """Compare with the float64 reference: NaN/inf pattern, lse error (absolute, below
    ``lse_atol``, which a call that passes ``lse`` must give; :func:`tol` has both bounds), then
    norm error, then cosine."""
    out = out.double().cpu()
    assert not torch.isnan(out).any(), "output has NaN"
    if lse is not None:
        assert lse_atol is not None, "an lse to compare needs its bound, lse_atol"
        lse = lse.double().cpu()
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf pattern differs"
        assert not torch.isnan(lse).any(), "lse has NaN"
        fin = torch.isfinite(ref_lse)
        if fin.any():
            err = (lse[fin] - ref_lse[fin]).abs().max().item()
            assert err < lse_atol, f"lse max abs error {err} >= {lse_atol}"
    empty = torch.isneginf(ref_lse)
    assert torch.all(out[empty] == 0), "an empty row must give out = 0"
    denom = ref_out.norm().item()
    if denom == 0:
        assert out.abs().max().item() == 0
        return
    rel = (out - ref_out).norm().item() / denom
    assert rel < rtol_norm, f"relative error {rel} >= {rtol_norm}"
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref_out.flatten(), dim=0).item()
    assert cos > 0.999, f"cosine {cos}"


@contextlib.contextmanager
def beyond_this_gpu_skips(tile, device):
    """Run a launch of a pinned ``tile``: where it needs more shared memory than this GPU has
    and this GPU's family does not ship it, skip instead of failing. The suite also runs
    other families' tiles and experiments sized for SM90's 227 KB; on a 99 KB or 163 KB GPU
    those cannot launch, while its own family's tiles must (tests/test_portability.py checks
    them on every target). On a GPU of the largest budget every tile must fit."""
    try:
        yield
    except OutOfResources as exc:
        family = configs.family_of(torch.cuda.get_device_capability(device))
        own = {t for _, _, t in configs.all_tiles(family)}
        own |= {t.without_gluon() for t in own if t.gluon}
        if tile in own or configs.SMEM_LIMIT[family] >= max(configs.SMEM_LIMIT.values()):
            raise
        pytest.skip(f"a tile {family} does not ship, beyond this GPU's shared memory: {exc}")


def rope_reference(x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                   interleave: bool) -> torch.Tensor:
    """``x [T, ..., D]`` in float64 with its first ``2 half`` values rotated by the cache's rows
    (``[max_pos, 2 half]``: cos, then sin) at ``positions [T]``: pairs of neighbours
    (``interleave``) or ``half`` apart (NeoX), as vLLM's DSA kernels rotate them."""
    rows = cos_sin_cache[positions].double()
    half = rows.shape[-1] // 2
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = rows[:, :half].reshape(shape), rows[:, half:].reshape(shape)
    x = x.double()
    out = x.clone()
    if interleave:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., :half], x[..., half:2 * half]
        out[..., :half], out[..., half:2 * half] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


def indexer_tolerance(device: torch.device) -> float:
    """The indexer's largest error allowed, relative to the largest logit: fp16 products are
    exact and accumulate in fp32 (SM80/86, the interpreter); the fp8 tensor cores' (SM89 and
    newer, :func:`triton_sparse_mla.indexer.fp8_products`) accumulate with fewer bits (relative
    error, norm, at most 1.7e-4 measured on an H200)."""
    from triton_sparse_mla.indexer import fp8_products

    return 1e-3 if fp8_products(device) else 2e-6


class CompiledStandIn:
    """A stand-in for Triton's compiled kernel (tests of kernels/launch.py and replay.py on
    the CPU): its launcher records what it is handed."""

    def __init__(self):
        self.launches = []
        self.function, self.packed_metadata = "function", "metadata"

    def run(self, *args):
        self.launches.append(args)
