"""Compile every shipped configuration for every target GPU, without a GPU.

For each architecture family in :data:`configs.CONFIGS` and each compile target of that family,
the main kernel is compiled (both formats, final and partial outputs, with and without rope;
on SM90 also the Gluon kernel of tiles that name it), and so are the combine kernel, the
fp8 prefill workspace's kernels, the DSA indexer's score kernels (with their registers) and
the SM80/86 cache-row kernels; the shared memory each needs is compared with the family's
limit.
Pointer and stride arguments are hinted divisible by 16, as real launches specialise them, so
the software pipeline (and its shared memory) is the one a real launch gets.

Must run without ``TRITON_INTERPRET=1`` (the CLI and the test run it in a subprocess).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import configs
from .kernels.attention import gluon_module
from .kernels.common import LAUNCH_OPTIONS

_PTR = {"bf16": "*bf16", "u8": "*u8", "i32": "*i32", "fp32": "*fp32"}


def _jit_fn(kernel):
    # Under the interpreter @triton.jit gives a wrapper holding the JITFunction in ``fn``.
    return kernel if hasattr(kernel, "arg_names") else kernel.fn


def _compile(kernel, types: dict, constexprs: dict, divisible: set, cap: int, warps: int, stages: int,
             **options):
    fn = _jit_fn(kernel)
    names = fn.arg_names
    signature = {}
    for name in names:
        signature[name] = "constexpr" if name in constexprs else types[name]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    if type(fn).__name__ == "GluonJITFunction":  # kernels/gluon_sm90.py
        from triton.experimental.gluon._runtime import GluonASTSource as source
    else:
        source = ASTSource
    src = source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    target = GPUTarget("cuda", cap, 32)
    return triton.compile(src, target=target,
                          options={"num_warps": warps, "num_stages": stages, **LAUNCH_OPTIONS, **options})


def _resource_usage(compiled) -> str | None:
    """``cuobjdump -res-usage`` of ``compiled``'s cubin, with the ``cuobjdump`` that ships with
    Triton (None where it is missing)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        return subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout


def _usage_field(compiled, field: str) -> int | None:
    usage = _resource_usage(compiled)
    found = re.search(field + r":(\d+)", usage) if usage is not None else None
    return int(found.group(1)) if found else None


def registers(compiled) -> int | None:
    """Registers a thread of ``compiled`` uses, read from its cubin (None where the tool that
    reads it is missing)."""
    return _usage_field(compiled, "REG")


def stack_bytes(compiled) -> int | None:
    """Bytes of stack a thread of ``compiled`` uses (spilled registers, for these kernels), read
    from its cubin as :func:`registers`."""
    return _usage_field(compiled, "STACK")


def _main_kernel_variants(tile: configs.TileConfig, cap: int, fp8: bool, family: str):
    import torch

    from .kernels.attention import operand_dtype, sparse_mla_fwd_kernel

    dtype, q_scale = operand_dtype(torch.bfloat16, fp8 and tile.triton_fp8_f16)

    kv_t = "*u8" if fp8 else "*bf16"
    for partial in (False, True):
        for d_pe in ((64,) if fp8 else (64, 0)):
            types = {
                "q_nope_ptr": "*bf16", "q_pe_ptr": "*bf16", "kv_ptr": kv_t, "idx_ptr": "*i32",
                "len_ptr": "*i32", "sink_ptr": "*fp32",
                "out_ptr": "*fp32" if partial else "*bf16", "lse_ptr": "*fp32",
                "qk_scale": "fp32",
            }
            if tile.scratch_exchange:
                types.update(scratch_p_ptr="*bf16", scratch_alpha_ptr="*fp32")
            ints = [n for n in _jit_fn(sparse_mla_fwd_kernel).arg_names
                    if n.startswith(("n_", "topk", "split_size", "stride_"))]
            types.update({n: "i32" for n in ints})
            constexprs = dict(D_PE=d_pe, FP8=fp8, FP8_CVT=configs.fp8_cvt_level(divmod(cap, 10)) if fp8 else 0, HAS_LEN=True,
                              HAS_SINK=True, PARTIAL=partial, BLOCK_H=tile.block_h,
                              BLOCK_N=tile.block_n, INTERPRET=False,
                              PIN_CVT=fp8 and configs.pin_fp8_conversion(family, tile.block_h),
                              EXCHANGE_P=tile.scratch_exchange, PREFETCH_IDX=tile.prefetch_idx,
                              FP8_F16=fp8 and tile.triton_fp8_f16, Q_SCALE=q_scale,
                              ROWS_AHEAD=fp8 and tile.rows_ahead,
                              ROWS_EARLY=fp8 and tile.rows_ahead and tile.rows_early,
                              SCORES_APART=tile.scores_apart,
                              **({} if tile.scratch_exchange else dict(scratch_p_ptr=None, scratch_alpha_ptr=None)),
                              DTYPE=tl.float16 if dtype == torch.float16 else tl.bfloat16)
            # Rows of 576 bf16 values and of 656 bytes both keep 16-byte alignment.
            divisible = {n for n in types if n.endswith("_ptr")} | {
                n for n in ints if n.startswith("stride_")}
            yield (f"fwd partial={int(partial)} d_pe={d_pe}", sparse_mla_fwd_kernel, types,
                   constexprs, divisible, tile.num_warps, tile.num_stages)


