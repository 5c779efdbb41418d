"""Changing sparse_mla_attention's planner inside one benchmark process.

The library keeps what it decided for a call shape: ``configs.plan_launch`` each plan it made
(an lru_cache) and replay.py each call shape's launches. A tool that changes a table, a limit,
the planner itself or a kernel between calls of one shape has to drop both when it makes the
change and when it undoes it; otherwise its later calls run what was decided before, and a
variant is timed as the shipped code. (Found on 2026-12-07, when ``ncu_profile.py``'s
``-fp8_regs`` workload profiled the fp8_regs kernel again. Every tool that changes the
planner goes through :func:`patched`.)
"""

import contextlib

from triton_sparse_mla import configs, replay

_SHIPPED_PLAN = configs.plan_launch  # the library's planner, whose cache forget() drops


def forget():
    """Drop every plan and recorded launch made so far."""
    _SHIPPED_PLAN.cache_clear()
    replay.clear()


@contextlib.contextmanager
def patched(owner, **values):
    """Inside: each named attribute of ``owner`` (a module) set to its value. Plans and
    recorded launches are dropped on entering and on leaving. A name ``owner`` lacks raises
    AttributeError, so a misspelt name cannot time the shipped code under a variant's label."""
    saved = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    forget()
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)
        forget()
