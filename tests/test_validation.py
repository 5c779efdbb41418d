"""Bad inputs raise the documented errors, naming the argument, expected and actual values."""

import pytest
import torch

from problems import make_problem
from triton_sparse_mla import sparse_mla_attention


@pytest.fixture
def prob(device):
    return make_problem(t=3, h=8, k=16, n=40, device=device)


def call(prob, **over):
    args = dict(q=prob.q, kv=prob.kv, indices=prob.indices, sm_scale=prob.sm_scale)
    args.update(over)
    return sparse_mla_attention(args.pop("q"), args.pop("kv"), args.pop("indices"),
                                args.pop("sm_scale"), **args)


@pytest.mark.parametrize("over, exc, words", [
    (lambda p: dict(q=p.q.float()), TypeError, ["q", "torch.float32"]),
    (lambda p: dict(q=p.q[..., :500]), ValueError, ["q", "500"]),
    (lambda p: dict(q=p.q[0]), ValueError, ["q", "3 dimensions"]),
    (lambda p: dict(q=p.q.transpose(1, 2)), ValueError, ["q", "last dimension"]),
    (lambda p: dict(q=(p.q[..., :512], p.q[..., 512:].half())), TypeError, ["q_pe", "float16"]),
    (lambda p: dict(q=(p.q[..., :512], p.q[:2, :, 512:])), ValueError, ["q_pe", "[3, 8]"]),
    (lambda p: dict(kv=p.kv.half()), TypeError, ["kv", "float16"]),
    (lambda p: dict(kv=p.kv[:, :512]), ValueError, ["kv", "576", "512"]),
    (lambda p: dict(kv=p.kv.float()), TypeError, ["kv", "float32"]),
    (lambda p: dict(kv=torch.zeros(40, 576, dtype=torch.uint8, device=p.kv.device)), ValueError, ["kv", "656"]),
    (lambda p: dict(kv=p.kv[:, None].expand(40, 2, 576)), ValueError, ["kv", "[N, 1, C]"]),
    (lambda p: dict(kv=p.kv.t()), ValueError, ["kv"]),
    (lambda p: dict(indices=p.indices.long()), TypeError, ["indices", "torch.int32", "torch.int64"]),
    (lambda p: dict(indices=p.indices[:2]), ValueError, ["indices", "T = 3", "2"]),
    (lambda p: dict(indices=p.indices[0]), ValueError, ["indices", "2 dimensions"]),
    (lambda p: dict(sm_scale=float("nan")), TypeError, ["sm_scale"]),
    (lambda p: dict(sm_scale="0.1"), TypeError, ["sm_scale"]),
    (lambda p: dict(sm_scale=True), TypeError, ["sm_scale", "True"]),
    (lambda p: dict(sm_scale=10 ** 400), TypeError, ["sm_scale", "finite"]),
    (lambda p: dict(sm_scale=3e38), ValueError, ["sm_scale", "2**64", "3e+38"]),
    (lambda p: dict(q=(p.q[..., :512], p.q[:2, :, :0])), ValueError, ["q_pe", "[3, 8]", "[2, 8]"]),
    (lambda p: dict(q=(p.q[..., :512], p.q[..., 512:540])), ValueError, ["q_pe", "64", "28"]),
    (lambda p: dict(topk_length=torch.zeros(3, dtype=torch.int64, device=p.kv.device)), TypeError, ["topk_length", "int32"]),
    (lambda p: dict(topk_length=torch.zeros(4, dtype=torch.int32, device=p.kv.device)), ValueError, ["topk_length", "[3]", "[4]"]),
    (lambda p: dict(attn_sink=torch.zeros(7, device=p.kv.device)), ValueError, ["attn_sink", "[8]", "[7]"]),
    (lambda p: dict(attn_sink=torch.zeros(8, dtype=torch.float64, device=p.kv.device)), TypeError, ["attn_sink", "float32"]),
    (lambda p: dict(out=torch.empty(3, 8, 512, dtype=torch.float16, device=p.kv.device)), TypeError, ["out", "bfloat16"]),
    (lambda p: dict(out=torch.empty(3, 9, 512, dtype=torch.bfloat16, device=p.kv.device)), ValueError, ["out", "[3, 8, 512]", "[3, 9, 512]"]),
], ids=lambda v: None)
def test_bad_input(prob, over, exc, words):
    with pytest.raises(exc) as info:
        call(prob, **over(prob))
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_fp8_cache_needs_rope_geometry(device):
    prob = make_problem(t=2, h=8, k=16, n=40, fmt="fp8_ds_mla", device=device)
    with pytest.raises(ValueError, match="D_QK = 512"):
        call(prob, q=prob.q[..., :512])


