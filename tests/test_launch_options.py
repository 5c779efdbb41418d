"""Every kernel launch passes the package's compile options (kernels/common.py,
``LAUNCH_OPTIONS``), so the kernels compile the same under any Triton default: from Triton 3.10
floating-point fusion is off unless a launch asks for it."""

import json
import os
import subprocess
import sys

import pytest
import torch

from problems import make_problem
from triton_sparse_mla import api, configs, workspace
from triton_sparse_mla.kernels import launch
from triton_sparse_mla.kernels.common import LAUNCH_OPTIONS


def _spy_launches(monkeypatch):
    """Record ``(kernel name, keyword arguments)`` of every launch from now on: the
    interpreter's grid executor, or the JIT's ``run`` on a GPU (every launch taking Triton's
    path: kernels/launch.py's own path is turned off)."""
    monkeypatch.setattr(launch, "FAST", False)
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime.interpreter import GridExecutor as cls
        method = "__call__"
    else:
        from triton.runtime.jit import JITFunction as cls
        method = "run"
    launches = []
    original = getattr(cls, method)

    def spy(self, *args, **kwargs):
        launches.append((getattr(self.fn, "__name__", repr(self.fn)), kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, spy)
    return launches


_FUSION_PROBE = r"""
import json, os, re, sys
os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"  # Triton 3.10's default
from triton_sparse_mla import configs, portability
label, kernel, types, cx, div, warps, stages = next(
    v for v in portability._main_kernel_variants(configs.TileConfig(16, 32, 4, 2), 90, False, "sm90")
    if "partial=0" in v[0])
pinned = portability._compile(kernel, types, cx, div, 90, warps, stages).asm["ptx"]
portability.LAUNCH_OPTIONS = {}  # (what a compile without the package's options gets)
default = portability._compile(kernel, types, cx, div, 90, warps, stages).asm["ptx"]
json.dump({name: len(re.findall(r"\bfma\.rn\.f32", ptx))
           for name, ptx in (("pinned", pinned), ("default", default))}, open(sys.argv[1], "w"))
"""


def test_compiles_fuse_under_a_default_of_no_fusion(tmp_path):
    """With Triton's default set to no fusion (3.10's), the kernels compiled with the package's
    options still fuse their multiply-adds (PTX ``fma``); without them they would not."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-c", _FUSION_PROBE, str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-2000:]
    counts = json.loads(out.read_text())
    assert counts["default"] == 0, counts  # (this Triton honours the default)
    assert counts["pinned"] > 0, counts


def test_every_launch_passes_the_launch_options(monkeypatch, device):
    launches = _spy_launches(monkeypatch)
    # The main kernel split in two (so the combine kernel runs too), on bf16 rows.
    prob = make_problem(t=2, h=16, k=64, n=100, device=device, topk_length="partial")
    q_nope, q_pe = api._split_query(prob.q)
    out = torch.empty(2, 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 16, dtype=torch.float32, device=device)
    plan = configs.LaunchPlan(tile=configs.TileConfig(16, 32, 4, 2), splits=2, fp8_cvt=0)
    api._run(q_nope, q_pe, prob.kv, prob.indices, prob.topk_length, None, prob.sm_scale, out,
             lse, family=None, sm_count=1, fp8_cvt=0, fp8=False, plan=plan)
    # The fp8_ds_mla workspace's three kernels.
    prob = make_problem(t=2, h=8, k=64, n=100, fmt="fp8_ds_mla", device=device)
    assert workspace.build(prob.kv, prob.indices, None, 0, force=True) is not None

    names = {name for name, _ in launches}
    assert {"sparse_mla_fwd_kernel", "combine_kernel", "mark_rows_kernel", "remap_kernel",
            "upconvert_kernel"} <= names, names
    missing = [name for name, kwargs in launches
               if any(kwargs.get(k) != v for k, v in LAUNCH_OPTIONS.items())]
    assert not missing, f"launched without {LAUNCH_OPTIONS}: {missing}"


@pytest.mark.gpu
def test_kernels_compile_with_fusion_under_a_default_of_off(monkeypatch, device):
    """With Triton's default set to no fusion (3.10's), the compiled main kernel still fuses."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    prob = make_problem(t=2, h=16, k=64, n=100, device=device)
    q_nope, q_pe = api._split_query(prob.q)
    out = torch.empty(2, 16, 512, dtype=torch.bfloat16, device=device)
    plan = configs.LaunchPlan(tile=configs.TileConfig(16, 32, 4, 2), splits=1, fp8_cvt=0)
    compiled = api._run(q_nope, q_pe, prob.kv, prob.indices, None, None, prob.sm_scale, out,
                        None, family=None, sm_count=1, fp8_cvt=0, fp8=False, plan=plan)
    assert compiled.metadata.enable_fp_fusion is True