def _gluon_variants(tile: configs.TileConfig, fp8: bool):
    """The Gluon kernels of a tile with ``gluon`` (kernels/gluon_sm90.py; SM90 only) for a row
    format, final and partial outputs, with the tile's constexprs as the launcher sets them."""
    from .kernels import gluon_sm90 as g

    kernel, tile_constexprs, num_warps = g.tile_variant(tile, fp8)
    names = _jit_fn(kernel).arg_names
    for partial in (False, True):
        types = {n: "i32" for n in names if n.startswith(("n_", "topk", "split_size", "stride_"))}
        types.update(q_nope_ptr="*bf16", q_pe_ptr="*bf16", kv_ptr="*u8" if fp8 else "*bf16",
                     idx_ptr="*i32", len_ptr="*i32", sink_ptr="*fp32",
                     out_ptr="*fp32" if partial else "*bf16", lse_ptr="*fp32", qk_scale="fp32")
        constexprs = dict(dict(HAS_LEN=True, HAS_SINK=True, PARTIAL=partial, BLOCK_H=g.BLOCK_H,
                               BLOCK_N=g.BLOCK_N, LAT=g.LAT, D_PE=g.D_PE), **tile_constexprs)
        divisible = {n for n in types if n.endswith("_ptr") or n.startswith("stride_")}
        yield (f"gluon partial={int(partial)}", kernel, types, constexprs, divisible, num_warps, 1,
               g.launch_options(tile, fp8))


def _combine_variant():
    from .kernels.combine import BLOCK_HC, NUM_WARPS, combine_kernel

    names = _jit_fn(combine_kernel).arg_names
    types = {n: "*fp32" for n in names if n.endswith("_ptr")}
    types["out_ptr"] = "*bf16"
    types.update({n: "i32" for n in names if n.startswith(("n_", "stride_"))})
    constexprs = dict(HAS_SINK=True, BLOCK_S=64, BLOCK_HC=BLOCK_HC, D_V=512)
    divisible = {n for n in types if n.endswith("_ptr")}
    return ("combine S=64", combine_kernel, types, constexprs, divisible, NUM_WARPS, 1)


def _workspace_variants(cap: int):
    """The three kernels of the fp8 prefill workspace (triton_sparse_mla.workspace)."""
    from . import workspace
    from .kernels.dedup import mark_rows_kernel, remap_kernel, upconvert_kernel

    idx = {"idx_ptr": "*i32", "len_ptr": "*i32", "n_rows": "i32", "topk": "i32",
           "stride_idx_t": "i32"}
    k = dict(HAS_LEN=True, BLOCK_K=workspace._BLOCK_K)
    yield ("mark", mark_rows_kernel, idx | {"mark_ptr": "*i32", "t_first": "i32"}, k,
           {"idx_ptr", "mark_ptr"}, 4, 1)
    yield ("remap", remap_kernel, idx | {"pos_ptr": "*i32", "new_idx_ptr": "*i32", "n_slots": "i32",
                                         "stride_new_t": "i32"},
           k, {"idx_ptr", "pos_ptr", "new_idx_ptr"}, 4, 1)
    types = {"kv_ptr": "*u8", "pos_ptr": "*i32", "ws_ptr": "*bf16", "n_rows": "i32",
             "n_slots": "i32", "stride_kv": "i32", "stride_ws": "i32"}
    k = dict(FP8_CVT=configs.fp8_cvt_level(divmod(cap, 10)), D_PE=64, BLOCK_R=workspace._BLOCK_R,
             INTERPRET=False)
    yield ("upconvert", upconvert_kernel, types, k,
           {"kv_ptr", "pos_ptr", "ws_ptr", "stride_kv", "stride_ws"}, 4, 1)
    yield ("upconvert (rows at their ids)", upconvert_kernel, types, k | {"pos_ptr": None},
           {"kv_ptr", "ws_ptr", "stride_kv", "stride_ws"}, 4, 1)


