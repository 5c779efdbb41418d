"""The smallest Gluon kernels with ``gl.warp_specialize`` (a default partition and one worker
warpgroup that share nothing but the arguments Triton hands over, one of them loaded by the
kernel, so that it goes through shared memory as the producer kernel's do), for compute-sanitizer's
racecheck: hazards reported here come from Triton's warp-specialization hand-over, not from a
kernel's own shared memory.

A variant is ``PRE,IN``: the barrier of the default warps before the partitions (``PRE``) and
the one inside the default partition (``IN``), each 0 (none), 1 (barrier 0 with the default
warps' thread count: the kernels' ``_barrier``, and what the compiler inserted in the producer
kernel of run 80) or 2 (named barrier 3 with the same count, inline PTX).
The worker has a named barrier of its own whenever either is set, as the producer's. Kinds 1
and 2 order every access alike (the SASS differs only in the barrier's number). Run 80
(BENCHMARKS.md "The producer warpgroup shipped"): variants 1,1, 2,2 and 1,0 report hazards at
the hand-over, 0,0 and 0,1 none, so a barrier of the default warps before the partitions,
of either number, is what the sanitizer reports on. Run (each variant's verdict printed after
it; default: all five):
compute-sanitizer --tool racecheck python3 this_file.py [PRE,IN ...]"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from triton_sparse_mla.kernels.gluon_sm90 import _barrier  # the kernels' barrier (Triton 3.6 and 3.8)

L = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))
VARIANTS = ((0, 0), (1, 1), (2, 2), (1, 0), (0, 1))


@gluon.jit
def _default_barrier(KIND: gl.constexpr):
    """A barrier of the 4 default warps: none, barrier 0 or named barrier 3 (see above)."""
    if KIND == 1:
        _barrier()
    elif KIND == 2:
        gl.inline_asm_elementwise("bar.sync 3, 128;\n mov.b32 $0, $1;", "=r,r",  # (one per thread)
                                  [gl.arange(0, 128, layout=L)], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gluon.jit
def _default(out_ptr, n, IN: gl.constexpr):
    o = gl.arange(0, 128, layout=L)
    gl.store(out_ptr + o, (o + n).to(gl.float32))
    _default_barrier(IN)
    return o + n + 1, n  # (a tuple, as warp_specialize returns it)


@gluon.jit
def _worker(out_ptr, n, BARRIER: gl.constexpr):
    o = gl.arange(0, 128, layout=L)
    gl.store(out_ptr + 128 + o, (o * n).to(gl.float32))
    if BARRIER:
        _barrier()  # (a named barrier of the worker warps alone, as the producer's)


@gluon.jit
def ws_probe_kernel(out_ptr, n_ptr, PRE: gl.constexpr, IN: gl.constexpr):
    _default_barrier(PRE)
    n = gl.load(n_ptr)  # (loaded, not an argument: the partitions get it through shared memory)
    b, m = gl.warp_specialize([(_default, (out_ptr, n, IN)), (_worker, (out_ptr, n, PRE + IN > 0))],
                              [4], [24])
    gl.store(out_ptr + 256 + gl.arange(0, 128, layout=L), (b + m).to(gl.float32))


if __name__ == "__main__":
    o = torch.arange(128, device="cuda", dtype=torch.float32)
    for pre, inside in [tuple(map(int, a.split(","))) for a in sys.argv[1:]] or VARIANTS:
        out = torch.zeros(384, device="cuda")
        ws_probe_kernel[(4,)](out, torch.full((1,), 3, device="cuda", dtype=torch.int32),
                              PRE=pre, IN=inside, num_warps=4)
        torch.cuda.synchronize()
        assert torch.equal(out[:128], o + 3) and torch.equal(out[128:256], o * 3)
        assert torch.equal(out[256:], o + 7)
        print(f"ok ws hand-over probe, variant {pre},{inside}", flush=True)
