"""Every shipped configuration compiles for sm80, sm86, sm89, sm90, sm100 and sm120 and fits
that architecture's shared memory. Compiling needs no GPU, but it must not run under the
interpreter, so it runs in a subprocess without TRITON_INTERPRET."""

import json
import os
import re
import subprocess
import sys

import pytest

from triton_sparse_mla import configs, portability
from triton_sparse_mla.indexer import paged
from triton_sparse_mla.kernels.attention import GLUON_TRITON, gluon_triton


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
            key = configs.tile_key(phase, kind, tile)
            hits = [r for r in records if r["family"] == family and r["config"] == key]
            assert hits and all(r["shared"] <= configs.SMEM_LIMIT[family] for r in hits)
    # The split rule never counts more resident programs than the shared memory per SM holds;
    # on the sm86 family, shared memory is what decides.
    # (sm80, not measured, keeps sm90's count for its 4-warp tiles; two of them fit only one.)
    tiles = {(family, configs.tile_key(phase, kind, tile)): tile
             for family in configs.CONFIGS for phase, kind, tile in configs.all_tiles(family)}
    assert len(tiles) == sum(len(configs.all_tiles(f)) for f in configs.CONFIGS)  # (keys unique)
    for r in records:
        if r["config"] in ("combine", "workspace", "indexer", "fp8 rows") or r["family"] == "sm80":
            continue
        tile = tiles[r["family"], r["config"]]  # (its Triton kernel: the tile without Gluon)
        tile = tile.without_gluon() if tile.gluon and r["variant"].startswith("fwd") else tile
        claim = configs.programs_per_sm(r["family"], tile)
        fits = configs.fit_by_shared_memory(r["shared"], int(r["target"][2:]))
        assert claim <= fits if r["family"] != "sm86" else claim == fits, r
    # The indexer's decode launch counts on paged.RESIDENT programs an SM: never more than the
    # compiled kernel's registers and shared memory let one SM hold (more would start a second,
    # partial wave).
    paged_records = [r for r in records if r["variant"].startswith("paged_mqa_logits")]
    assert paged_records
    for r in paged_records:
        next_n, heads = (int(x) for x in re.findall(r"=(\d+)", r["variant"]))
        g, block_h, warps = paged.tile(next_n, heads)
        cap = int(r["target"][2:])
        claim = paged.resident_programs(cap >= 89, g * block_h)
        if r["registers"] is not None:  # (None: no cuobjdump beside this Triton)
            allocated = -(-r["registers"] // 8) * 8 * 32 * warps  # (8 registers a thread at a time)
            assert claim <= 65536 // allocated, r
        assert claim <= configs.fit_by_shared_memory(r["shared"], cap), r
    assert proc.returncode == 0


# The Gluon kernels' compile checks, where this Triton has the Gluon calls they use (elsewhere
# the planner never runs them: tests/test_attention.py, test_gluon_only_on_its_triton_versions)
_NEEDS_GLUON = pytest.mark.skipif(not gluon_triton(),
                                  reason=f"the Gluon kernels need Triton in {GLUON_TRITON}")


def _probe(script, tmp_path):
    """Run a compile probe (it must not run under the interpreter) and return its JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-c", script, str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-2000:]
    return json.loads(out.read_text())


_PIN_PROBE = r"""
import json, re, sys
from triton_sparse_mla import configs, portability
out = {}
for cap, family in ((90, "sm90"), (120, "sm86"), (89, "sm86"), (80, "sm80")):
    tile = configs.TileConfig(16, 32, 4, 2)
    label, kernel, types, cx, div, warps, stages = next(
        v for v in portability._main_kernel_variants(tile, cap, True, family) if "partial=0" in v[0])
    for pin in (False, True):
        ptx = portability._compile(kernel, types, dict(cx, PIN_CVT=pin), div, cap, warps, stages).asm["ptx"]
        out[f"sm{cap}/{pin}"] = dict(cp_async=len(re.findall(r"cp\.async\.c[ga]\.shared\.global", ptx)),
                                    ld_global=len(re.findall(r"ld\.global\.v4", ptx)),
                                    lds_v2=len(re.findall(r"ld\.shared\.v2", ptx)),
                                    ldmatrix=len(re.findall(r"ldmatrix\.", ptx)),
                                    cvt=len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx)),
                                    byte_lds=len(re.findall(r"ld\.shared\.[usb]8", ptx)))
