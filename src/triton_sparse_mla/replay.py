"""A call's launches recorded once per call shape and replayed for later calls of that shape.

What :func:`~triton_sparse_mla.sparse_mla_attention` does on the host before its kernels run
(validation, the plan, each kernel's arguments, kernels/launch.py's keys) depends only on the
call's shape: each tensor argument's dtype, shape, strides, device and address modulo 16, the
softmax scale, whether lse is returned, and the current device. The first call of a shape runs
all of it while kernels/launch.py records each launch (the compiled kernel's launcher, its grid
and its values). Later calls of that shape allocate the outputs and scratch the recording
noted and hand each launcher the recorded values with this call's tensor addresses put in.

A shape is not replayed (every call takes the full path) where its launches depend on more
than the shape: the fp8_ds_mla workspace's decision (``fp8_workspace`` True, or None for a
batch the workspace's rule considers: it counts rows or reads ``rows_bound``), a launch that
took Triton's own path, or a tensor the launches were handed that is neither an argument, an
output, noted scratch nor a shared buffer (a copy the call made). Nor is a call recorded while
a CUDA graph is captured, while a launch hook is installed, with
``TRITON_SPARSE_MLA_FAST_LAUNCH=0``, or under the interpreter; a replay too takes the full path
while a hook is installed. What a replay does not repeat: reading ``TRITON_SPARSE_MLA_GLUON``
(read when a shape is first seen) and the checks, which a call of a validated shape passes.

Measured on an H100 host (BENCHMARKS.md, "Host time per call: each call shape's launches
replayed"): a replayed decode call takes 17-46 us of host time where the full path took 61-94,
about FlashMLA's C++ operator's 21-38 us.
"""

from __future__ import annotations

import torch

from .kernels import launch
from .kernels.common import INTERPRETED

# The shapes kept at most; past it the oldest recorded is dropped.
MAX_SHAPES = 1024
# A replay's scratch tensors share one allocation, each at a multiple of this many bytes (the
# launches were specialized for 16-byte aligned addresses, as torch's allocations are).
SCRATCH_ALIGN = 256

_RECIPES: dict = {}  # key -> Recipe, or None for a shape that is never replayed


def clear():
    """Forget every recorded shape (tests that change the planner's tables call this)."""
    _RECIPES.clear()


