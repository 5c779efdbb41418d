"""Launching a kernel Triton has compiled, without Triton's per-call host work.

``kernel[grid](**args)`` binds the arguments, specializes each one, builds a cache key from
the result and the options, checks the kernel's globals, builds launch metadata for the hooks
and only then calls the compiled kernel's launcher: about half of this package's host time per
call on an H100 host (run 316: 175-249 us per call of ours, FlashMLA's 34-55 us), several
times the device time of a decode call run eagerly.

:func:`launch` keys a call by what decides Triton's specialization (Triton 3.3 to 3.9):
every argument's class; a tensor's dtype and whether its address is a multiple of 16; an
integer's width class (i32, i64, u64), whether it is 1 and whether it is a multiple of 16; a
``tl.constexpr`` parameter's value, and the value of every other argument but a float; the
launch options. The first call with a key goes through Triton (which compiles, or finds its
compiled kernel), and the compiled kernel it returns is kept under that key; later calls with
the key hand that kernel's launcher the arguments in the kernel's parameter order, as Triton's
own call does, with no launch hooks. Equal keys imply equal specializations
(``tests/test_launch.py`` checks this against Triton's own), so a call never runs a kernel
compiled for other facts; sizes that change from call to call (token counts, context lengths)
change no key unless Triton's specialization of them changes.

Triton's path is kept for every call while a launch hook is installed (a profiler's), for an
argument of a class other than those below (a tuple, a tensor descriptor), under the
interpreter, and everywhere with ``TRITON_SPARSE_MLA_FAST_LAUNCH=0`` (read at import). What
this path does not repeat: Triton's check that the kernel's globals still hold the values it
was compiled with (the package's are module constants, never reassigned).

While :func:`recording` is active, each launch is also noted (its launcher, grid and values),
with the per-call scratch (:func:`scratch`) and the shared buffers (:func:`shared`) its caller
names, so that triton_sparse_mla/replay.py can repeat a whole call's launches without its host
work.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

FAST = os.environ.get("TRITON_SPARSE_MLA_FAST_LAUNCH", "1") != "0"

# The classes of argument a key holds (tensors: by dtype and alignment; integers and floats
# not declared constexpr: by what Triton specializes on).
_KEYED = frozenset({int, float, bool, str, type(None), tl.constexpr, tl.dtype})
_I32 = range(-2 ** 31, 2 ** 31)
_U64_FROM = 2 ** 63


class _Kernel:
    """A kernel's parameters in order and the compiled kernels :func:`launch` found for it."""

    def __init__(self, kernel):
        self.names = tuple(p.name for p in kernel.params)
        self.defaults = tuple(p.default for p in kernel.params)
        self.constexpr = tuple(bool(p.is_constexpr) for p in kernel.params)
        self.name_set = frozenset(self.names)
        self.layouts = {}  # argument classes -> positions of tensors, integers, floats
        self.compiled = {}

    def values(self, args, kwargs) -> list:
        """Every parameter's value in order, as Triton's binding gives them."""
        if not args:
            return list(map(kwargs.get, self.names, self.defaults))
        n = len(args)
        return [*args, *map(kwargs.get, self.names[n:], self.defaults[n:])]

    def key(self, values, kwargs) -> tuple:
        """A call's key, less the device (TypeError for an argument left to Triton)."""
        classes = tuple(map(type, values))
        layout = self.layouts.get(classes)
        if layout is None:
            layout = self.layouts[classes] = self._layout(classes)
        tensors, ints, floats = layout
        held = values.copy()
        for i in tensors:
            x = values[i]
            held[i] = (x.dtype, x.data_ptr() % 16 == 0)
        for i in ints:
            v = values[i]
            held[i] = 1 if v == 1 else (v % 16 == 0, v in _I32, v >= _U64_FROM)
        for i in floats:
            held[i] = None
        options = kwargs.keys() - self.name_set
        return classes, tuple(held), frozenset((k, kwargs[k]) for k in options) if options else None

    def _layout(self, classes) -> tuple:
        """``(tensors, integers, floats)``: the positions, among arguments of these classes, of
        tensors and of integers and floats not declared constexpr; TypeError for a class that
        is neither a tensor's nor one of :data:`_KEYED`."""
        for cls in classes:
            if not (cls in _KEYED or issubclass(cls, torch.Tensor)):
                raise TypeError(f"left to Triton: an argument of type {cls.__name__}")
        plain = [(i, cls) for i, (cls, c) in enumerate(zip(classes, self.constexpr)) if not c]
        return (tuple(i for i, cls in plain if issubclass(cls, torch.Tensor)),
                tuple(i for i, cls in plain if cls is int),
                tuple(i for i, cls in plain if cls is float))


def _runtime():
    """``(current device, current stream of a device, hooks_idle)`` functions of this Triton."""
    from triton.runtime import driver

    active = driver.active
    try:
        from triton import knobs

        runtime = knobs.runtime

        def hooks_idle():
            return (_idle(runtime.launch_enter_hook) and _idle(runtime.launch_exit_hook)
                    and getattr(runtime, "add_stages_inspection_hook", None) is None)
    except ImportError:  # Triton 3.3: the hooks are the compiled kernel class's attributes
        from triton.compiler import CompiledKernel

        def hooks_idle():
            return CompiledKernel.launch_enter_hook is None and CompiledKernel.launch_exit_hook is None
    return active.get_current_device, active.get_current_stream, hooks_idle