json.dump(out, open(sys.argv[1], "w"))
"""


def test_fp8_conversion_is_pinned_where_loaded(tmp_path):
    """The pin (kernels/common.convert_here) keeps a 16-head fp8 tile's dequantization where it
    is loaded. Without it Triton 3.6 moves the work into the MMA operand layout: each value
    converted twice and the operands read from shared memory in 8-byte pieces instead of by
    ldmatrix (before the tiles were loaded as words, byte-wide reads and plain global loads
    too; on SM90 1158 instead of 883 SASS instructions per 32-row step, 1.37x slower on the
    H200). Triton 3.8 leaves the words' conversion where it is either way. Checked in the PTX of
    the hardware conversion (sm90, sm120, sm89) and of integer decoding (sm80): the pinned form
    has the latent words in the asynchronous-copy pipeline, no byte-wide shared reads, operands
    by ldmatrix and each value converted once; the free form is never better."""
    counts = _probe(_PIN_PROBE, tmp_path)
    for cap in ("sm90", "sm120", "sm89", "sm80"):
        free, pinned = counts[f"{cap}/False"], counts[f"{cap}/True"]
        # 16 cp.async sites for the latent words, the rope, scales and ids beside them
        assert pinned["cp_async"] >= 24 and pinned["byte_lds"] == 0, (cap, counts)
        # operands come by ldmatrix (72 sites), not piecewise shared-memory reads
        assert pinned["ldmatrix"] >= 64 and pinned["lds_v2"] <= 24, (cap, counts)
        assert free["ldmatrix"] <= pinned["ldmatrix"] and free["lds_v2"] >= pinned["lds_v2"], (cap, counts)
        if cap != "sm80":  # sm80 decodes e4m3 with integer operations, no cvt
            # each value once: 32 rows x 512 bytes over 128 threads, two values per cvt
            assert pinned["cvt"] == 32 * 512 // (128 * 2) and pinned["cvt"] <= free["cvt"], (cap, counts)


_EXCHANGE_PROBE = r"""
import json, re, sys
from triton_sparse_mla import configs, portability
out = {}
for fp8 in (False, True):
    for exchange in (False, True, "apart"):
        # (scores_apart at 32 rows and 3 stages: at 64 rows Triton 3.8 needs 232 KB for bf16)
        tile = (configs.TileConfig(64, 32, 8, 3, scores_apart=True) if exchange == "apart"
                else configs.TileConfig(64, 64, 8, 2, exchange_p=exchange))
        label, kernel, types, cx, div, warps, stages = next(
            v for v in portability._main_kernel_variants(tile, 90, fp8, "sm90") if "partial=1 d_pe=64" in v[0])
        k = portability._compile(kernel, types, cx, div, 90, warps, stages)
        ptx = k.asm["ptx"]
        out[f"{fp8}/{exchange}"] = dict(
            qk=len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile.block_n // 2}k16", ptx)),
            pv=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)),
            cp_async=len(re.findall(r"cp\.async\.c[ga]\.shared\.global", ptx)), shared=k.metadata.shared)
        if exchange:
            # Op order inside the main loop: scratch stores (none with scores_apart), then the
            # barrier.
            lines = k.asm["ttgir"].splitlines()
            start = next(i for i, line in enumerate(lines) if "scf.for" in line)
            indent = lines[start][:len(lines[start]) - len(lines[start].lstrip())]
            end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(indent + "}"))
            body = lines[start + 1:end]
            out[f"{fp8}/{exchange}"].update(
                stores=[i for i, line in enumerate(body) if "tt.store" in line],
                barriers=[i for i, line in enumerate(body) if "bar.sync" in line])
