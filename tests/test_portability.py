"""Every shipped configuration compiles for sm80, sm86, sm89, sm90, sm100 and sm120 and fits
that architecture's shared memory. Compiling needs no GPU, but it must not run under the
interpreter, so it runs in a subprocess without TRITON_INTERPRET."""

import json
import os
import subprocess
import sys

from triton_sparse_mla import configs


def test_all_configs_compile_and_fit(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "records.json"
    proc = subprocess.run([sys.executable, "-m", "triton_sparse_mla.portability", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert out.exists(), proc.stderr[-2000:]
    records = json.loads(out.read_text())
    bad = [r for r in records if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1)[:4000]
    targets = {r["target"] for r in records}
    assert targets == {"sm80", "sm86", "sm89", "sm90", "sm100", "sm120"}
    for family in configs.CONFIGS:
        for phase, kind, tile in configs.all_tiles(family):
            key = f"{phase}/{kind}/{tile.block_h}x{tile.block_n}"
            hits = [r for r in records if r["family"] == family and r["config"] == key]
            assert hits and all(r["shared"] <= configs.SMEM_LIMIT[family] for r in hits)
    assert proc.returncode == 0
