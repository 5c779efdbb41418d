"""Public entry point: :func:`sparse_mla_attention`."""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from . import configs, replay, workspace
from .boundary import check_tensor, device_traits
from .formats import D_NOPE, D_ROPE, D_V, row_format
from .kernels.attention import gluon_applies, launch_sparse_mla_fwd
from .kernels.common import INTERPRETED

_Q_DTYPES = (torch.bfloat16, torch.float16)
# The largest softmax scale accepted: times log2(e) and 2^8 (an fp16 operand's q scale divided
# out) it stays far inside fp32.
SM_SCALE_MAX = 2.0 ** 64


def _split_query(q):
    """Return ``(q_nope [T, H, 512], q_pe [T, H, D_PE] or None)`` as views of ``q``."""
    if isinstance(q, (tuple, list)):
        if len(q) != 2:
            raise ValueError(f"q: expected a tensor or a tuple (q_nope, q_pe), got {len(q)} items")
        q_nope, q_pe = q
        check_tensor("q[0] (q_nope)", q_nope, dtypes=_Q_DTYPES, rank=3)
        if q_nope.shape[2] != D_NOPE:
            raise ValueError(f"q[0] (q_nope): expected last dimension {D_NOPE}, got {q_nope.shape[2]}")
        if q_pe is None:
            return q_nope, None
        check_tensor("q[1] (q_pe)", q_pe, dtype=q_nope.dtype, rank=3, device=q_nope.device)
        if q_pe.shape[2] not in (D_ROPE, 0):
            raise ValueError(f"q[1] (q_pe): expected last dimension {D_ROPE} (0 for a NoPE query), "
                             f"got {q_pe.shape[2]}")
        if q_pe.shape[:2] != q_nope.shape[:2]:
            raise ValueError(
                f"q[1] (q_pe): expected shape [T, H] = {list(q_nope.shape[:2])} like q_nope, "
                f"got {list(q_pe.shape[:2])}"
            )
        return q_nope, (q_pe if q_pe.shape[2] else None)
    check_tensor("q", q, dtypes=_Q_DTYPES, rank=3)
    if q.shape[2] not in (D_NOPE + D_ROPE, D_NOPE):
        raise ValueError(f"q: expected last dimension {D_NOPE + D_ROPE} or {D_NOPE}, got {q.shape[2]}")
    if q.shape[2] == D_NOPE:
        return q, None
    return q[..., :D_NOPE], q[..., D_NOPE:]