json.dump(out, open(sys.argv[1], "w"))
"""


def test_probabilities_through_scratch_halve_the_score_work(tmp_path):
    """On SM90 a 64-head, 64-row tile computes its 64 x 64 score tile in both warpgroups, with
    instructions half the tile wide: 72 per step where one pass over the 576 columns takes 36
    (Triton lays out a dot that feeds another dot with every warp along M). With the
    probabilities through the scratch slot (``exchange_p``) each warpgroup computes half: 36.
    The PV work and the asynchronous-copy pipeline stay. With the scores and softmax in a
    region of their own (``scores_apart``) the compiler splits the score tile itself. If a
    Triton release stops replicating the plain tile, the first assertion says so, and neither
    has a reason left."""
    counts = _probe(_EXCHANGE_PROBE, tmp_path)
    for fp8 in ("False", "True"):
        plain, exchanged = counts[f"{fp8}/False"], counts[f"{fp8}/True"]
        assert plain["qk"] == 2 * 576 // 16, counts
        assert exchanged["qk"] == 576 // 16 and exchanged["pv"] == plain["pv"] == 4 * 64 // 16, counts
        assert exchanged["cp_async"] > 0 and exchanged["shared"] <= configs.SMEM_LIMIT["sm90"], counts
        # The barrier orders the scratch stores before the loads that read them back (whose
        # addresses depend on its result). Triton may move it, as it is opaque to its passes:
        # once with a branch that depended on it, it moved above the stores, a race (a rejected
        # experiment, BENCHMARKS.md "Lazy rescaling"). The shipped loop keeps the order.
        stores, barriers = exchanged["stores"], exchanged["barriers"]
        assert len(stores) == 2 and len(barriers) == 1 and max(stores) < barriers[0], counts
        # With the scores and softmax in a region of their own (scores_apart) the compiler lays
        # the score dots out across both warpgroups by itself, and the probabilities reach the
        # PV dots through its shared memory: 36 per 32-row step, each warpgroup half of the
        # rows (64x16 instructions), and no scratch slot.
        apart = counts[f"{fp8}/apart"]
        assert apart["qk"] == 576 // 16 and apart["pv"] == plain["pv"] // 2, counts
        assert apart["stores"] == [] and apart["barriers"] == [], counts
        assert apart["cp_async"] > 0 and apart["shared"] <= configs.SMEM_LIMIT["sm90"], counts


_GLUON_PROBE = r"""
import json, re, sys
from triton_sparse_mla import configs, portability
out = {}
for f16, wide in ((False, False), (True, False), (True, True)):
    tile = configs.TileConfig(64, 64, 8, 2, exchange_p=True, gluon=True, fp8_f16=f16, wide_producer=wide)
    for label, kernel, types, cx, div, warps, stages, opts in portability._gluon_variants(tile, True):
        k = portability._compile(kernel, types, cx, div, 90, warps, stages, **opts)
        ptx = k.asm["ptx"]
        out[f"{f16}/{wide}/{label}"] = dict(
            shared=k.metadata.shared, qk=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16", ptx)),
            pv=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)),
            waits=len(re.findall(r"wgmma\.wait_group", ptx)),
            regs=sorted(set(int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx))))
