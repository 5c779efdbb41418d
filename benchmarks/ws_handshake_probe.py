"""The smallest Gluon kernels with ``gl.warp_specialize`` (a default partition and one worker
warpgroup that share nothing but the arguments Triton hands over, one of them loaded by the
kernel, so that it goes through shared memory as the producer kernel's do), for compute-sanitizer's
racecheck: hazards reported here come from Triton's warp-specialization hand-over, not from a
kernel's own shared memory. ``BARRIERS`` adds what the producer kernel (kernels/gluon_sm90.py,
sparse_mla_gluon_ws_kernel) has around the hand-over and this probe otherwise lacks: a barrier
of the default warps before the partitions (``bar.sync 0`` with their thread count only), one
inside the default partition and one inside the worker's (a named barrier of its own). Run (both variants, each verdict printed):
compute-sanitizer --tool racecheck python3 this_file.py"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from triton_sparse_mla.kernels.gluon_sm90 import _barrier  # the kernels' barrier (Triton 3.6 and 3.8)

L = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))


@gluon.jit
def _default(out_ptr, n, BARRIERS: gl.constexpr):
    o = gl.arange(0, 128, layout=L)
    gl.store(out_ptr + o, (o + n).to(gl.float32))
    if BARRIERS:
        _barrier()
    return o + n + 1, n  # (a tuple, as warp_specialize returns it)


@gluon.jit
def _worker(out_ptr, n, BARRIERS: gl.constexpr):
    o = gl.arange(0, 128, layout=L)
    gl.store(out_ptr + 128 + o, (o * n).to(gl.float32))
    if BARRIERS:
        _barrier()  # (a named barrier of the worker warps alone, as the producer's)


@gluon.jit
def ws_probe_kernel(out_ptr, n_ptr, BARRIERS: gl.constexpr):
    if BARRIERS:
        _barrier()
    n = gl.load(n_ptr)  # (loaded, not an argument: the partitions get it through shared memory)
    b, m = gl.warp_specialize([(_default, (out_ptr, n, BARRIERS)), (_worker, (out_ptr, n, BARRIERS))], [4], [24])
    gl.store(out_ptr + 256 + gl.arange(0, 128, layout=L), (b + m).to(gl.float32))


if __name__ == "__main__":
    o = torch.arange(128, device="cuda", dtype=torch.float32)
    for barriers in (False, True):
        out = torch.zeros(384, device="cuda")
        ws_probe_kernel[(4,)](out, torch.full((1,), 3, device="cuda", dtype=torch.int32),
                              BARRIERS=barriers, num_warps=4)
        torch.cuda.synchronize()
        assert torch.equal(out[:128], o + 3) and torch.equal(out[128:256], o * 3)
        assert torch.equal(out[256:], o + 7)
        print(f"ok ws hand-over probe, barriers={barriers}", flush=True)
