"""Integer arithmetic for the host-side launch path.

``triton.cdiv`` and ``triton.next_power_of_2`` are JIT functions: called from Python they go
through ``JITFunction.__call__``, 3.5-6 us a call (Triton 3.8 on a CPU), and planning a call
made 6-8 of them. Planning
took 35-79 us of a call's 100-190 us of host time on the H200's host (2026-12-02,
benchmarks/host_time.py, run 129); the two helpers timed side by side there differed by less
than that host's noise (run 130).
"""


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0``."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` for ints ``n >= 1`` (and 0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
