"""Compile, before serving, every kernel variant that a kind of call can take.

Triton compiles a kernel the first time it meets a new specialization: a new tile, the split
(partial-output) variant, the fp8 workspace's kernels. Left to itself that happens in the
middle of serving, on the first long prefill or the first batch that takes a new split count,
and stalls it for seconds (a stall other sparse-MLA stacks shipped). Which variant a
call takes follows from its shapes alone (``configs.plan_launch``: tokens, heads, top-k, row
format, device), so the variants of a kind of call are known in advance. :func:`warmup` runs
one small call per variant on a small cache; after it, calls of that kind with any token count
up to ``max_tokens`` compile nothing (tests/test_warmup.py checks it on a GPU).

Compiled kernels also land in Triton's on-disk cache, so a later process loads them in
milliseconds; the warm-up then costs about the calls themselves.
"""

from __future__ import annotations

import torch

from . import configs, workspace
from .api import sparse_mla_attention
from .formats import D_NOPE, D_ROPE, FP8_ROW_BYTES
from .kernels.attention import gluon_applies, split_layout
from .kernels.combine import combine_block

# Rows of the cache the warm-up calls read (a multiple of 16, like every real cache vLLM
# allocates: Triton specializes integer arguments on divisibility by 16).
_ROWS = 256


def variant_token_counts(num_heads: int, *, fp8: bool, bf16_query: bool, topk: int,
                         max_tokens: int, family: str, sm_count: int, fp8_cvt: int,
                         gluon: bool = True, gluon_workspace: bool = True):
    """One ``(T, fp8_workspace)`` per kernel variant that calls with 1 to ``max_tokens`` query
    tokens can take, the smallest such T; ``fp8_workspace`` as the warm-up call passes it.

    A variant is a tile with or without the split (partial-output) path and, with it, the
    combine kernel's block for the split count (:func:`variant`); for fp8_ds_mla rows in the
    kernel or, from ``workspace.MIN_TOKENS`` tokens with a bf16 query, through the workspace
    (which calls may or may not take, depending on their indices: both are listed).
    ``gluon`` and ``gluon_workspace``: whether the Gluon kernels apply to the calls' own rows
    and to the workspace's bf16 rows (kernels.attention.gluon_applies).
    """
    first = {}
    for t in range(1, max_tokens + 1):
        plan = configs.plan_launch(family, sm_count, fp8_cvt, t_count=t, h_count=num_heads,
                                   topk=topk, fp8=fp8, gluon=gluon)
        first.setdefault((fp8, *variant(plan, topk)), (t, False if fp8 else None))
        if fp8 and bf16_query and t >= workspace.MIN_TOKENS:
            plan = configs.plan_launch(family, sm_count, fp8_cvt, t_count=t, h_count=num_heads,
                                       topk=topk, fp8=False, gluon=gluon_workspace)
            first.setdefault(("workspace", *variant(plan, topk)), (t, True))
    return sorted(set(first.values()), key=lambda v: (v[0], v[1] is True))


def variant(plan: configs.LaunchPlan, topk: int) -> tuple:
    """What of a launch plan selects compiled kernels: the tile, and for split calls the
    combine kernel's block for the split count launched (the other split-dependent arguments
    are not specialized)."""
    splits = split_layout(topk, plan.splits, plan.tile.block_n)[1]
    return plan.tile, combine_block(splits) if splits > 1 else 0


