"""benchmarks/replan.py: a benchmark's change of the planner reaches the calls made under it
and is undone after, though the library keeps plans and recorded launches per call shape."""

import importlib.util
from pathlib import Path

import pytest

from triton_sparse_mla import configs, replay

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "replan.py"
_spec = importlib.util.spec_from_file_location("replan", _PATH)
replan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replan)


def _plan(t):
    return configs.plan_launch("sm90", 132, 1, t_count=t, h_count=16, topk=2048, fp8=False)


def test_a_changed_limit_reaches_the_plan_and_is_undone():
    assert configs.phase_of("sm90", 4, 16) == "latency"
    shipped = _plan(4)  # (kept by plan_launch's cache from here on)
    decode_tile = configs.pick_tile("sm90", t_count=9, h_count=16, fp8=False)
    assert configs.pick_tile("sm90", t_count=4, h_count=16, fp8=False) != decode_tile
    with replan.patched(configs, LATENCY_MAX_TOKENS=1):
        assert configs.LATENCY_MAX_TOKENS == 1
        changed = _plan(4)
        assert changed.tile == configs.pick_tile("sm90", t_count=9, h_count=16, fp8=False)
        assert changed != shipped
    assert configs.LATENCY_MAX_TOKENS == 8
    assert _plan(4) == shipped


def test_recorded_launches_are_dropped_on_entering_and_leaving():
    replay._RECIPES["a shape"] = None
    with replan.patched(configs, LATENCY_MAX_TOKENS=1):
        assert "a shape" not in replay._RECIPES
        replay._RECIPES["another shape"] = None
    assert "another shape" not in replay._RECIPES


def test_a_misspelt_name_changes_nothing():
    with pytest.raises(AttributeError):
        with replan.patched(configs, LATENCY_MAX_TOKEN=1):
            pass
    assert not hasattr(configs, "LATENCY_MAX_TOKEN")
