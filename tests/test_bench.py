"""The benchmark's own output check: ``bench.reference_error`` compares a workload's first tokens
with the float64 reference while reading only the cache rows they select; and the workloads
the benchmark scripts take on their command lines (``bench.Workload.from_spec``), and the ones
``triton-sparse-mla bench``'s options name."""

import pytest
import torch

from problems import make_problem
from triton_sparse_mla import bench, sparse_mla_reference


def test_reference_error_tells_right_from_wrong():
    for fmt in ("bf16", "fp8_ds_mla"):
        p = make_problem(t=6, h=8, k=64, n=300, fmt=fmt, topk_length="partial")
        ref, _ = sparse_mla_reference(p.q, p.kv, p.indices, p.sm_scale, topk_length=p.topk_length)
        right = ref.to(torch.bfloat16)
        # only the first tokens are checked, so what follows them may be anything
        right[4:] = float("nan")
        assert bench.reference_error(p.q, p.kv, p.indices, p.topk_length, p.sm_scale, right) < 1e-2
        wrong = right.clone()
        wrong[:4] = right[:4].roll(1, dims=1)  # heads swapped
        assert bench.reference_error(p.q, p.kv, p.indices, p.topk_length, p.sm_scale, wrong) > 0.1


def test_workload_from_spec():
    w = bench.Workload.from_spec("4096,16,bf16,N=32768")
    assert (w.phase, w.t, w.h, w.fmt, w.n_rows, w.lengths) == ("prefill", 4096, 16, "bf16", 32768, "full")
    w = bench.Workload.from_spec("128,8,fp8_ds_mla,len=rand")
    assert (w.phase, w.n_rows, w.lengths) == ("decode", 1 << 20, "random")
    assert bench.Workload.from_spec("512,64,bf16").phase == "decode"
    for bad, says in (("128,8", "T,H,FORMAT"), ("128,8,fp4", "'fp4'"), ("x,8,bf16", "T,H,FORMAT"),
                      ("128,8,bf16,N=abc", "'N=abc'"), ("128,8,bf16,pingpong", "'pingpong'")):
        with pytest.raises(ValueError, match=says):
            bench.Workload.from_spec(bad)


def test_bench_prefill_tokens_option():
    """``bench --prefill-tokens`` sets the prefill workloads' token counts (ShardQ's T/tp
    shapes), and a malformed list is refused by name."""
    from triton_sparse_mla import cli

    args = cli._parser().parse_args(["bench", "--phase", "prefill", "--preset", "glm5-tp1",
                                     "--formats", "bf16", "--prefill-tokens", "512,2048"])
    got = {(w.t, w.h, w.n_rows) for w in cli._bench_workloads(args)}
    assert got == {(t, 64, n) for t in (512, 2048) for n in (32768, 1 << 20)}
    default = cli._parser().parse_args(["bench", "--phase", "all", "--preset", "glm5-tp8"])
    assert {w.t for w in cli._bench_workloads(default) if w.phase == "prefill"} == {4096, 16384}
    for bad in ("", "512,x", "0,2048"):
        with pytest.raises(SystemExit):
            cli._parser().parse_args(["bench", "--prefill-tokens", bad])


def test_bench_options_refused_before_any_work(monkeypatch, capsys):
    """bench refuses what it cannot honour before it times anything: an unknown format (by
    name), --plot without matplotlib (naming the extra), and the attention's options with
    --phase indexer."""
    import importlib.util

    from triton_sparse_mla import cli

    with pytest.raises(SystemExit):
        cli._parser().parse_args(["bench", "--formats", "bf16,fp16"])
    args = cli._parser().parse_args(["bench", "--formats", "fp8_ds_mla", "--preset", "glm5-tp8"])
    assert {w.fmt for w in cli._bench_workloads(args)} == {"fp8_ds_mla"}
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    assert cli.main(["bench", "--plot", "roofline.png"]) == 2
    assert "triton-sparse-mla[bench]" in capsys.readouterr().err
    assert cli.main(["bench", "--phase", "indexer", "--formats", "bf16", "--no-torch"]) == 2
    assert "--formats, --no-torch" in capsys.readouterr().err


def test_eager_timing_queues_an_untimed_call_first(monkeypatch):
    """Prefill rows are timed eagerly (``time_us(fn, graph=False)``): each group of
    ``EAGER_REPS`` timed calls is queued behind one untimed call, so that the first timed call's
    host work overlaps a busy device instead of lying between the events; the time reported is
    the events' interval over the timed calls only."""
    log = []

    class FakeEvent:
        def __init__(self, enable_timing):
            self.at = None

        def record(self):
            self.at = len(log)
            log.append("event")

        def synchronize(self):
            pass

        def elapsed_time(self, end):  # ms: 1 per call queued between the two events
            return float(sum(1 for x in log[self.at:end.at] if x == "call"))

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    assert bench._eager_ms(lambda: log.append("call"), 4, lead=True) == 1.0
    assert log == ["call", "event"] + ["call"] * 4 + ["event"]
    log.clear()
    assert bench.time_us(lambda: log.append("call"), graph=False) == 1e3
    groups = "".join("c" if x == "call" else "|" for x in log)
    # compile call, one single call timed, then three groups, each behind an untimed call
    assert groups == "c" + "|c|" + ("c|" + "c" * bench.EAGER_REPS + "|") * 3, groups


@pytest.mark.parametrize("graph", [False, True])
def test_calls_a_row_compares_take_turns(graph, monkeypatch):
    """A row's calls are timed in turn, ``ROUNDS`` turns each, each call's time the median of
    its own turns, so that FlashMLA is not timed on a cooler GPU than ours (run 311: 10-17%
    apart). Prefill (eager) heats every call first and a turn is a group of queued calls;
    decode takes turns over a share of the replay time, unheated."""
    log = []
    monkeypatch.setattr(bench, "heat", lambda fn: log.append(("heat", fn.__name__)))
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def turn(fn, *args, **kwargs):
        want = ((), {"rep_ms": bench.REP_MS / bench.ROUNDS}) if graph else \
            ((bench.EAGER_REPS,), {"lead": True})
        assert (args, kwargs) == want
        log.append(("turn", fn.__name__))
        return next(times[fn.__name__])

    monkeypatch.setattr(bench, "time_us" if graph else "_eager_ms", turn)

    def a():
        pass

    def b():
        pass

    unit = 1.0 if graph else 1e3  # (time_us gives us, _eager_ms ms)
    assert bench.time_in_turn([a, b], graph) == [2.0 * unit, 5.0 * unit]
    heated = [] if graph else [("heat", "a"), ("heat", "b")]
    assert log == heated + [("turn", "a"), ("turn", "b")] * bench.ROUNDS
