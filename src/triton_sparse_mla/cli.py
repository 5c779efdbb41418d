"""triton-sparse-mla: check the kernels on this machine, benchmark them, compile every
configuration for every GPU family, and show what vLLM would select."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def _reexec_with_interpreter_if_needed(argv):
    """Without a GPU, kernels must be built by the interpreter, which Triton decides when the
    kernels are defined (at import). Restart once with TRITON_INTERPRET=1 in that case."""
    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    os.execve(sys.executable, [sys.executable, "-m", "triton_sparse_mla.cli", *argv], env)


def _cmd_check(args) -> int:
    from .check import default_device, run_check

    ok = run_check(default_device())
    print("verdict: all checks passed" if ok else "verdict: FAILED")
    return 0 if ok else 1


def _bench_workloads(args) -> list:
    """The workloads ``bench``'s arguments name."""
    from . import bench

    heads = bench.PRESETS[args.preset]
    # (bench's own defaults where an option is not given)
    given = {} if args.formats is None else dict(formats=args.formats)
    tokens = {} if args.prefill_tokens is None else dict(tokens=args.prefill_tokens)
    workloads = []
    if args.phase in ("decode", "all"):
        workloads += bench.decode_workloads(heads, **given)
    if args.phase in ("prefill", "all"):
        workloads += bench.prefill_workloads(heads, **given, **tokens)
    return workloads


def _formats(text: str) -> tuple:
    """``--formats``: comma-separated KV cache formats of the attention's workloads."""
    from .bench import ROW_BYTES

    names = tuple(part for part in text.split(",") if part)
    unknown = [n for n in names if n not in ROW_BYTES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected formats among {sorted(ROW_BYTES)} separated by "
                                         f"commas, got {text!r}")
    return names


def _token_counts(text: str) -> tuple:
    """``--prefill-tokens``: comma-separated positive query-token counts."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return counts


def _indexer_workloads(args) -> list:
    """``bench --phase indexer``: the DSA indexer's workloads at the preset's model's indexer
    heads (DeepSeek-V3.2: 64, GLM-5: 32; every preset but a model's: both). The indexer's heads
    are not split by tensor parallelism."""
    from .indexer import bench as indexer_bench

    heads = {"deepseek": (64,), "glm5": (32,)}.get(args.preset.split("-")[0], (64, 32))
    return indexer_bench.workloads(heads)


def _cmd_bench(args) -> int:
    import torch

    from . import bench

    if args.phase == "indexer":
        ignored = [flag for flag, given in (("--formats", args.formats), ("--plot", args.plot),
                                            ("--no-baseline", args.no_baseline),
                                            ("--no-torch", args.no_torch),
                                            ("--prefill-tokens", args.prefill_tokens)) if given]
        if ignored:
            print(f"bench --phase indexer: only the attention's phases take {', '.join(ignored)}",
                  file=sys.stderr)
            return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("bench --plot needs matplotlib: pip install 'triton-sparse-mla[bench]'", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.phase == "indexer":
        from .indexer import bench as indexer_bench

        indexer_bench.run(_indexer_workloads(args), json_path=args.json or "bench-indexer.json")
        return 0
    workloads = _bench_workloads(args)
    bench.run_bench(workloads, json_path=args.json or "bench.json", plot_path=args.plot,
                    baseline=not args.no_baseline, torch_baseline=not args.no_torch)
    return 0


def _cmd_compile_check(args) -> int:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    argv = ["--json", args.json] if args.json else []
    if env != dict(os.environ):
        os.execve(sys.executable, [sys.executable, "-m", "triton_sparse_mla.portability", *argv], env)
    from .portability import main

    return main(argv)


def _cmd_vllm(args) -> int:
    try:
        from .vllm_plugin.selection import describe_selection
    except ImportError as exc:
        print(f"vLLM integration unavailable: {exc}")
        return 1
    print(describe_selection())
    return 0


# bench's presets (bench.PRESETS' head counts), as the help describes them
_PRESET_HELP = {
    "all": "8, 16, 32, 64 and 128",
    "glm5-tp8": "8 (GLM-5 at TP8)",
    "deepseek-v32-tp8": "16 (DeepSeek-V3.2 at TP8)",
    "tp4": "32 (a 128-head model at TP4)",
    "glm5-tp1": "64 (GLM-5 at TP1)",
    "deepseek-v32-tp1": "128 (DeepSeek-V3.2 at TP1)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-sparse-mla", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="run the kernels on embedded problems against the float64 reference "
                                 "(on a CPU through Triton's interpreter)")
    p = sub.add_parser("bench", help="time the kernels (and FlashMLA when importable) on this GPU")
    p.add_argument("--phase", choices=["decode", "prefill", "all", "indexer"], default="decode",
                   help="the attention's decode or prefill workloads, or both (all); or the DSA "
                        "indexer's scores (indexer: beside DeepGEMM where it runs) (default: decode)")
    p.add_argument("--preset", choices=list(_PRESET_HELP), default="all",
                   help="head counts: " + "; ".join(f"{k}: {v}" for k, v in _PRESET_HELP.items())
                        + " (default: all). With --phase indexer a model's preset runs its "
                          "indexer's heads (DeepSeek-V3.2 64, GLM-5 32), any other both")
    p.add_argument("--formats", type=_formats, default=None, metavar="F,F,...",
                   help="KV cache formats of the attention's workloads, among bf16 and fp8_ds_mla "
                        "(default: both)")
    p.add_argument("--prefill-tokens", type=_token_counts, default=None, metavar="T,T,...",
                   help="query tokens of the prefill workloads (default: 4096,16384); vLLM 0.34's "
                        "ShardQ runs T/tp tokens with every rank's heads: e.g. --preset glm5-tp1 "
                        "--prefill-tokens 512,2048 beside --preset glm5-tp8")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="where to write the full results, after every workload (default: bench.json, "
                        "bench-indexer.json with --phase indexer)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw a roofline plot here (needs matplotlib: the bench extra)")
    p.add_argument("--no-baseline", action="store_true", help="skip FlashMLA")
    p.add_argument("--no-torch", action="store_true", help="skip the plain-PyTorch baseline")
    p = sub.add_parser("compile-check", help="compile every configuration for sm80..sm120 (a few "
                                             "minutes on a CPU); check shared memory")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every record here")
    sub.add_parser("vllm", help="show which attention backend vLLM would select here, and why")
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.command == "check":
        _reexec_with_interpreter_if_needed(argv)
    handler = {"check": _cmd_check, "bench": _cmd_bench, "compile-check": _cmd_compile_check,
               "vllm": _cmd_vllm}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