def _idle(hook) -> bool:
    """Whether a launch hook calls nothing: None, or an empty chain (Triton 3.6 on)."""
    return hook is None or getattr(hook, "calls", None) == []


_RUNTIME = []


def runtime():
    """``(current device, current stream of a device, hooks_idle)``: this Triton's functions,
    fetched once."""
    if not _RUNTIME:
        _RUNTIME.extend(_runtime())
    return _RUNTIME


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` for a ``@triton.jit`` kernel, ``grid`` a tuple of 1
    to 3 ints (a parameter left out takes its default); returns what that returns (the
    compiled kernel; None under the interpreter)."""
    recording = getattr(_LOCAL, "recording", None)
    if not FAST or not isinstance(kernel, JITFunction):  # (the interpreter's kernels)
        return _triton_path(kernel, grid, args, kwargs, recording)
    current_device, current_stream, hooks_idle = runtime()
    if not hooks_idle():  # (nor are kernels compiled under a stages hook kept)
        return _triton_path(kernel, grid, args, kwargs, recording)
    entry = getattr(kernel, "_triton_sparse_mla_launch", None)
    if entry is None:
        entry = kernel._triton_sparse_mla_launch = _Kernel(kernel)
    device = current_device()
    values = entry.values(args, kwargs)
    try:
        key = (device, entry.key(values, kwargs))
        found = entry.compiled.get(key)
    except TypeError:  # an argument left to Triton, or an unhashable one (3.3's constexpr)
        return _triton_path(kernel, grid, args, kwargs, recording)
    grid3 = (*grid, 1, 1)[:3]
    if found is None:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is None:  # (nothing to keep, nor to replay)
            if recording is not None:
                recording.complete = False
            return compiled
        found = entry.compiled[key] = (compiled, compiled.run, compiled.function,
                                       compiled.packed_metadata)
        if recording is not None:
            recording.launches.append((found[1:], grid3, values))
        return compiled
    compiled, run, function, packed = found
    if recording is not None:
        recording.launches.append((found[1:], grid3, values))
    run(grid3[0], grid3[1], grid3[2], current_stream(device), function, packed, None, None, None,
        *values)
    return compiled


def _triton_path(kernel, grid, args, kwargs, recording):
    """``kernel[grid](*args, **kwargs)``: a call an active recording cannot replay."""
    if recording is not None:
        recording.complete = False
    return kernel[grid](*args, **kwargs)


# The launches a caller records, to replay them for later calls of the same shapes
# (triton_sparse_mla/replay.py).

_LOCAL = threading.local()


class Recording:
    """What happened through this module while :func:`recording` was active, in this thread.

    ``launches``: per launch ``((run, function, packed metadata), grid of 3, values)``, the
    kept compiled kernel's launcher and what it was handed. ``complete``: False once a launch
    took Triton's own path (which a replay cannot repeat). ``scratch``: the size in bytes of
    each :func:`scratch` tensor; ``scratch_of``: ``id(tensor) -> (scratch index, tensor)`` for
    those tensors (held, so that no other tensor takes their ids); ``shared``:
    ``id(tensor) -> tensor`` for :func:`shared` tensors.
    """

    def __init__(self):
        self.launches, self.complete = [], True
        self.scratch, self.scratch_of, self.shared = [], {}, {}


@contextlib.contextmanager
def recording():
    """Record this thread's launches (and scratch) while the block runs; yields a
    :class:`Recording` (None where one is already active: recordings do not nest)."""
    if getattr(_LOCAL, "recording", None) is not None:
        yield None
        return
    _LOCAL.recording = rec = Recording()
    try:
        yield rec
    finally:
        _LOCAL.recording = None


@contextlib.contextmanager
def unrecorded():
    """Launches in the block are no part of an active recording (a one-off query a later call
    does not repeat)."""
    saved = getattr(_LOCAL, "recording", None)
    _LOCAL.recording = None
    try:
        yield
    finally:
        _LOCAL.recording = saved


def scratch(shapes, dtype, device) -> list:
    """``torch.empty`` tensors of ``shapes`` (each a tuple) and ``dtype`` on ``device``, for one
    call's launches; an active recording notes them, so that a replay allocates its own."""
    tensors = [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
    recording = getattr(_LOCAL, "recording", None)
    if recording is not None:
        for t in tensors:
            recording.scratch_of[id(t)] = (len(recording.scratch), t)
            recording.scratch.append(t.numel() * t.element_size())
    return tensors


def shared(*tensors):
    """Note ``tensors`` (kept by their owner for every call) to an active recording: a replay
    hands the launches these same tensors."""
    recording = getattr(_LOCAL, "recording", None)
    if recording is not None:
        for t in tensors:
            recording.shared[id(t)] = t
