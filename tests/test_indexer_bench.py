"""The indexer benchmark's own parts (``triton_sparse_mla.indexer.bench``, ``triton-sparse-mla
bench --phase indexer``): the work it counts matches the inputs it makes, its output check tells
right from wrong, and the CLI's presets pick the models' indexer heads."""

import json
from dataclasses import asdict

import pytest

from triton_sparse_mla import cli
from triton_sparse_mla.indexer import bench

SMALL = [bench.Workload("prefill", heads=4, ctx=70, t=20),
         bench.Workload("decode", heads=4, ctx=150, batch=3, next_n=2)]


@pytest.mark.parametrize("w", SMALL, ids=lambda w: w.phase)
def test_counted_work_matches_the_inputs(w, device):
    args = bench.make_inputs(w, device)
    if w.phase == "prefill":
        q, k, _, weights, starts, ends, width = args
        assert q.shape == (w.t, w.heads, bench.D) and k.shape == (w.ctx + w.t, bench.D)
        pairs = (ends - starts).sum().item()
        assert w.flops == 2 * w.heads * bench.D * pairs and width >= (ends - starts).max()
        assert w.nbytes is None
    else:
        q, cache, weights, lens, tables, width = args
        assert q.shape == (w.batch, w.next_n, w.heads, bench.D)
        assert lens.shape == (w.batch, w.next_n) and lens.max().item() == w.ctx
        assert w.flops == 2 * w.heads * bench.D * w.batch * w.next_n * w.ctx
        blocks_read = tables.numel()  # every block of every request
        assert w.nbytes == (blocks_read * cache.shape[1] * cache.shape[-1] + q.numel()
                            + 4 * weights.numel() + 4 * w.batch * w.next_n * w.ctx)


@pytest.mark.parametrize("w", SMALL, ids=lambda w: w.phase)
def test_reference_error_tells_right_from_wrong(w, device):
    args = bench.make_inputs(w, device)
    out = bench.ours(w, args)()
    assert bench.reference_error(w, args, out) < 1e-3
    # the first row's logits shifted by a key, within the columns the call writes (the others
    # hold whatever the allocator left there, NaN at times)
    if w.phase == "prefill":
        lo, hi = args[4][0].item(), args[5][0].item()
    else:
        lo, hi = 0, args[3][0, 0].item()
    wrong = out.clone()
    wrong[0, lo:hi] = out[0, lo:hi].roll(1)
    assert bench.reference_error(w, args, wrong) > 0.1


@pytest.mark.parametrize("preset, heads", [("deepseek-v32-tp8", {64}), ("glm5-tp1", {32}),
                                           ("all", {64, 32}), ("tp4", {64, 32})])
def test_cli_presets_pick_the_indexer_heads(preset, heads):
    args = cli._parser().parse_args(["bench", "--phase", "indexer", "--preset", preset])
    work = cli._indexer_workloads(args)
    assert {w.heads for w in work} == heads
    assert {w.phase for w in work} == {"prefill", "decode"}


def test_table_row_names_the_baseline_ratio():
    w = bench.workloads()[0]
    row = asdict(w) | dict(us=400.0, rel_err=1e-4, TFLOPs=300.0, matmul_share=0.5)
    assert "-" in bench.format_row(row).split()[-3:-1]  # no DeepGEMM: dashes, not a ratio
    line = bench.format_row(row | {"deep_gemm_us": 200.0})
    assert " 200.0 " in line and " 0.50 " in line and w.name in line


def test_run_records_every_workload(device, monkeypatch, tmp_path, capsys):
    """``run``'s plumbing, with the GPU-only parts (header, ceilings, timing) replaced: every
    workload checked against float64, its rates derived from its time and counted work, the
    JSON written, one table line each."""
    from triton_sparse_mla import bench as attention_bench

    monkeypatch.setattr(attention_bench, "header", lambda: {"gpu": "stand-in"})
    monkeypatch.setattr(attention_bench, "measure_ceilings",
                        lambda: {"copy_GBps": 1000.0, "matmul_TFLOPs": 100.0})
    monkeypatch.setattr(attention_bench, "heat", lambda fn, seconds: fn())
    monkeypatch.setattr(attention_bench, "time_us", lambda fn, graph: 250.0 if graph else 500.0)
    monkeypatch.setattr(bench, "deep_gemm", lambda: (None, "not here"))
    out = tmp_path / "indexer.json"
    record = bench.run(SMALL, json_path=str(out), device=device)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    assert [r["phase"] for r in record["rows"]] == ["prefill", "decode"]
    for w, row in zip(SMALL, record["rows"]):
        us = 250.0 if w.phase == "decode" else 500.0  # decode is timed as graph replays
        assert row["us"] == us and row["rel_err"] < 1e-3
        assert row["TFLOPs"] == pytest.approx(w.flops / us / 1e6)
        assert row["matmul_share"] == pytest.approx(row["TFLOPs"] / 100.0)
        assert ("copy_share" in row) is (w.phase == "decode")
    assert record["rows"][1]["GBps"] == pytest.approx(SMALL[1].nbytes / 250.0 / 1e3)
    table = capsys.readouterr().out
    assert all(w.name in table for w in SMALL)