json.dump(out, open(sys.argv[1], "w"))
"""


@_NEEDS_GLUON
def test_gluon_kernels_issue_dots_in_groups(tmp_path):
    """The Gluon kernel of sm90's 64-head tile over fp8_ds_mla rows (kernels/gluon_fp8_producer.py
    with gluon_sm90's lockstep consumers), into fp16 and bf16 operands, with 4 and 8 producer
    warps, final and partial outputs, compiles with this Triton: within sm90's shared memory,
    36 QK and 16 PV wgmma per step as the Triton tile, and one wait for each of the two groups
    instead of one per dot; the consumers' two warpgroups get at least 224 registers and the
    producer no more than the rest. (The bf16 rows' 64-head kernel:
    test_gluon_pingpong_kernel_compiles.)"""
    counts = _probe(_GLUON_PROBE, tmp_path)
    assert len(counts) == 6, counts
    for variant, c in counts.items():
        wide = variant.split("/")[1] == "True"
        assert c["shared"] <= configs.SMEM_LIMIT["sm90"], (variant, c)
        assert c["qk"] == 576 // 16, (variant, c)
        assert c["pv"] == 4 * 64 // 16 and c["waits"] == 2, (variant, c)
        # (setmaxnreg's values: the consumers' from 200 up, the producer's below)
        consumers = [r for r in c["regs"] if r >= 200]
        assert consumers and min(consumers) >= 224, (variant, c)
        assert all(2 * 128 * min(consumers) + 32 * (8 if wide else 4) * r <= 65536
                   for r in c["regs"] if r < 200), (variant, c)


@_NEEDS_GLUON
def test_gluon_tile_names_its_kernel():
    """Each Gluon tile names one kernel per row format (gluon_sm90.tile_variant): fp8_ds_mla
    rows the dequantizing producer's, bf16/fp16 rows the few-head or the alternate-tile
    kernel; a 64-head tile over bf16/fp16 rows without ``pingpong`` names none (its lockstep
    kernel was removed) and says so."""
    from triton_sparse_mla.kernels import gluon_sm90

    def name(tile, fp8):
        return portability._jit_fn(gluon_sm90.tile_variant(tile, fp8)[0]).__name__

    for h, warps in ((8, 4), (16, 4), (32, 4), (64, 8)):
        tile = configs.TileConfig(h, 64, warps, 2, gluon=True, fp8_f16=True)
        assert name(tile, True) == "sparse_mla_gluon_fp8_ws_kernel", h
    for h in (8, 16):
        tile = configs.TileConfig(h, 64, 4, 2, gluon=True)
        assert name(tile, False) == "sparse_mla_gluon_narrow_kernel", h
    tile = configs.TileConfig(64, 64, 8, 2, gluon=True, pingpong=True)
    assert name(tile, False) == "sparse_mla_gluon_pp_kernel"
    with pytest.raises(ValueError, match="pingpong: over bf16/fp16 rows the 64-head"):
        gluon_sm90.tile_variant(configs.TileConfig(64, 64, 8, 2, gluon=True), False)


_NARROW_PROBE = r"""
import json, re, sys
from triton_sparse_mla import configs, portability
out = {}
for block_h, f16 in ((8, True), (16, True), (16, False), (32, True)):
    tile = configs.TileConfig(block_h, 64, 4, 2, gluon=True, fp8_f16=f16)
    for label, kernel, types, cx, div, warps, stages, opts in portability._gluon_variants(tile, True):
        k = portability._compile(kernel, types, cx, div, 90, warps, stages, **opts)
        ptx = k.asm["ptx"]
        out[f"{block_h}/{f16}/{label}"] = dict(
            shared=k.metadata.shared, warps=warps, block_h=cx["BLOCK_H"],
            dots=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n%dk16" % block_h, ptx)),
            waits=len(re.findall(r"wgmma\.wait_group", ptx)),
            regs=sorted(set(int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx))))
json.dump(out, open(sys.argv[1], "w"))
"""


@_NEEDS_GLUON
def test_gluon_narrow_kernel_compiles(tmp_path):
    """The few-head Gluon tile over fp8_ds_mla rows (kernels/gluon_narrow.py), 8 and 16 heads
    into fp16 operands, 16 into bf16 ones and 32 heads, final and partial outputs, compiles
    with this Triton for sm90: within its shared memory, launched with one consumer
    warpgroup, every dot with the heads along N (per 64-row step 36 score dots over 576
    columns and 32 PV dots, 4 output tiles of 128 rows x 4 steps of 16 rows), two waits (one
    per group), and the consumers and the producer's 4 warps within the register file."""
    counts = _probe(_NARROW_PROBE, tmp_path)
    assert len(counts) == 8, counts
    for variant, c in counts.items():
        assert c["shared"] <= configs.SMEM_LIMIT["sm90"] and c["warps"] == 4, (variant, c)
        assert c["block_h"] == int(variant.split("/")[0]), (variant, c)
        assert c["dots"] == 576 // 16 + 4 * 2 * 64 // 16 and c["waits"] == 2, (variant, c)
        assert len(c["regs"]) >= 2 and 128 * max(c["regs"]) + 128 * min(c["regs"]) <= 65536, (variant, c)


