"""The alternate-tile kernel's (kernels/gluon_pingpong.py) row-max exchange alone, for
compute-sanitizer's racecheck: two consumer warpgroups beside a default partition that does
nothing, exchanging per pair a vector through shared memory as ``_wg0_pair`` and ``_pp_wg1``
exchange ``m0`` and the joint max ``M`` (the same helpers, hardware barriers, layouts and
shared-memory layout): warpgroup 0 writes ``m[0]`` and arrives at ``_NB_MAX0``, warpgroup 1
waits there, reads it, writes ``m[1]`` and arrives at ``_NB_MAX_JOINT``, where warpgroup 0
waits before reading ``m[1]``. Each program runs its own number of pairs, read from memory.

racecheck reports warpgroup 0's read of ``M`` against warpgroup 1's write of it in the kernel,
with partial lengths only (BENCHMARKS.md "The alternate-tile kernel shipped"). A variant here
is ``LENGTHS,DELAY[,BUFS]``: LENGTHS ``full`` (every program 4 pairs) or ``partial`` (0-4 pairs per
program); DELAY ``none``, ``wg0`` (warpgroup 0 spins between its arrival and its wait, so that
warpgroup 1 arrives at ``_NB_MAX_JOINT`` first) or ``wg1`` (warpgroup 1 spins before its
write, so that warpgroup 0 waits first); BUFS 1 (``M`` in one slot, as the kernel) or 2 (``M``
in two slots by pair parity, so that a slot is rewritten only two pairs after its last read).
Each variant's outputs are checked and its verdict printed after it.

Run 157 (the five default variants, one slot): racecheck reports warpgroup 0's read of ``M``
against warpgroup 1's write of it here too, with full lengths as well, every output correct,
and never the exchange of ``m[0]`` in the other direction, as in the kernel. Run 158
(``full,none,2``, ``partial,none,2``, ``full,none,1``): with ``M`` in two slots too, every
output correct; so the report does not come from the single slot but from racecheck's reading
of ``bar.arrive`` (BENCHMARKS.md "The 64-head bf16 tile: q copied by its producer").

compute-sanitizer --tool racecheck python3 benchmarks/nb_exchange_probe.py [LENGTHS,DELAY ...]
"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from triton_sparse_mla.kernels.gluon_pingpong import (S_L64, _NB_MAX0, _NB_MAX_JOINT, _nb_arrive,
                                                      _nb_sync)
from triton_sparse_mla.kernels.gluon_sm90 import FLAT1

H = gl.constexpr(64)  # the vector: one value per head, in the score tile's row layout
VARIANTS = ("full,none", "partial,none", "partial,wg0", "partial,wg1", "full,wg0")
_DELAY = {"none": 0, "wg0": 1, "wg1": 2}


@gluon.jit
def _spin(x, n):
    """``x`` after ``n`` dependent multiplications by one (a delay the compiler keeps)."""
    for _ in range(n):
        x = x * 1.0000001
    return x


@gluon.jit
def _idle(n_pairs):
    n_pairs += 0  # (the default partition: as the kernel's producer, it shares no memory here)


@gluon.jit
def _wg0(m_smem, out_ptr, n_pairs, spin, DELAY: gl.constexpr, BUFS: gl.constexpr):
    """Per pair ``j``: ``m[0] = j + h``, then the joint max read back and summed."""
    o_h = gl.arange(0, H, layout=gl.SliceLayout(1, S_L64))
    acc = gl.zeros([H], gl.float32, layout=gl.SliceLayout(1, S_L64))
    for j in range(n_pairs):
        m_smem.index(0).store((o_h + j).to(gl.float32))
        _nb_arrive(_NB_MAX0)
        if DELAY == 1:
            acc = _spin(acc, spin)
        _nb_sync(_NB_MAX_JOINT)
        acc += m_smem.index(1 + j % BUFS).load(acc.type.layout)
    gl.store(out_ptr + gl.program_id(0) * 2 * H + o_h, acc)


@gluon.jit
def _wg1(m_smem, out_ptr, n_pairs, spin, DELAY: gl.constexpr, BUFS: gl.constexpr):
    """Per pair: ``M = m[0] + 1`` into ``m[1]``, and the sum of the ``m[0]`` it read."""
    o_h = gl.arange(0, H, layout=gl.SliceLayout(1, S_L64))
    acc = gl.zeros([H], gl.float32, layout=gl.SliceLayout(1, S_L64))
    for j in range(n_pairs):
        _nb_sync(_NB_MAX0)
        m0 = m_smem.index(0).load(acc.type.layout)
        if DELAY == 2:
            m0 = _spin(m0, spin)
        m_smem.index(1 + j % BUFS).store(m0 + 1.0)
        _nb_arrive(_NB_MAX_JOINT)
        acc += m0
    gl.store(out_ptr + gl.program_id(0) * 2 * H + H + o_h, acc)


@gluon.jit
def nb_exchange_kernel(out_ptr, pairs_ptr, spin, DELAY: gl.constexpr, BUFS: gl.constexpr):
    m_smem = gl.allocate_shared_memory(gl.float32, [1 + BUFS, H], FLAT1)
    n_pairs = gl.load(pairs_ptr + gl.program_id(0))
    gl.warp_specialize([(_idle, (n_pairs,)), (_wg0, (m_smem, out_ptr, n_pairs, spin, DELAY, BUFS)),
                        (_wg1, (m_smem, out_ptr, n_pairs, spin, DELAY, BUFS))], [4, 4], [232, 232])


def run(lengths: str, delay: str, bufs: str = "1", programs: int = 8):
    """One variant on the GPU; raises if an output is wrong."""
    gen = torch.Generator().manual_seed(0)
    pairs = (torch.full((programs,), 4) if lengths == "full"
             else torch.randint(0, 5, (programs,), generator=gen)).to(torch.int32)
    out = torch.zeros(programs, 2, H.value, device="cuda")
    nb_exchange_kernel[(programs,)](out, pairs.cuda(), 2000, DELAY=_DELAY[delay], BUFS=int(bufs),
                                    num_warps=4)
    torch.cuda.synchronize()
    h = torch.arange(H.value, dtype=torch.float32)
    for p, n in enumerate(pairs.tolist()):
        m0_sum = sum(h + j for j in range(n)) if n else torch.zeros(H.value)
        torch.testing.assert_close(out[p, 1].cpu(), m0_sum, rtol=1e-3, atol=1e-3)  # (the spins)
        torch.testing.assert_close(out[p, 0].cpu(), m0_sum + n, rtol=1e-3, atol=1e-3)


if __name__ == "__main__":
    for v in sys.argv[1:] or VARIANTS:
        run(*v.split(","))
        print(f"ok nb exchange probe, variant {v}", flush=True)