def test_cpu_without_interpreter_is_refused(monkeypatch):
    prob = make_problem(t=2, h=8, k=16, n=40)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        call(prob)


def test_interpreter_asked_for_after_the_import_is_refused(monkeypatch):
    """TRITON_INTERPRET=1 set after the package defined its kernels for a GPU: a clear error
    from the call, not Triton's driver error from inside the launch."""
    from triton_sparse_mla import boundary
    prob = make_problem(t=2, h=8, k=16, n=40)
    monkeypatch.setattr(boundary, "INTERPRETED_AT_IMPORT", False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1 was set after"):
        call(prob)


@pytest.mark.parametrize("triton, numpy, refused", [
    ((3, 6), "2.4.1", True), ((3, 6), "2.3.5", False), ((3, 7), "2.4.1", False)])
def test_interpreter_refused_where_triton_and_numpy_clash(monkeypatch, triton, numpy, refused):
    """Triton's interpreter before 3.7 cannot run with numpy 2.4: a clear error names both,
    from the call itself."""
    from triton_sparse_mla import boundary
    monkeypatch.setattr(boundary, "triton_version", lambda: triton)
    monkeypatch.setattr(boundary.np, "__version__", numpy)
    if not refused:
        boundary.check_interpreter()
        return
    with pytest.raises(RuntimeError, match=r"numpy 2\.4\.1.*numpy<2\.4"):
        boundary.check_interpreter()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(boundary, "INTERPRETED_AT_IMPORT", True)  # as on a CPU, also on a GPU
    with pytest.raises(RuntimeError, match="Triton 3.6"):
        call(make_problem(t=2, h=8, k=16, n=40))


def test_fp8_workspace_true_needs_bf16_q_whatever_the_sizes(device):
    """fp8_workspace=True with an fp16 q is refused also where there is nothing to compute
    (no tokens, no entries), so a warm-up call does not pass where the real call fails."""
    prob = make_problem(t=2, h=8, k=16, n=40, fmt="fp8_ds_mla", device=device)
    for t, k in ((2, 0), (0, 16)):
        with pytest.raises(ValueError, match="fp8_workspace.*bf16"):
            call(prob, q=prob.q[:t].half(), indices=prob.indices[:t, :k], fp8_workspace=True)


def test_misaligned_fp8_cache_names_its_address(device):
    prob = make_problem(t=2, h=8, k=16, n=40, fmt="fp8_ds_mla", device=device)
    buf = torch.zeros(40 * 656 + 2, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="kv: .*aligned.*address 2 bytes past"):
        call(prob, kv=buf[2:].view(40, 656))


def test_nope_query_tuple_without_q_pe(device):
    """A NoPE query as ``(q_nope, None)`` or ``(q_nope, [T, H, 0])`` is q_nope alone, in the
    kernel and in the reference."""
    from triton_sparse_mla import sparse_mla_reference
    prob = make_problem(t=2, h=8, k=16, n=40, d_qk=512, device=device)
    want = call(prob)
    ref_out, _ = sparse_mla_reference((prob.q, None), prob.kv, prob.indices, prob.sm_scale)
    for q_pe in (None, prob.q[..., :0]):
        got = call(prob, q=(prob.q, q_pe))
        assert torch.equal(got, want)
    rel = (want.double().cpu() - ref_out).norm() / ref_out.norm()
    assert rel < 2e-2, rel
