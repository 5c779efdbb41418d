"""Integer arithmetic for the host-side launch path.

``triton.cdiv`` is a JIT function: called from Python it goes through ``JITFunction.__call__``,
about 3.5 us a call (Triton 3.8 on a CPU), and planning a call made 6-8 of them. Planning
took 35-79 us of a call's 100-190 us of host time on the H200's host (2026-12-02,
benchmarks/host_time.py, run 129); the two helpers timed side by side there differed by less
than that host's noise (run 130).
"""


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0``."""
    return -(-a // b)
