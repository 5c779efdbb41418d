"""fp8_ds_mla prefill through a bf16 workspace of the distinct rows a call reads.

In prefill every cache row is gathered by many query tokens: T tokens x K entries name at most
the rows of their requests' contexts (a 4096-token chunk of one request: 8.4M entries, at most
its context's rows). Dequantizing each distinct row once into a bf16 workspace and running the
bf16 kernel over it replaces T x K in-kernel conversions by one per row, and lets the faster
bf16 tiles run (measured: BENCHMARKS.md, "fp8_ds_mla prefill through a workspace").

The workspace has one slot per distinct row, ``R x 1152`` bytes (plus 8 bytes per cache row and
4 per index entry while it is built), at most :data:`MAX_BYTES`. ``R`` is taken from the shapes
when ``min(N, T x K)`` slots take at most :data:`SHAPE_MAX_BYTES`: then nothing waits for the
device and a CUDA graph can capture the call; and where those slots are the whole cache (N rows)
and the index entries are many (:data:`ENTRY_BYTES`), every row is converted to the slot of its
own id and the indices are kept, without the passes that find the distinct rows. A caller that
knows a bound on the rows its tokens can name (vLLM's plugin: its requests' context lengths
summed) passes it as ``rows_bound``, and ``R`` is that bound. Otherwise (a large cache, as
vLLM's, which holds every request's rows) the distinct rows are counted and the count read on
the host, so the workspace takes only what the call reads; that is never done while a graph is
captured. The rows of the first tokens are counted first (:data:`HEAD_FACTOR`):
when they alone are more than the workspace pays for, the call keeps the in-kernel conversion
without marking the rest. A call whose rows are reused fewer than :func:`min_reuse` times, or
whose distinct rows do not fit, keeps the in-kernel conversion, and so do calls of fewer than
:data:`MIN_TOKENS` query tokens (decode), so decode stays as it was. Only for a bf16 query: the
workspace holds the dequantized values in q's dtype, and fp16 cannot hold every value an
fp8_ds_mla row with a large scale encodes.

Results equal, bit for bit, the bf16 kernel run on ``dequantize_fp8_ds_mla(kv).bfloat16()``
(the same values, gathered in the same order).
"""

from __future__ import annotations

import torch

from .formats import D_NOPE, D_ROPE, FP8_ROW_BYTES
from .hostmath import cdiv
from .kernels.common import INTERPRETED, LAUNCH_OPTIONS
from .kernels.dedup import mark_rows_kernel, remap_kernel, upconvert_kernel
from .kernels.launch import launch