def _indexer_variants(family: str, cap: int):
    """The DSA indexer's score kernels at the models' shapes (64 heads of 128, cache blocks of 64
    tokens; decode with 1, 2 and 4 rows per request): both prefill kernels on every target (the
    family's own, :data:`.indexer.flat.HEADS_ALONG_N`, and the other, which the measurement knob
    can select), and the decode kernel at ``family``'s pipeline depth."""
    from .indexer import flat, flat_heads, paged

    cvt = configs.fp8_cvt_level(divmod(cap, 10))
    products_fp8 = flat.fp8_dot(cvt, False)
    names = _jit_fn(flat.mqa_logits_kernel).arg_names
    types = {n: "i32" for n in names}
    types.update(q_ptr="*u8", k_ptr="*u8", k_scale_ptr="*fp32", w_ptr="*fp32",
                 starts_ptr="*i32", ends_ptr="*i32", out_ptr="*fp32")
    aligned = ({n for n in names if n.endswith("_ptr") and n not in ("starts_ptr", "ends_ptr")}
               | {"stride_qm", "stride_qh", "stride_kn", "stride_wm"})
    t = flat.tile(products_fp8)
    k = dict(H=64, D=128, BLOCK_M=t.block_m, BLOCK_N=t.block_n, FP8_CVT=cvt, INTERPRET=False,
             FP8_DOT=products_fp8)
    yield ("mqa_logits", flat.mqa_logits_kernel, types, k, aligned, t.num_warps, t.num_stages)
    g, block_h = flat_heads.rows_per_program(64)
    h = flat_heads.TILE
    k = dict(H=64, BLOCK_H=block_h, G=g, D=128, BLOCK_N=h.block_n, FP8_CVT=cvt, INTERPRET=False,
             FP8_DOT=products_fp8, LOOP_STAGES=h.num_stages)
    yield ("mqa_logits_heads", flat_heads.mqa_logits_heads_kernel, types, k, aligned,
           h.num_warps, h.num_stages)
    names = _jit_fn(paged.paged_mqa_logits_kernel).arg_names
    types = {n: "i32" for n in names}
    types.update(q_ptr="*u8", cache_ptr="*u8", w_ptr="*fp32", limits_ptr="*i32",
                 table_ptr="*i32", out_ptr="*fp32")
    for next_n, heads in ((1, 64), (2, 64), (2, 32), (4, 32)):
        g, block_h, warps = paged.tile(next_n, heads)
        k = dict(NEXT_N=next_n, G=g, H=heads, BLOCK_H=block_h, D=128, BLOCK_SIZE=64,
                 FP8_CVT=cvt, INTERPRET=False, FP8_DOT=products_fp8,
                 LOOP_STAGES=paged.NUM_STAGES[family])
        cap_regs = paged.register_cap(paged.resident_programs(products_fp8, g * block_h), warps)
        yield (f"paged_mqa_logits next_n={next_n} H={heads}", paged.paged_mqa_logits_kernel, types, k,
               {n for n in names if n.endswith("_ptr")}
               | {"stride_cb", "stride_qb", "stride_qn", "stride_qh", "stride_wr"},
               warps, paged.NUM_STAGES[family], dict(maxnreg=cap_regs))