_FP8_REGS_PROBE = r"""
import json, re, sys
from triton_sparse_mla import configs, portability
from triton_sparse_mla.kernels import gluon_fp8_regs
out = {}
for block_h in (8, 16):
    tile = configs.TileConfig(block_h, 64, 4, 2, gluon=True, fp8_f16=True, fp8_regs=True)
    for label, kernel, types, cx, div, warps, stages, opts in portability._gluon_variants(tile, True):
        k = portability._compile(kernel, types, cx, div, 90, warps, stages, **opts)
        ptx = k.asm["ptx"]
        out[f"{block_h}/{label}"] = dict(
            shared=k.metadata.shared, warps=warps, stack=portability.stack_bytes(k),
            rs_dots=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n%dk16\.f32\.f16\.f16 \{[^}]*\}, \{" % block_h, ptx)),
            rope_dots=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n%dk16\.f32\.bf16\.bf16" % block_h, ptx)),
            ss_e4m3_dots=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n%dk32\.f32\.e4m3\.e4m3 \{[^}]*\}, %%rd"
                                        % (2 * block_h), ptx)),
            raw_loads=dict((w, len(re.findall(r"ld\.shared\.%s\s" % w, ptx))) for w in ("v4.b32", "b32", "v2.b16", "u8", "b8")),
            prmt=len(re.findall(r"prmt\.b32\s", ptx)),
            cvt=len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx)), consumer_regs=gluon_fp8_regs.CONSUMER_REGS.value,
            regs=sorted(set(int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx))))
json.dump(out, open(sys.argv[1], "w"))
"""


@_NEEDS_GLUON
def test_gluon_fp8_regs_kernel_compiles(tmp_path):
    """The few-head Gluon tile whose dots read the raw e4m3 bytes (kernels/gluon_fp8_regs.py,
    ``TileConfig.fp8_regs``), 8 and 16 heads, final and partial outputs, compiles with this
    Triton for sm90: within its shared memory and without spills, the consumer warpgroup's
    steps with their 16 e4m3 score dots on the raw tiles in shared memory (4 latent
    tiles x 4 steps of 32 columns, both parts of q's heads along N), 4 rope dots from shared
    memory and 32 PV dots from registers (4 output tiles of 128 rows x 4 steps of 16 rows);
    the raw bytes reaching registers only through the PV view's 4-byte loads (one per row of a
    thread's 4 columns), none through byte loads, each word permuted once (two rows' words
    into their K pairs) and converted only there (and q's high parts once); and the consumer
    and the producer's 4 warps within half the register file (two programs per SM)."""
    counts = _probe(_FP8_REGS_PROBE, tmp_path)
    assert len(counts) == 4, counts
    for variant, c in counts.items():
        assert c["shared"] <= configs.SMEM_LIMIT["sm90"] and c["warps"] == 4, (variant, c)
        assert c["stack"] is None or c["stack"] == 0, (variant, c)  # (None: no cuobjdump to read it)
        assert c["ss_e4m3_dots"] == 4 * 128 // 32, (variant, c)
        # (the last step's last PV dots, 2 x 64 // 16, after the loop again)
        assert c["rs_dots"] == 4 * 2 * 64 // 16 + 2 * 64 // 16, (variant, c)
        assert c["rope_dots"] == 64 // 16, (variant, c)
        loads = c["raw_loads"]
        # per warpgroup step: 64 rows x 512 bytes / 128 threads by 4-byte loads (among others:
        # the scales', as many as Triton places), two byte permutes per pair of rows' words; no
        # 2-byte loads; fewer 16-byte loads in the whole kernel (q's and the scales') than one
        # step's raw bytes would take. The last tile's words (a quarter of a step's) are
        # permuted and converted once more after the loop, for the last step's last PV dots:
        # hence words // 4 more permutes here and 5 // 4 of a step's conversions below.
        words = 64 * 512 // 128 // 4
        assert loads["b32"] >= words and loads["v2.b16"] == 0 and c["prmt"] == words + words // 4, (variant, c)
        assert loads["v4.b32"] < 64 * 512 // 128 // 16, (variant, c)
        # (one byte load is Triton's own: the partitions' hand-over flag)
        assert loads["u8"] == 0 and loads["b8"] <= 1, (variant, c)
        block_h = int(variant.split("/")[0])
        assert c["cvt"] == 64 * 512 // 128 // 2 * 5 // 4 + 4 * block_h * 128 // 128 // 2, (variant, c)
        consumer = c["consumer_regs"]
        producer = min(r for r in c["regs"] if r > 24)  # (24: Triton's idle workers before the partitions start)
        assert consumer in c["regs"] and 2 * (128 * consumer + 128 * producer) <= 65536, (variant, c)