# Calls with fewer query tokens keep the in-kernel conversion, so decode is unchanged (H200,
# 2026-12-01, run 48, before the mark pass was sped up: T=1024 H=16 over 32K rows 1.43x faster
# through the workspace, T=512 0.75x).
MIN_TOKENS = 1024
# Index entries per distinct row below which the in-kernel conversion is kept: the workspace
# pays one conversion per distinct row (656 bytes read, 1152 written) to save part of the cost of
# each entry. 8 is the least reuse measured (H200, T=4096 over 1M rows: 1.03-1.23x faster);
# prefill inside one request's context reuses each row 100 times or more.
MIN_REUSE = 8
# Where sm90's Gluon tiles convert in the kernel (kernels.attention.gluon_applies) and the rows
# must be found (not kept at their ids, ENTRY_BYTES), the workspace pays only at a higher reuse,
# by head count: (at most that many heads, the reuse where the slots are known on the host --
# from the shapes or the caller's ``rows_bound`` --, the reuse where the rows are counted and the
# count read back; None: never counted). Measured (H200, 2026-12-04, runs 207, 208 and 213;
# BENCHMARKS.md "a cache that fits keeps its row ids") over 32K-row caches at T=1024, 4096 and
# 16384 (reuse 64, 256, 1024), in a 64K-row window of a 1M-row cache (128) and over 1M rows (8),
# the workspace's rows found on the device against the in-kernel conversion: with 8-16 heads
# (the few-head tiles; the workspace's rows run the few-head bf16 tile) 0.83-0.92x at 64,
# 1.09-1.10x at 256, 1.18x at 1024; counted 0.95-1.02x at 256, 0.99-1.03x at 128, 1.11-1.14x
# at 1024, 0.70x at 8, and a count that finds too many rows costs 100-270 us of a 2 ms call
# (T=4096 over 1M rows, reuse 8: 2330 and 2535 us against 2137 and 2270 in the kernel, run
# 213), so there the rows are never counted. With 32 heads (the workspace's rows run the
# 64-head tile, configs._G64_32) 0.94x at 64, 1.06x at 256, 1.07x at 1024; counted 0.95x at
# 256, 1.03x at 1024 (run 170: 0.93x at 256). With 64 heads (the dequantizing producer) 1.14x
# at 64, 1.28x at 256, 1.30x at 1024; counted 1.16x at 256 (run 119: a tie at 128, 0.85x at
# 8). With 128 heads 1.28x at 64 and 1.32x at 256; counted 1.18-1.25x at 64-256 and
# 1.01-1.09x at 8 (runs 118-119).
# Up to 16 heads the prefill tile converts in registers (configs._N8_REGS, _N16_REGS) and beats
# the workspace at every reuse measured: at 8 heads 1.18x at 64, 1.13x at 256, 1.10x at 1024
# (H100, 2026-12-07, run 335); at 16 heads 1.045x at 64, 1.007x at 256, 1.07x at 1024, 1.35x
# at 128 in a 64K-row window (run 343): never.
MIN_REUSE_GLUON = ((16, None, None), (32, 256, 1024), (64, 64, 256),
                   (None, MIN_REUSE, MIN_REUSE))
# Largest workspace (bytes of dequantized rows) a call may allocate.
MAX_BYTES = 2 << 30
# Largest workspace sized from the shapes alone (min(N, T x K) slots, counted rows or not): a
# 32K-row cache (38 MB) is; a 1M-row cache (1.2 GB) is counted, so that a large cache whose
# calls read few of its rows (vLLM's) never reserves slots for the rest.
SHAPE_MAX_BYTES = 256 << 20
# Where the rows are counted, the first tokens' entries are marked and counted alone first, as
# many as HEAD_FACTOR times the most distinct rows for which the workspace pays (their distinct
# rows bound the call's from below). Entries drawn at random from a window of W rows name
# W (1 - exp(-4 x most / W)) of them, more than ``most`` once W passes 1.03 x most. Counting all
# entries cost 80-320 us at T=4096 over 1M rows, where the in-kernel path is kept (H200,
# 2026-12-02, run 122); at reuse 256 the first 65 of those 4096 tokens decide, and the rule
# then costs 117-253 us there, 125-313 us inside a 64K-row window (run 126: most of it the
# host read, during which the device waits through the rest of the call's host work).
HEAD_FACTOR = 4
ROW_BYTES = (D_NOPE + D_ROPE) * 2  # one bf16 workspace row
# Where the slots follow from the shapes and cover the whole cache (N <= T x K), the rows keep
# their ids (every row converted, the indices unchanged) when converting them all moves no more
# bytes than ENTRY_BYTES per index entry: the device cost of marking and remapping one entry,
# counted in copy bytes (H200, run 50, T=4096 over 32K rows: the build took 92 us, of which
# marking, prefix sum and remap about 75 us for 8.4M entries, the time 270 MB take at the
# conversion's 3.6 TB/s). Marking and remapping also launch three kernels
# more and allocate two int32 arrays (4 bytes per cache row and per entry).
ENTRY_BYTES = 32
_BLOCK_K = 256
_BLOCK_R = 16


def wanted(t_count: int, q_dtype: torch.dtype, mode) -> bool:
    """Whether to try the workspace before looking at the indices.

    ``mode``: None (automatic: bf16 q and ``T >= MIN_TOKENS``), True (a bf16 q required) or
    False (never).
    """
    if mode is False:
        return False
    if q_dtype != torch.bfloat16:
        if mode is True:
            raise ValueError(f"fp8_workspace: needs a bf16 query (fp16 cannot hold every "
                             f"fp8_ds_mla value), got q of dtype {q_dtype}")
        return False
    return mode is True or t_count >= MIN_TOKENS


