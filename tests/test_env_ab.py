"""The A/B runner for kernel variants selected by environment variables (benchmarks/env_ab.py):
its settings and its summary, on made-up records. Timing itself needs a GPU."""

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "env_ab.py"
_spec = importlib.util.spec_from_file_location("env_ab", _PATH)
env_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(env_ab)


def test_settings_parse_and_refuse():
    assert env_ab.parse_setting("A=1 B=x=2") == {"A": "1", "B": "x=2"}
    for bad in ("", "A", "=1", "A=1 B"):
        with pytest.raises(SystemExit, match="NAME=VALUE"):
            env_ab.parse_setting(bad)


def test_summary_against_the_first_setting(tmp_path):
    path = tmp_path / "ab.jsonl"
    records = [("A=0", "w1", 100.0), ("A=1", "w1", 90.0), ("A=0", "w1", 102.0), ("A=1", "w1", 92.0),
               ("A=1", "w2", 50.0)]
    path.write_text("".join(json.dumps(dict(setting=s, workload=w, us=us)) + "\n" for s, w, us in records))
    rows = {(w, s): row for w, s, *row in env_ab.summary(path, ["A=0", "A=1"])}
    mean, lo, hi, n, ratio = rows[("w1", "A=1")]
    assert (mean, lo, hi, n) == (91.0, 90.0, 92.0, 2) and ratio == pytest.approx(101.0 / 91.0)
    assert rows[("w1", "A=0")][4] == 1.0
    # a workload the first setting never ran has no ratio
    assert ("w2", "A=0") not in rows and rows[("w2", "A=1")][4] != rows[("w2", "A=1")][4]


def test_field_must_be_a_boolean_tile_field():
    env_ab.check_field(None)
    env_ab.check_field("fp8_regs")
    for bad in ("no_such_field", "block_h"):
        with pytest.raises(SystemExit, match="--field: expected a boolean TileConfig field"):
            env_ab.check_field(bad)