_PINGPONG_PROBE = r"""
import json, re, sys
from triton_sparse_mla import configs, portability
out = {}
tile = configs.TileConfig(64, 64, 8, 2, exchange_p=True, gluon=True,
                          pingpong=True)
for label, kernel, types, cx, div, warps, stages, opts in portability._gluon_variants(tile, False):
    k = portability._compile(kernel, types, cx, div, 90, warps, stages, **opts)
    ptx = k.asm["ptx"]
    out[label] = dict(
        shared=k.metadata.shared, warps=warps, consumer_regs=cx["CONSUMER_REGS"],
        block_n=cx["BLOCK_N"],
        qk=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n%dk16" % cx["BLOCK_N"], ptx)),
        pv=len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", ptx)),
        regs=sorted(set(int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx))))
json.dump(out, open(sys.argv[1], "w"))
"""


@_NEEDS_GLUON
def test_gluon_pingpong_kernel_compiles(tmp_path):
    """The alternate-tile Gluon kernel (kernels/gluon_pingpong.py, ``TileConfig.pingpong``,
    shipped in sm90's 64-head bf16 tile), final and partial outputs, compiles with this Triton
    for sm90: within its shared memory, each warpgroup's score dots 64 rows wide (36 per tile:
    warpgroup 0's first tile before its loop and its next ones in the pair step, warpgroup 1's
    in its loop) and its PV dots 128 columns wide (two output tiles, over its own tile and the
    other's; warpgroup 0's pair step is compiled twice, with the next tile's score dots and,
    for the last pair, without), launched with the producer's 4 warps (the default
    partition), the two consumer warpgroups at the kernel's ``CONSUMER_REGS`` and the producer
    at what is left of the register file (no more)."""
    counts = _probe(_PINGPONG_PROBE, tmp_path)
    assert len(counts) == 2, counts
    for variant, c in counts.items():
        assert c["shared"] <= configs.SMEM_LIMIT["sm90"] and c["warps"] == 4, (variant, c)
        assert c["block_n"] == 64 and c["qk"] == 3 * 576 // 16, (variant, c)
        assert c["pv"] == 3 * 2 * 2 * 64 // 16, (variant, c)
        consumer, producer = c["consumer_regs"], min(c["regs"])
        assert consumer in c["regs"] and 2 * 128 * consumer + 128 * producer <= 65536, (variant, c)


# (a function of the PTX: for each one-thread mbarrier arrival, the partition barriers right
# before it, with only address arithmetic and the proxy fence between)
_ARRIVALS = r"""
import re
PRED = r"(?:@!?%p\d+\s+)?"
ARRIVE = re.compile(PRED + r"mbarrier\.arrive\.shared::cta\.b64\s+_,")
BARRIER = re.compile(PRED + r"bar(?:rier)?\.sync\b")
# what may sit between a barrier and the arrival it guards: address arithmetic and the fence
BETWEEN = re.compile(PRED + r"(?:add|sub|mov|mad|mul|shl|shr|and|or|xor|selp|setp|cvta?|fence\.proxy\.async)\b")
def arrivals(ptx):
    lines = [l.split("//")[0].strip() for l in ptx.splitlines()]
    lines = [l for l in lines if l and not l.startswith(".loc") and not l.endswith(":")]
    counts = []
    for i, line in enumerate(lines):
        if ARRIVE.match(line):
            n, j = 0, i - 1
            while j >= 0 and (BARRIER.match(lines[j]) or BETWEEN.match(lines[j])):
                n, j = n + bool(BARRIER.match(lines[j])), j - 1
            counts.append(n)
    return counts
"""