def _fp8_rows_variants():
    """The fp8 row builders the vLLM plugin uses below SM89 (kernels/fp8_rows.py), as its
    replacements call them (bf16 inputs, 128-value indexer rows, NeoX and interleaved rope)."""
    from .kernels import fp8_rows

    names = _jit_fn(fp8_rows.indexer_rows_kernel).arg_names
    types = {n: "i32" for n in names}
    types.update(x_ptr="*bf16", ln_w_ptr="*fp32", ln_b_ptr="*fp32", cos_sin_ptr="*fp32", pos_ptr="*i64",
                 out_ptr="*u8", slot_ptr="*i64", w_ptr="*bf16", w_out_ptr="*fp32", eps="fp32",
                 w_factor_a="fp32", w_factor_b="fp32")
    for interleave in (False, True):
        for keys in (True, False):
            constexprs = dict(D=128, HALF=32, INTERLEAVE=interleave, LN=keys, WEIGHTS=not keys)
            unused = ("w_ptr", "w_out_ptr") if keys else ("ln_w_ptr", "ln_b_ptr", "slot_ptr")
            constexprs.update(dict.fromkeys(unused))
            yield (f"indexer_rows {'keys' if keys else 'queries'} interleave={int(interleave)}",
                   fp8_rows.indexer_rows_kernel, types, constexprs, set(), 1, 1)
    names = _jit_fn(fp8_rows.ds_mla_rows_kernel).arg_names
    types = {n: "i32" for n in names}
    types.update(kv_ptr="*bf16", w_ptr="*bf16", kpe_ptr="*bf16", out_ptr="*u8", slot_ptr="*i64",
                 eps="fp32")
    yield ("ds_mla_rows", fp8_rows.ds_mla_rows_kernel, types,
           dict(LAT=fp8_rows.LAT, TILE=fp8_rows.TILE, D_PE=fp8_rows.D_PE), set(), 4, 1)
    names = _jit_fn(fp8_rows.interleaved_rope_kernel).arg_names
    types = {n: "i32" for n in names}
    types.update(x_ptr="*bf16", cos_sin_ptr="*fp32", pos_ptr="*i64", out_ptr="*bf16")
    yield ("interleaved_rope", fp8_rows.interleaved_rope_kernel, types, dict(HALF=32), set(), 1, 1)


def check_all(families=None) -> list[dict]:
    """Compile everything; return one record per (family, target, config, variant)."""
    records = []
    for family in families or sorted(configs.CONFIGS):
        limit = configs.SMEM_LIMIT[family]
        for cap in configs.FAMILY_TARGETS[family]:
            jobs, gluon_done = [], set()
            for phase, kind, tile in configs.all_tiles(family):
                key = configs.tile_key(phase, kind, tile)
                # (a Gluon tile's Triton kernel: the tile that runs where Gluon does not apply)
                triton_tile = tile.without_gluon() if tile.gluon else tile
                jobs.extend((key, v) for v in _main_kernel_variants(triton_tile, cap, kind == "fp8", family))
                # (its Gluon kernels once per shape and kind: entries differing only in their
                # fallback compile the same ones)
                gluon_tile = (kind, dataclasses.replace(tile, fallback=None))
                if tile.gluon and cap // 10 == 9 and gluon_module() is not None and gluon_tile not in gluon_done:
                    gluon_done.add(gluon_tile)
                    jobs.extend((key, v) for v in _gluon_variants(tile, kind == "fp8"))
            jobs.append(("combine", _combine_variant()))
            jobs.extend(("workspace", v) for v in _workspace_variants(cap))
            jobs.extend(("indexer", v) for v in _indexer_variants(family, cap))
            jobs.extend(("fp8 rows", v) for v in _fp8_rows_variants())
            # (a variant's eighth entry, where it has one: further compile options, as its launch)
            for key, (label, kernel, types, constexprs, divisible, warps, stages, *options) in jobs:
                rec = dict(family=family, target=f"sm{cap}", config=key, variant=label,
                           num_warps=warps, num_stages=stages, limit=limit)
                try:
                    compiled = _compile(kernel, types, constexprs, divisible, cap, warps, stages,
                                        **(options[0] if options else {}))
                    rec.update(shared=compiled.metadata.shared, ok=compiled.metadata.shared <= limit,
                               error=None)
                    if key == "indexer":  # (tests/test_portability.py checks paged.RESIDENT)
                        rec.update(registers=registers(compiled))
                except Exception as exc:  # a failure to compile is a result to report
                    rec.update(shared=None, ok=False, error=f"{type(exc).__name__}: {exc}"[-800:])
                records.append(rec)
    return records


def main(argv=None) -> int:
    """Print a table (and write JSON with ``--json FILE``); exit 1 if any configuration fails
    or overflows."""
    argv = sys.argv[1:] if argv is None else argv
    records = check_all()
    if "--json" in argv:
        # A JSON file, not stdout: Triton prints compiler diagnostics to stdout.
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump(records, f, indent=1)
    print(f"{'family':7} {'target':6} {'config':28} {'variant':24} {'smem KB':>8} {'limit':>6}  verdict")
    for r in records:
        smem = "-" if r["shared"] is None else f"{r['shared'] / 1024:.1f}"
        verdict = "ok" if r["ok"] else ("FAIL " + (r["error"] or "over limit"))
        print(f"{r['family']:7} {r['target']:6} {r['config']:28} {r['variant']:24} {smem:>8} "
              f"{r['limit'] // 1024:>6}  {verdict}")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
