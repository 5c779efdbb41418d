"""Launch configurations: named tables per architecture family, and the split-K rule.

Every choice here depends only on shapes (T, H, K), row format and the device, never on index
values or lengths, so a CUDA graph captured around a call stays valid when indices change.

Families and their shared-memory limit per block:

* ``sm90``: SM90 (H100/H200) and SM100, 227 KB.
* ``sm80``: SM80 (A100), 163 KB.
* ``sm86``: SM86, SM87, SM89, SM120, SM121 (RTX 30xx/40xx/50xx, RTX PRO 6000, GB10), 99 KB.

Provenance: the ``sm90`` tables were measured on an H200 (see BENCHMARKS.md for the sweep);
the ``sm80`` and ``sm86`` tables were not measured on their GPUs (none is available): they are
the ``sm90`` shapes cut down until the compiled kernels fit the family's shared memory, which
``tests/test_portability.py`` checks by compiling every entry for every target.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class TileConfig:
    """Tile shape of the main kernel: heads and rows per tile, warps, pipeline stages."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launcher needs beyond the tensors."""

    tile: TileConfig
    splits: int
    hw_cvt: bool


SMEM_LIMIT = {"sm90": 227 * 1024, "sm80": 163 * 1024, "sm86": 99 * 1024}

# The compile targets checked for each family (capability as major*10 + minor).
FAMILY_TARGETS = {"sm90": (90, 100), "sm80": (80,), "sm86": (86, 89, 120)}

# Keys: (phase, format kind). Phase "decode" is T <= PREFILL_MIN_TOKENS, "prefill" above.
# Format kind "plain" is bf16/fp16 rows, "fp8" is fp8_ds_mla.
CONFIGS = {
    "sm90": {
        ("decode", "plain"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
        ("decode", "fp8"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
        ("prefill", "plain"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
        ("prefill", "fp8"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
    },
    "sm80": {
        ("decode", "plain"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
        ("decode", "fp8"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
        ("prefill", "plain"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
        ("prefill", "fp8"): TileConfig(block_h=64, block_n=32, num_warps=8, num_stages=2),
    },
    "sm86": {
        ("decode", "plain"): TileConfig(block_h=32, block_n=16, num_warps=4, num_stages=2),
        ("decode", "fp8"): TileConfig(block_h=32, block_n=16, num_warps=4, num_stages=2),
        ("prefill", "plain"): TileConfig(block_h=32, block_n=16, num_warps=4, num_stages=2),
        ("prefill", "fp8"): TileConfig(block_h=32, block_n=16, num_warps=4, num_stages=2),
    },
}

PREFILL_MIN_TOKENS = 513
# Split-K aims at this many programs per SM, and keeps at least this many tiles per split.
PROGRAMS_PER_SM = 2
MIN_TILES_PER_SPLIT = 2
# The interpreter has no SMs; a small count makes CPU tests exercise the split path.
INTERPRETER_SM_COUNT = 4


def family_of(capability: tuple[int, int]) -> str:
    """Map a CUDA compute capability to its configuration family."""
    major, minor = capability
    if major >= 9 and major < 12:
        return "sm90"
    if (major, minor) == (8, 0):
        return "sm80"
    if major == 8 or major == 12:
        return "sm86"
    raise ValueError(
        f"device: compute capability {major}.{minor} is not supported (need 8.0 or newer)"
    )


@functools.lru_cache(maxsize=None)
def device_traits(device_index: int) -> tuple[str, int, bool]:
    """``(family, sm_count, hw_fp8_cvt)`` of a CUDA device, queried once."""
    props = torch.cuda.get_device_properties(device_index)
    capability = (props.major, props.minor)
    return family_of(capability), props.multi_processor_count, capability >= (8, 9)


def choose_splits(t_count: int, h_tiles: int, topk: int, block_n: int, sm_count: int) -> int:
    """Split the top-k axis when tokens x head tiles would leave SMs idle."""
    programs = t_count * h_tiles
    wanted = triton.cdiv(PROGRAMS_PER_SM * sm_count, programs)
    most = max(1, topk // (block_n * MIN_TILES_PER_SPLIT))
    return max(1, min(wanted, most))


def plan_launch(family: str, sm_count: int, hw_cvt: bool, *, t_count: int, h_count: int,
                topk: int, fp8: bool) -> LaunchPlan:
    """Pick the tile, split count and fp8 decode path for one call."""
    phase = "prefill" if t_count >= PREFILL_MIN_TOKENS else "decode"
    tile = CONFIGS[family][(phase, "fp8" if fp8 else "plain")]
    # Never tile more heads than exist (beyond the 16 rows tl.dot needs).
    block_h = min(tile.block_h, max(16, triton.next_power_of_2(h_count)))
    if block_h != tile.block_h:
        tile = TileConfig(block_h, tile.block_n, tile.num_warps, tile.num_stages)
    splits = choose_splits(t_count, triton.cdiv(h_count, block_h), topk, tile.block_n, sm_count)
    return LaunchPlan(tile=tile, splits=splits, hw_cvt=hw_cvt)