_ARRIVE_PROBE = _ARRIVALS + r"""
import dataclasses, json, sys
from triton_sparse_mla import configs, portability
tiles = {}
for phase, kind, tile in configs.all_tiles("sm90"):
    if tile.gluon:
        tiles.setdefault((kind, dataclasses.replace(tile, fallback=None)), f"{phase}/{kind}/{tile.block_h}")
out = {}
for (kind, tile), name in tiles.items():
    label, kernel, types, cx, div, warps, stages, opts = next(portability._gluon_variants(tile, kind == "fp8"))
    out[name] = arrivals(portability._compile(kernel, types, cx, div, 90, warps, stages, **opts).asm["ptx"])
json.dump(out, open(sys.argv[1], "w"))
"""


@_NEEDS_GLUON
def test_gluon_arrivals_synchronize_their_partition_once(tmp_path):
    """Each one-thread mbarrier arrival of the shipped sm90 Gluon kernels (a slot freed by the
    consumers, a dequantized slot made ready by the fp8_ds_mla producer) follows exactly one
    barrier of its partition's threads, with only address arithmetic and the proxy fence
    between: none would let the arrival overtake a thread's reads or stores of the slot; two
    in a row (Triton 3.8 places one inside the arrive, which kernels.gluon_sm90.ARRIVE_SYNCS
    must know) cost a barrier per step for nothing."""
    counts = _probe(_ARRIVE_PROBE, tmp_path)
    assert len(counts) >= 4, counts
    for kernel, found in counts.items():
        assert found and all(n == 1 for n in found), (kernel, found)


_Q_SCALE_PROBE = r"""
import json, re, sys
from triton_sparse_mla import configs, portability
# (Triton 3.3 names the f32 registers %f, later ones %r)
SCALED = r"mul(?:\.rn)?\.f32\s+%[rf]\d+, %[rf]\d+, 0f3B800000;"
out = {}
for cap, family in ((90, "sm90"), (120, "sm86")):
    tile = configs.TileConfig(16, 32, 4, 2, fp8_f16=True)
    label, kernel, types, cx, div, warps, stages = next(
        v for v in portability._main_kernel_variants(tile, cap, True, family) if "partial=0" in v[0])
    ptx = portability._compile(kernel, types, cx, div, cap, warps, stages).asm["ptx"]
    out[f"sm{cap}"] = dict(q_scale=cx["Q_SCALE"],
                           f32_scaled=len(re.findall(SCALED, ptx)))
from triton_sparse_mla.kernels.attention import gluon_module
if gluon_module() is not None:
    tile = configs.TileConfig(64, 64, 8, 2, exchange_p=True, gluon=True, fp8_f16=True)
    label, kernel, types, cx, div, warps, stages, opts = next(iter(portability._gluon_variants(tile, True)))
    ptx = portability._compile(kernel, types, cx, div, 90, warps, stages, **opts).asm["ptx"]
    out["gluon"] = dict(q_scale=gluon_module().Q_F16_SCALE.value, f32_scaled=len(re.findall(SCALED, ptx)))
json.dump(out, open(sys.argv[1], "w"))
"""


def test_bf16_query_scaled_before_fp16(tmp_path):
    """With ``fp8_f16`` a bf16 q reaches fp16 scaled by 2^-8, so that fp16 holds it. The
    multiply must come before the rounding to fp16: left to itself, Triton's compiler swaps
    the two (rounds to fp16, then multiplies in fp16), and a q entry past 65504 became inf,
    every output NaN (seen on the H200, in the Triton tiles and then in the Gluon one).
    Checked in the PTX: each of a thread's q values is multiplied by 2^-8 in fp32 (the Triton
    16-head tile: 16 heads x 576 columns over 128 threads; the Gluon 64-head tile, whose rope
    stays bf16: 64 heads x 512 columns over 256 threads, where this Triton has it)."""
    counts = _probe(_Q_SCALE_PROBE, tmp_path)
    for cap in ("sm90", "sm120"):
        assert counts[cap]["q_scale"] == 2.0 ** -8, counts
        assert counts[cap]["f32_scaled"] == 16 * 576 // 128, counts
    assert ("gluon" in counts) == gluon_triton(), counts
    if not gluon_triton():
        return
    assert counts["gluon"]["q_scale"] == 2.0 ** -8, counts
    assert counts["gluon"]["f32_scaled"] == 64 * 512 // 256, counts
