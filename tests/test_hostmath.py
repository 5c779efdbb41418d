"""The host-side launch path's integer helpers (triton_sparse_mla.hostmath) against Triton's
own, and the planner's cache against planning afresh."""

import itertools

import triton

from triton_sparse_mla import configs, hostmath


def test_helpers_match_triton():
    for n in range(0, 1100):
        assert hostmath.next_power_of_2(n) == triton.next_power_of_2(n), n
    for a, b in itertools.product(range(0, 300), (1, 2, 3, 16, 64, 128)):
        assert hostmath.cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_cached_plans_are_fresh_plans():
    """``plan_launch`` keeps each plan it made: a cached plan equals the one planned afresh
    (the undecorated function), for every family, phase, format and head count, with and
    without the Gluon kernels."""
    fresh = configs.plan_launch.__wrapped__
    for family, sm_count in (("sm90", 132), ("sm80", 108), ("sm86", 84), ("sm100", 148)):
        for t, h, topk, fp8, gluon in itertools.product((1, 3, 8, 63, 128, 4096), (1, 8, 16, 20, 64, 128),
                                                        (1, 100, 2048), (False, True), (False, True)):
            kw = dict(t_count=t, h_count=h, topk=topk, fp8=fp8, gluon=gluon)
            plan = configs.plan_launch(family, sm_count, 1, **kw)
            assert plan == fresh(family, sm_count, 1, **kw), kw
            assert configs.plan_launch(family, sm_count, 1, **kw) is plan, kw