def _facts(t):
    """What a tensor argument contributes to a call's key (AttributeError for a non-tensor)."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() % 16)


def find(q, kv, indices, sm_scale, topk_length, attn_sink, out, return_lse, fp8_workspace,
         rows_bound, entries_bound):
    """``(key, recipe)``: the call's key (None where such a call is never recorded) and the
    :class:`Recipe` recorded for it (None where there is none, or while a launch hook is
    installed)."""
    if not launch.FAST or INTERPRETED:  # (the interpreter's launches go through Triton)
        return None, None
    if fp8_workspace is not None and fp8_workspace is not False:
        return None, None
    for bound in (rows_bound, entries_bound):  # (only a valid bound can be left out of the key)
        if bound is not None and (type(bound) is not int or bound < 0):
            return None, None
    current_device, _, hooks_idle = launch.runtime()
    try:
        if isinstance(q, (tuple, list)):
            q_facts = (type(q), tuple(map(_facts, q)))
        else:
            q_facts = _facts(q)
        key = (q_facts, _facts(kv), _facts(indices), _facts(topk_length), _facts(attn_sink),
               _facts(out), type(sm_scale), sm_scale, bool(return_lse), fp8_workspace is None,
               current_device())
        recipe = _RECIPES.get(key, False)
    except (AttributeError, TypeError, RuntimeError):  # (a non-tensor, a sparse one, an
        # unhashable scale: never valid, left to the checks)
        return None, None
    if not hooks_idle():
        return None, None
    if recipe is False:
        return key, None
    return None, recipe  # (None: recorded as never replayed)


def record(key, run, sources, views):
    """Run ``run()`` (the call's launches) under a recording and keep what replays it under
    ``key``, or that it cannot be replayed.

    ``sources``: the tensors a replay is given or allocates, in :meth:`Recipe.__call__`'s order
    ``[q or q_nope, q or q_pe, kv, indices, topk_length, attn_sink, out, lse]`` (None where
    absent). ``views``: the tensors the launches are handed, each as ``(tensor, source index)``
    (q's halves, the 2-D views of a 3-D cache or indices, and every source itself).
    """
    if torch.cuda.is_current_stream_capturing():
        return run()
    with launch.recording() as rec:
        result = run()
    if rec is not None:
        while len(_RECIPES) >= MAX_SHAPES:
            del _RECIPES[next(iter(_RECIPES))]
        _RECIPES[key] = Recipe.build(rec, sources, views)
    return result


class Recipe:
    """A recorded call: the outputs and scratch to allocate and the launches to make."""

    def __init__(self, out_shape, lse_shape, dtype, device, q_pair, scratch_bytes, launches,
                 current_device):
        self.out_shape, self.lse_shape = out_shape, lse_shape
        self.dtype, self.device = dtype, device
        self.q_pair, self.scratch_bytes, self.launches = q_pair, scratch_bytes, launches
        self.current_device = current_device  # (the launches' device: a key holds it)

    @classmethod
    def build(cls, rec, sources, views):
        """The recipe of a :class:`~triton_sparse_mla.kernels.launch.Recording` (None where the
        call cannot be replayed); ``sources`` and ``views`` as :func:`record`'s."""
        if not rec.complete or not rec.launches:
            return None
        where = {}
        for tensor, index in views:
            if tensor is not None:
                where[id(tensor)] = (index, tensor.data_ptr() - sources[index].data_ptr())
        # (a replay's scratch tensors: places in one allocation, each SCRATCH_ALIGN-aligned)
        offsets, scratch_bytes = [], 0
        for nbytes in rec.scratch:
            offsets.append(scratch_bytes)
            scratch_bytes += -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        for tensor_id, (index, _) in rec.scratch_of.items():
            where[tensor_id] = (len(sources), offsets[index])
        launches = []
        for runner, grid, values in rec.launches:
            template, slots = list(values), []
            for position, value in enumerate(values):
                if not isinstance(value, torch.Tensor) or id(value) in rec.shared:
                    continue
                if id(value) not in where:  # (a tensor this call made: a copy)
                    return None
                template[position] = None  # (no reference to the call's tensors is kept)
                slots.append((position, *where[id(value)]))
            launches.append((runner, grid, template, tuple(slots)))
        q_nope, q_pe, _, _, _, _, out, lse = sources
        return cls(tuple(out.shape), None if lse is None else tuple(lse.shape), out.dtype,
                   out.device, q_nope is not q_pe, scratch_bytes, tuple(launches),
                   launch.runtime()[0]())

    def __call__(self, q, kv, indices, topk_length, attn_sink, out):
        """The recorded call's launches over these arguments (of the recorded shape); returns
        ``out`` or ``(out, lse)`` as :func:`~triton_sparse_mla.sparse_mla_attention`."""
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        lse = None
        if self.lse_shape is not None:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        q_nope, q_pe = q if self.q_pair else (q, q)
        tensors = [q_nope, q_pe, kv, indices, topk_length, attn_sink, out, lse]
        if self.scratch_bytes:
            tensors.append(torch.empty(self.scratch_bytes, dtype=torch.uint8, device=self.device))
        address = [None if t is None else t.data_ptr() for t in tensors]
        stream = launch.runtime()[1](self.current_device)
        for (run, function, packed), grid, template, slots in self.launches:
            values = template.copy()
            for position, index, offset in slots:
                values[position] = address[index] + offset
            run(grid[0], grid[1], grid[2], stream, function, packed, None, None, None, *values)
        return out if lse is None else (out, lse)