def sparse_mla_attention(q, kv, indices, sm_scale, *, topk_length=None, attn_sink=None,
                         out=None, return_lse=False, fp8_workspace=None, rows_bound=None,
                         entries_bound=None):
    """Sparse Multi-head Latent Attention over gathered cache rows.

    For every query token ``t`` and head ``h``, attend to the cache rows named by
    ``indices[t]`` (``K`` of them at most) with scores ``sm_scale * q[t, h] . kv[i]`` and
    values ``kv[i, :512]``. :mod:`triton_sparse_mla.reference` is the exact specification.

    Args:
        q: ``[T, H, D_QK]`` or a tuple ``(q_nope [T, H, 512], q_pe [T, H, D_QK - 512])``;
            bf16 or fp16; any strides with unit stride in the last dimension. ``D_QK`` is 576
            (512 latent + 64 rope) or 512 (NoPE models, whose tuple's ``q_pe`` may also be
            None).
        kv: the cache as flat rows ``[N, C]`` (or ``[N, 1, C]``), any row stride, unit last
            stride. Either q's dtype with ``C = D_QK``, or uint8 with ``C = 656`` (fp8_ds_mla,
            requires ``D_QK = 576``). Never copied.
        indices: int32 ``[T, K]`` (or ``[T, 1, K]``) row ids into ``kv``. An entry ``< 0`` or
            ``>= N`` is invalid wherever it sits: it contributes nothing and is never read.
        sm_scale: softmax scale, a float (not a bool) of magnitude at most 2**64 (the
            kernels fold it, times log2(e) and up to 2^8, into an fp32 factor).
        topk_length: optional int32 ``[T]``: only ``indices[t, :topk_length[t]]`` count.
        attn_sink: optional fp32 ``[H]``: the output is scaled by
            ``exp(lse) / (exp(lse) + exp(attn_sink))``; lse itself is unaffected.
        out: optional ``[T, H, 512]`` tensor of q's dtype (unit last stride) to write into.
        return_lse: also return ``lse [T, H]`` fp32, natural log.
        fp8_workspace: for fp8_ds_mla rows, dequantize the distinct rows the call reads into a
            bf16 workspace once and run the bf16 kernel over it (:mod:`triton_sparse_mla.workspace`:
            ``distinct rows x 1152`` bytes, up to 2 GiB). None (default): for a bf16 q with
            ``T >= 1024`` when the distinct rows are each named by enough entries
            (``workspace.min_reuse``: 8 to 1024 by head count and device) and the workspace
            fits; True: always (bf16 q and fp8_ds_mla rows required); False: never (the rows
            are converted inside the kernel).
        rows_bound: optional int known on the host, at least the number of distinct rows of
            ``kv`` that valid entries of ``indices`` name (e.g. the summed context lengths of
            the requests whose tokens these are). The fp8 workspace then takes that many slots
            without counting the rows and reading the count back from the device; entries of
            rows past an understated bound count as invalid. Ignored for bf16/fp16 rows and
            while a CUDA graph is captured.
        entries_bound: optional int known on the host, at least the number of valid entries
            of ``indices`` (e.g. over the requests, query tokens times the smaller of context
            length and ``K``). The fp8 workspace's rule then reads ``min(T x K,
            entries_bound)`` entries per distinct row, not ``T x K``: a batch of short contexts
            whose rows are each read once keeps the in-kernel conversion. Only steers that
            choice (an understated bound can only keep the in-kernel path); ignored for
            bf16/fp16 rows.

    Returns:
        ``out [T, H, 512]`` in q's dtype, or ``(out, lse)`` with ``return_lse=True``. A row
        with no valid entry gives ``out = 0`` and ``lse = -inf``. fp8_ds_mla rows are
        dequantized into fp16 by some tiles (README, "How it works"): a row holding a value
        past fp16's range (65504) there gives the heads that read it non-finite ``out`` and an
        ``lse`` not to be trusted (NaN where the overflow reaches the sum), never ``-inf``.

    Raises:
        TypeError / ValueError naming the argument, the expected and the actual value, for a
        wrong type, dtype, rank, width, head or token count, device, or non-unit last stride.

    Launch choices depend only on shapes, format and device, so a CUDA graph captured around
    a call (after one warm-up call that compiles the kernels) replays with new index values.
    The fp8 workspace is captured only where its size follows from the shapes; where its rows
    must be counted on the host the captured call converts inside the kernel.

    The host work of a call is done once per call shape (:mod:`triton_sparse_mla.replay`):
    a later call of the same dtypes, shapes, strides, devices, 16-byte alignments and
    ``sm_scale`` replays the first one's launches over its own tensors.
    """
    key, recipe = replay.find(q, kv, indices, sm_scale, topk_length, attn_sink, out, return_lse,
                              fp8_workspace, rows_bound, entries_bound)
    if recipe is not None:
        return recipe(q, kv, indices, topk_length, attn_sink, out)
    q_arg, kv_arg, indices_arg = q, kv, indices
    q_nope, q_pe = _split_query(q)
    device = q_nope.device
    dtype = q_nope.dtype
    t_count, h_count = q_nope.shape[0], q_nope.shape[1]
    d_qk = D_NOPE + (0 if q_pe is None else D_ROPE)
    if q_pe is not None and q_pe.device != device:
        raise ValueError(f"q_pe: expected device {device}, got {q_pe.device}")
    if h_count < 1:
        raise ValueError(f"q: expected at least one head, got H = {h_count}")

    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv: expected a torch.Tensor, got {type(kv).__name__}")
    if kv.dim() == 3:
        if kv.shape[1] != 1:
            raise ValueError(f"kv: a 3-D cache must be [N, 1, C], got shape {list(kv.shape)}")
        kv = kv[:, 0]
    check_tensor("kv", kv, rank=2, device=device)
    fmt = row_format(kv)
    fp8 = fmt == "fp8_ds_mla"
    if fp8:
        if d_qk != D_NOPE + D_ROPE:
            raise ValueError(f"kv: fp8_ds_mla rows hold 576 values, but q has D_QK = {d_qk}")
        if kv.stride(0) % 4 != 0 or kv.data_ptr() % 4 != 0:
            raise ValueError(
                f"kv: fp8_ds_mla rows must start at 4-byte aligned addresses (fp32 scales), got "
                f"row stride {kv.stride(0)} bytes from an address {kv.data_ptr() % 4} bytes past "
                f"a multiple of 4"
            )
    else:
        if kv.dtype != dtype:
            raise TypeError(f"kv: expected dtype {dtype} (q's dtype) or torch.uint8, got {kv.dtype}")
        if kv.shape[1] != d_qk:
            raise ValueError(f"kv: expected rows of D_QK = {d_qk} values (q's width), got {kv.shape[1]}")

    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices: expected a torch.Tensor, got {type(indices).__name__}")
    if indices.dim() == 3:
        if indices.shape[1] != 1:
            raise ValueError(f"indices: a 3-D tensor must be [T, 1, K], got shape {list(indices.shape)}")
        indices = indices[:, 0]
    check_tensor("indices", indices, dtype=torch.int32, rank=2, device=device)
    if indices.shape[0] != t_count:
        raise ValueError(f"indices: expected T = {t_count} rows (q's tokens), got {indices.shape[0]}")

    if isinstance(sm_scale, (bool, torch.Tensor)) or not isinstance(sm_scale, Real):
        raise TypeError(f"sm_scale: expected a float, got {sm_scale!r}")
    try:
        scale = float(sm_scale)
    except OverflowError:  # (an int past float's range)
        scale = math.inf
    if not math.isfinite(scale):
        raise TypeError(f"sm_scale: expected a finite float, got {sm_scale!r}")
    if abs(scale) > SM_SCALE_MAX:
        raise ValueError(f"sm_scale: expected a magnitude of at most 2**64, got {sm_scale!r}")

    if topk_length is not None:
        check_tensor("topk_length", topk_length, dtype=torch.int32, rank=1, device=device)
        if topk_length.shape[0] != t_count:
            raise ValueError(f"topk_length: expected shape [{t_count}], got {list(topk_length.shape)}")
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, dtype=torch.float32, rank=1, device=device)
        if attn_sink.shape[0] != h_count:
            raise ValueError(f"attn_sink: expected shape [{h_count}] (q's heads), got {list(attn_sink.shape)}")
    if fp8_workspace is not None and not isinstance(fp8_workspace, bool):
        raise TypeError(f"fp8_workspace: expected None, True or False, got {fp8_workspace!r}")
    for name, bound in (("rows_bound", rows_bound), ("entries_bound", entries_bound)):
        if bound is not None:
            if isinstance(bound, bool) or not isinstance(bound, Integral):
                raise TypeError(f"{name}: expected None or an int, got {bound!r}")
            if bound < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {bound}")
    if fp8_workspace is True and not fp8:
        raise ValueError(f"fp8_workspace: True needs fp8_ds_mla rows (uint8 [N, 656]), got kv "
                         f"of dtype {kv.dtype}")

    if out is None:
        out = torch.empty(t_count, h_count, D_V, dtype=dtype, device=device)
    else:
        check_tensor("out", out, dtype=dtype, rank=3, device=device)
        if tuple(out.shape) != (t_count, h_count, D_V):
            raise ValueError(f"out: expected shape {[t_count, h_count, D_V]}, got {list(out.shape)}")
    lse = torch.empty(t_count, h_count, dtype=torch.float32, device=device) if return_lse else None

    family, sm_count, fp8_cvt = device_traits(device, "q")

    # (wanted first: it refuses fp8_workspace=True with an fp16 q whatever the sizes)
    if fp8 and workspace.wanted(t_count, dtype, fp8_workspace) and t_count > 0 \
            and indices.shape[1] > 0:
        key = None  # (what runs depends on the rows named, or on the bounds: not replayed)
        # (the in-kernel path it would replace: sm90's Gluon tiles, where they apply, pay less)
        gluon = gluon_applies(q_nope, kv, 0 if q_pe is None else q_pe.shape[2], True, INTERPRETED)
        built = workspace.build(kv, indices, topk_length, fp8_cvt, force=fp8_workspace is True,
                                reuse=workspace.min_reuse(h_count, gluon),
                                counted_reuse=workspace.min_reuse(h_count, gluon, counted=True),
                                rows_bound=None if rows_bound is None else int(rows_bound),
                                entries_bound=None if entries_bound is None else int(entries_bound))
        if built is not None:
            kv, indices = built
            fp8 = False
    if t_count > 0:
        def run():
            return _run(q_nope, q_pe, kv, indices, topk_length, attn_sink, scale, out, lse,
                        family=family, sm_count=sm_count, fp8_cvt=fp8_cvt, fp8=fp8)

        if key is None or indices.shape[1] == 0:
            run()
        else:
            q_pair = isinstance(q_arg, (tuple, list))
            sources = [q_arg[0] if q_pair else q_arg, q_arg[1] if q_pair else q_arg, kv_arg,
                       indices_arg, topk_length, attn_sink, out, lse]
            views = [(t, i) for i, t in enumerate(sources)]
            views += [(q_nope, 0), (q_pe, 1), (kv, 2), (indices, 3)]
            replay.record(key, run, sources, views)
    return (out, lse) if return_lse else out


def _run(q_nope, q_pe, kv, indices, topk_length, attn_sink, sm_scale, out, lse, *,
         family, sm_count, fp8_cvt, fp8, plan=None):
    """Plan (unless given) and launch on validated inputs; return the compiled main kernel.

    Tests and the tuning sweep pass ``plan`` to pin a configuration.
    """
    t_count, h_count = q_nope.shape[0], q_nope.shape[1]
    topk = indices.shape[1]
    if topk == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return
    planned = plan is None
    if planned:
        gluon = gluon_applies(q_nope, kv, 0 if q_pe is None else q_pe.shape[2], fp8, INTERPRETED)
        plan = configs.plan_launch(family, sm_count, fp8_cvt, t_count=t_count, h_count=h_count,
                                   topk=topk, fp8=fp8, gluon=gluon)
    return launch_sparse_mla_fwd(q_nope, q_pe, kv, indices, topk_length, attn_sink, sm_scale, out,
                                 lse, fp8=fp8, plan=plan, gluon_checked=planned)