def min_reuse(h_count: int, gluon: bool, counted: bool = False) -> int | None:
    """Index entries per distinct row from which the workspace replaces the in-kernel
    conversion, for ``h_count`` query heads, where its slots are known on the host or, with
    ``counted``, where its rows are counted: :data:`MIN_REUSE`, or with sm90's Gluon tiles
    (``gluon``) :data:`MIN_REUSE_GLUON`'s entry (None: never)."""
    if not gluon:
        return MIN_REUSE
    row = next(r for r in MIN_REUSE_GLUON if r[0] is None or h_count <= r[0])
    return row[2] if counted else row[1]


def _pays(entries: int, rows: int, max_bytes: int, reuse: int) -> bool:
    return rows * ROW_BYTES <= max_bytes and entries >= reuse * rows


def build(kv: torch.Tensor, indices: torch.Tensor, topk_length, fp8_cvt: int, *, force: bool,
          reuse: int | None = MIN_REUSE, counted_reuse: int | None = MIN_REUSE,
          rows_bound: int | None = None, entries_bound: int | None = None):
    """Dequantize the rows that valid entries of ``indices`` name into a workspace.

    Args:
        kv: fp8_ds_mla rows ``[N, 656]`` uint8. indices: int32 ``[T, K]``. topk_length: int32
            ``[T]`` or None (validity as in :func:`triton_sparse_mla.sparse_mla_attention`).
        fp8_cvt: the device's e4m3 decode path (``configs.fp8_cvt_level``).
        force: skip the reuse and size checks.
        reuse: index entries per distinct row below which the in-kernel conversion is kept
            where the slots are known on the host (:func:`min_reuse`; None: always kept, the
            rows not even counted).
        counted_reuse: the same where the rows must be counted (``min_reuse(..., counted=True)``;
            None: never counted).
        rows_bound: the caller's bound on the distinct rows (host-known, e.g. the requests'
            context lengths summed), or None. With it the workspace takes ``min(N, T x K,
            rows_bound)`` slots (up to :data:`MAX_BYTES`) and is decided from it, the rows never
            counted; the entries of rows past an understated bound become invalid. Ignored
            while a CUDA graph is captured (the values at capture need not bound those at
            replay).
        entries_bound: the caller's bound on the valid entries (host-known), or None: every
            decision below reads ``min(T x K, entries_bound)`` entries, not ``T x K``.

    Returns:
        ``(workspace [R, 576] bf16, new_indices [T, K] int32)``, every valid entry rewritten as
        its row's slot in the workspace and every other entry -1 (slots past the distinct rows
        stay unwritten and unnamed), or None when the call should keep the in-kernel
        conversion. Where the slots follow from the shapes and cover the cache, and converting
        it all costs less than remapping (:data:`ENTRY_BYTES`), the workspace holds every row
        at its own id (R = N) and ``new_indices`` is ``indices`` itself.

    Raises:
        ValueError with ``force`` while a CUDA graph is captured, if the rows must be counted.
    """
    n_rows = kv.shape[0]
    t_count, topk = indices.shape
    entries = t_count * topk  # (the valid ones, as far as the host knows)
    if entries_bound is not None:
        entries = min(entries, entries_bound)
    if reuse is None and not force:
        return None
    if _keeps_ids(n_rows, entries):
        # Every row converted to the slot of its own id, the indices kept: nothing marked,
        # summed or remapped, nothing read back (whatever ``reuse`` asks: the rows are reused at
        # least (656 + 1152) / ENTRY_BYTES times here, where the workspace beat every in-kernel
        # path measured).
        return _upconvert(kv, None, n_rows, fp8_cvt), indices
    device = kv.device
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if capturing:
        rows_bound = None
    bound, limit = min(n_rows, entries), SHAPE_MAX_BYTES
    if rows_bound is not None:
        bound, limit = min(bound, rows_bound), MAX_BYTES
    from_shapes = (_pays(entries, bound, limit, reuse) if not force
                   else bound * ROW_BYTES <= limit)
    exact = not from_shapes
    if exact and not force and (counted_reuse is None or rows_bound is not None):
        # (where the caller's bound does not pay, counting would find about as many rows)
        return None
    if exact and capturing:
        if force:
            raise ValueError("fp8_workspace=True: its rows must be counted on the host here "
                             f"({bound} slots would take more than {limit} bytes), "
                             "which cannot be done while a CUDA graph is captured")
        return None
    common = dict(n_rows=n_rows, topk=topk, stride_idx_t=indices.stride(0),
                  HAS_LEN=topk_length is not None, BLOCK_K=_BLOCK_K)
    mark = torch.zeros(n_rows, dtype=torch.int32, device=device)
    head = t_count
    if exact and not force:
        most = min(entries // counted_reuse, MAX_BYTES // ROW_BYTES)  # distinct rows that pay
        head = min(t_count, cdiv(HEAD_FACTOR * most + 1, topk))
    _mark(mark, indices, topk_length, 0, head, common)
    if head < t_count:
        if int(mark.sum()) > most:  # waits for the device
            return None
        _mark(mark, indices, topk_length, head, t_count, common)
    pos = torch.cumsum(mark, 0, dtype=torch.int32)
    del mark
    slots = bound
    if exact:
        slots = int(pos[-1]) if n_rows > 0 else 0  # waits for the device
        if not force and not _pays(entries, slots, MAX_BYTES, counted_reuse):
            return None
    new_indices = torch.empty(t_count, topk, dtype=torch.int32, device=device)
    launch(
        remap_kernel, (t_count, cdiv(topk, _BLOCK_K)),
        idx_ptr=indices, len_ptr=topk_length, pos_ptr=pos, new_idx_ptr=new_indices,
        n_slots=slots, stride_new_t=new_indices.stride(0), **common, **LAUNCH_OPTIONS)
    return _upconvert(kv, pos, slots, fp8_cvt), new_indices


def _keeps_ids(n_rows: int, entries: int) -> bool:
    """Whether a workspace of all ``n_rows`` cache rows, each at its own id, is sized from the
    shapes and converting them costs no more than marking and remapping ``entries`` index
    entries (which convert only the rows named)."""
    return (n_rows * ROW_BYTES <= SHAPE_MAX_BYTES
            and n_rows * (FP8_ROW_BYTES + ROW_BYTES) <= entries * ENTRY_BYTES)


def _upconvert(kv, pos, slots: int, fp8_cvt: int):
    """A ``[max(slots, 1), 576]`` bf16 workspace holding the rows of ``kv`` that ``pos`` marks
    (every row at its own id where ``pos`` is None)."""
    n_rows = kv.shape[0]
    workspace = torch.empty(max(slots, 1), D_NOPE + D_ROPE, dtype=torch.bfloat16, device=kv.device)
    if n_rows > 0:
        launch(
            upconvert_kernel, (cdiv(n_rows, _BLOCK_R),),
            kv_ptr=kv, pos_ptr=pos, ws_ptr=workspace, n_rows=n_rows, n_slots=slots,
            stride_kv=kv.stride(0),
            stride_ws=workspace.stride(0), FP8_CVT=fp8_cvt, D_PE=D_ROPE, BLOCK_R=_BLOCK_R,
            INTERPRET=INTERPRETED,
            **LAUNCH_OPTIONS)
    return workspace


def _mark(mark, indices, topk_length, t_lo, t_hi, common):
    """Mark the rows that valid entries of tokens ``t_lo .. t_hi - 1`` name."""
    if t_hi > t_lo:
        launch(
            mark_rows_kernel, (t_hi - t_lo, cdiv(common["topk"], _BLOCK_K)),
            idx_ptr=indices, len_ptr=topk_length, mark_ptr=mark, t_first=t_lo, **common, **LAUNCH_OPTIONS)