def warmup(num_heads: int, *, q_dtype: torch.dtype = torch.bfloat16, kv_format: str = "bf16",
           d_qk: int = D_NOPE + D_ROPE, topk: int = 2048, max_tokens: int = 16384,
           topk_length: bool = True, return_lse: bool = False, attn_sink: bool = False,
           device=None) -> list[tuple[int, bool | None]]:
    """Compile every kernel variant that :func:`triton_sparse_mla.sparse_mla_attention` calls
    of one kind can take, by running one small call per variant.

    The kind is what the calls share: ``num_heads``; ``q_dtype`` (torch.bfloat16 or
    torch.float16); ``kv_format`` ("bf16", "fp16" or "fp8_ds_mla"); ``d_qk`` (576, or 512 for
    NoPE rows; fp8_ds_mla rows always carry the rope part); ``topk`` (K, the indices' second
    dimension); whether they pass ``topk_length``, ``return_lse=True`` and an ``attn_sink``.
    ``max_tokens``: the most query tokens a call will have. ``device``: a CUDA device (default:
    the current one).

    Returns the ``(T, fp8_workspace)`` of the calls it ran. On a CPU (the interpreter compiles
    nothing) it runs none and returns ``[]``. Takes a few seconds per variant the first time in
    a process with an empty Triton cache.
    """
    if kv_format not in ("bf16", "fp16", "fp8_ds_mla"):
        raise ValueError(f"kv_format: expected 'bf16', 'fp16' or 'fp8_ds_mla', got {kv_format!r}")
    if q_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"q_dtype: expected torch.bfloat16 or torch.float16, got {q_dtype}")
    if d_qk not in (D_NOPE, D_NOPE + D_ROPE):
        raise ValueError(f"d_qk: expected {D_NOPE + D_ROPE} or {D_NOPE}, got {d_qk}")
    fp8 = kv_format == "fp8_ds_mla"
    if fp8 and d_qk != D_NOPE + D_ROPE:
        raise ValueError(f"d_qk: fp8_ds_mla rows carry the rope part, so q has {D_NOPE + D_ROPE} "
                         f"columns (zeros for NoPE models), got {d_qk}")
    for name, value in (("num_heads", num_heads), ("topk", topk), ("max_tokens", max_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda" or not torch.cuda.is_available():
        return []
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    family, sm_count, fp8_cvt = configs.device_traits(index)
    if fp8:
        kv = torch.zeros(_ROWS, FP8_ROW_BYTES, dtype=torch.uint8, device=device)
    else:
        kv = torch.zeros(_ROWS, d_qk, dtype=torch.bfloat16 if kv_format == "bf16" else torch.float16,
                         device=device)
    # (the plans of the calls below, as _run makes them: over this cache, or the workspace's)
    q_nope = torch.zeros(1, num_heads, D_NOPE, dtype=q_dtype, device=device)
    ws_rows = torch.zeros(1, D_NOPE + D_ROPE, dtype=torch.bfloat16, device=device)
    calls = variant_token_counts(num_heads, fp8=fp8, bf16_query=q_dtype == torch.bfloat16,
                                 topk=topk, max_tokens=max_tokens, family=family,
                                 sm_count=sm_count, fp8_cvt=fp8_cvt,
                                 gluon=gluon_applies(q_nope, kv, d_qk - D_NOPE, fp8, False),
                                 gluon_workspace=gluon_applies(q_nope, ws_rows, D_ROPE, False, False))
    sink = torch.zeros(num_heads, dtype=torch.float32, device=device) if attn_sink else None
    for t, use_workspace in calls:
        q = torch.zeros(t, num_heads, d_qk, dtype=q_dtype, device=device)
        indices = (torch.arange(t * topk, device=device, dtype=torch.int32) % _ROWS).view(t, topk)
        lengths = torch.full((t,), topk, dtype=torch.int32, device=device) if topk_length else None
        sparse_mla_attention(q, kv, indices, 1.0, topk_length=lengths, attn_sink=sink,
                             return_lse=return_lse, fp8_workspace=use_workspace)
        if use_workspace:
            # Over this small cache the workspace keeps the rows at their ids; one token's
            # entries are too few for that, so its build finds the rows, as a call over a large
            # cache does: the kernels of that path compile here too.
            workspace.build(kv, indices[:1], None if lengths is None else lengths[:1], fp8_cvt,
                            force=True)
        del q, indices, lengths
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return calls
