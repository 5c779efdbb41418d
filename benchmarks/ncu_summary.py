"""Summarise the SASS-level export of an Nsight Compute run (``device_run.sh ncu``).

Reads ``ncu --page source --csv --print-source sass`` output (gzip or plain), one block per
profiled kernel, and prints per kernel: the share of each warp-stall reason over all samples,
the executed instructions by opcode per loop step, the shared-memory wavefronts and global
sectors of each memory opcode against their ideal (bank conflicts, misaligned gathers), and the
instructions with the most stall samples, and the same per partition of a warp-specialized
kernel (its code between ``setmaxnreg`` instructions, USETMAXREG in SASS: in the Gluon kernels
the producer's and each consumer's loop). A step is one BLOCK_N-row tile of one warp: pass the
number of warp-steps the launch ran for each kernel (programs x warps x steps) to get per-step
counts.

Usage: python benchmarks/ncu_summary.py SOURCE.csv[.gz] [WARP_STEPS ...]
"""

import collections
import csv
import gzip
import sys


def kernels(path):
    """The CSV blocks of the export, one per profiled kernel, as (header, rows)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        blocks, cur = [], None
        for line in f.read().splitlines():
            if line.startswith('"Kernel Name"'):
                cur = []
                blocks.append(cur)
            elif cur is not None:
                cur.append(line)
    for block in blocks:
        rows = list(csv.reader(block))
        yield rows[0], rows[1:]


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def summarise(header, rows, warp_steps, top=12):
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    samples = col["Warp Stall Sampling (All Samples)"]
    executed = col["Instructions Executed"]
    stalls, mix, mix_stalls = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        for c in stall_cols:
            stalls[c[6:]] += int(r[col[c]] or 0)
        op = opcode(r[col["Source"]])
        mix[op] += int(r[executed] or 0)
        mix_stalls[op] += int(r[samples] or 0)
    total = sum(stalls.values()) or 1
    lines = [f"samples {total}, instructions executed {sum(mix.values())}"
             + (f", per warp-step {sum(mix.values()) / warp_steps:.0f}" if warp_steps else "")]
    lines.append("stalls: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in stalls.most_common(8)))
    per = warp_steps or 1
    lines.append("opcodes (executed per warp-step, share of stall samples):")
    for op, n in mix.most_common(16):
        lines.append(f"  {op:10} {n / per:8.1f}  {100 * mix_stalls[op] / total:5.1f}%")
    lines.append("memory opcodes (shared wavefronts / ideal, L2 sectors / ideal, per warp-step):")
    lines.extend(memory_lines(col, rows, per))
    lines.append("most-sampled instructions:")
    lines.extend(top_lines(col, stall_cols, rows, top))
    lines.extend(partition_lines(col, stall_cols, rows, per))
    return "\n".join(lines)


def top_lines(col, stall_cols, rows, top, min_share=0.0, index=None):
    """The ``top`` most-sampled instructions (those with at least ``min_share`` of the rows'
    samples), each with its index (``index[i]`` for row ``i`` where given), samples and two main
    stall reasons."""
    samples = col["Warp Stall Sampling (All Samples)"]
    total = sum(int(r[samples] or 0) for r in rows) or 1
    out = []
    for i, r in sorted(enumerate(rows), key=lambda ir: -int(ir[1][samples] or 0))[:top]:
        if int(r[samples] or 0) < min_share * total:
            break
        reasons = sorted(((int(r[col[c]] or 0), c[6:]) for c in stall_cols), reverse=True)[:2]
        out.append(f"  {index[i] if index else i:5d} {int(r[samples]):7d} {100 * int(r[samples]) / total:5.1f}%  "
                   f"{r[col['Source']].strip()[:56]:56}  " + ", ".join(f"{name} {n}" for n, name in reasons))
    return out


def partition_lines(col, stall_cols, rows, per, min_share=0.05):
    """Per partition (the code between setmaxnreg instructions) holding at least ``min_share``
    of the samples: its samples, instructions per warp-step, main stall reasons and
    most-sampled instructions (indices as in the kernel's rows)."""
    samples = col["Warp Stall Sampling (All Samples)"]
    parts, cur = [], []
    for i, r in enumerate(rows):
        if "USETMAXREG" in r[col["Source"]] and cur:
            parts.append(cur)
            cur = []
        cur.append((i, r))
    parts.append(cur)
    total = sum(int(r[samples] or 0) for r in rows) or 1
    out = ["partitions (between setmaxnreg):"]
    for part in parts:
        n = sum(int(r[samples] or 0) for _, r in part)
        if n < min_share * total:
            continue
        stalls = collections.Counter()
        for _, r in part:
            for c in stall_cols:
                stalls[c[6:]] += int(r[col[c]] or 0)
        executed = sum(int(r[col["Instructions Executed"]] or 0) for _, r in part)
        out.append(f" rows {part[0][0]}-{part[-1][0]}: {n} samples, {executed / per:.0f} instructions"
                   + (" per warp-step; " if per != 1 else "; ")
                   + ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in stalls.most_common(5)))
        out.extend(top_lines(col, stall_cols, [r for _, r in part], 8, min_share=0.012,
                             index=[i for i, _ in part]))
    return out


MEMORY_COLUMNS = ("L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal",
                  "L2 Theoretical Sectors Global", "L2 Theoretical Sectors Global Ideal")


def memory_lines(col, rows, per):
    if any(c not in col for c in MEMORY_COLUMNS):
        return ["  (not in this export)"]
    sums = collections.defaultdict(lambda: [0.0] * len(MEMORY_COLUMNS))
    for r in rows:
        words = r[col["Source"]].split()
        words = words[1:] if words and words[0].startswith("@") else words
        op = ".".join(words[0].split(".")[:2]) if words else "?"  # LDS.128, LDGSTS.E, ...
        vals = [float((r[col[c]] or "0").replace(",", "")) for c in MEMORY_COLUMNS]
        if any(vals):
            sums[op] = [a + v for a, v in zip(sums[op], vals)]
    totals = [sum(v[i] for v in sums.values()) for i in range(len(MEMORY_COLUMNS))]
    out = []
    for op, (w, wi, g, gi) in sorted(sums.items(), key=lambda kv: -kv[1][0]) + [("all", totals)]:
        out.append(f"  {op:12} {w / per:9.1f} / {wi / per:9.1f}   {g / per:9.1f} / {gi / per:9.1f}")
    return out


def main(argv):
    steps = [float(x) for x in argv[1:]]
    for i, (header, rows) in enumerate(kernels(argv[0])):
        print(f"=== kernel {i}")
        print(summarise(header, rows, steps[i] if i < len(steps) else 0))


if __name__ == "__main__":
    main(sys.argv[1:])
