"""The smallest Gluon kernel with ``gl.warp_specialize`` (a default partition and one worker
warpgroup that share nothing but the arguments Triton hands over), for compute-sanitizer's
racecheck: hazards reported here come from Triton's warp-specialization handshake, not from a
kernel's own shared memory. Run: compute-sanitizer --tool racecheck python3 this_file.py"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

L = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))


@gluon.jit
def _default(out_ptr, n):
    o = gl.arange(0, 128, layout=L)
    gl.store(out_ptr + o, (o + n).to(gl.float32))
    return o + n + 1, n  # (a tuple, as warp_specialize returns it)


@gluon.jit
def _worker(out_ptr, n):
    o = gl.arange(0, 128, layout=L)
    gl.store(out_ptr + 128 + o, (o * n).to(gl.float32))


@gluon.jit
def ws_probe_kernel(out_ptr, n):
    b, m = gl.warp_specialize([(_default, (out_ptr, n)), (_worker, (out_ptr, n))], [4], [24])
    gl.store(out_ptr + 256 + gl.arange(0, 128, layout=L), (b + m).to(gl.float32))


if __name__ == "__main__":
    out = torch.zeros(384, device="cuda")
    ws_probe_kernel[(4,)](out, 3, num_warps=4)
    torch.cuda.synchronize()
    o = torch.arange(128, device="cuda", dtype=torch.float32)
    assert torch.equal(out[:128], o + 3) and torch.equal(out[128:256], o * 3) and torch.equal(out[256:], o + 7)
    print("ok ws handshake probe")
