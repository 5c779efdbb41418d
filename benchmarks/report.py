"""Render a bench JSON (written by `triton-sparse-mla bench --json`) as a Markdown table.

Usage: python benchmarks/report.py RESULTS.json [...]
"""

import json
import sys


def render(path: str) -> str:
    rec = json.load(open(path))
    h, c = rec["header"], rec["ceilings"]
    lines = [
        f"`{path}`: {h['date']}, {h['gpu']} (sm_{h['capability'][0]}{h['capability'][1]}, "
        f"{h['sm_count']} SMs), torch {h['torch']}, Triton {h['triton']}, CUDA {h['cuda']}, "
        f"flash_mla {h['flash_mla']}. Ceilings measured in the same run: copy "
        f"{c['copy_GBps']:.0f} GB/s, bf16 matmul {c['matmul_TFLOPs']:.0f} TFLOP/s.",
        "",
        "| workload | ours (us) | FlashMLA (us) | FlashMLA / ours | floor (us) | GB/s | TFLOP/s | copy share | matmul share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    # Runs from 2026-12-01 on also time the PyTorch baseline and check the output.
    extra = any("rel_err" in r for r in rec["results"])
    if extra:
        lines[-2] += " PyTorch (us) | rel. error |"
        lines[-1] += "---:|---:|"
    for r in rec["results"]:
        fm = r["flashmla_us"]
        lines.append(
            f"| {r['workload']['name']} | {r['ours_us']:.1f} | {fm:.1f} | {fm / r['ours_us']:.2f} |"
            if fm else f"| {r['workload']['name']} | {r['ours_us']:.1f} | - | - |")
        lines[-1] += (f" {r['floor_us']:.1f} | {r['gbps']:.0f} | {r['tflops']:.1f} | "
                      f"{100 * r['copy_share']:.0f}% | {100 * r['matmul_share']:.0f}% |")
        if extra:
            pt, err = r.get("torch_us"), r.get("rel_err")
            lines[-1] += (f" {pt:.1f} |" if pt else " - |") + (f" {err:.1e} |" if err is not None else " - |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(render(p) for p in sys.argv[1:]))
