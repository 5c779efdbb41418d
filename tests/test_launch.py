"""kernels/launch.py: a call's key decides which compiled kernel it runs, so calls with equal
keys must be calls Triton specializes alike; with a stand-in for Triton, what the dispatch hands
the launcher; on a GPU, a repeated call skips Triton's path and still gives the reference's
answer."""

import random

import pytest
import torch
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction, create_function_from_signature

from problems import CompiledStandIn, assert_close, make_problem, tol
from triton_sparse_mla import sparse_mla_attention, sparse_mla_reference
from triton_sparse_mla.kernels import launch

try:
    from triton.compiler import make_backend
except ImportError:  # (Triton 3.3)
    from triton.compiler.compiler import make_backend


def _probe(x_ptr, y_ptr, n, m, scale, flag, BLOCK: tl.constexpr, MODE: tl.constexpr = None):
    pass


def _menu():
    """Values for each of ``_probe``'s parameters that Triton specializes differently, or not."""
    buf = {dt: torch.zeros(64, dtype=dt) for dt in (torch.bfloat16, torch.float32, torch.uint8)}
    tensors = [buf[torch.bfloat16], buf[torch.bfloat16][1:], buf[torch.bfloat16][8:],
               buf[torch.float32], buf[torch.float32][4:], buf[torch.float32][1:],
               buf[torch.uint8][3:], buf[torch.uint8][16:], None]
    ints = [0, 1, 2, 16, 17, 48, -1, -16, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16,
            2 ** 63 - 1, 2 ** 63, 2 ** 63 + 16, True, False, None]
    return dict(x_ptr=tensors, y_ptr=tensors, n=ints, m=ints, scale=[0.5, 1.0, -3.0, 1, None],
                flag=[True, False, 0, 1], BLOCK=[16, 32, 1, True, 1.0, tl.constexpr(16)],
                MODE=[None, "a", "b", tl.bfloat16, tl.float16])


def test_equal_keys_mean_equal_specializations():
    """Over random argument sets for a probe kernel, every group of calls with one key is
    specialized alike by this Triton's own binding (its signature types, alignments and
    constants), so the compiled kernel kept for a key is the one Triton would run."""
    kernel = JITFunction(_probe)
    binder = create_function_from_signature(kernel.signature, kernel.params,
                                            make_backend(GPUTarget("cuda", 90, 32)))
    entry = launch._Kernel(kernel)
    menu = _menu()
    rng = random.Random(0)
    specs = {}
    for _ in range(4000):
        kwargs = {name: rng.choice(values) for name, values in menu.items()}
        if rng.random() < 0.2:
            del kwargs["MODE"]  # (its default)
        key = entry.key(entry.values((), kwargs), kwargs)
        try:
            hash(key)
        except TypeError:  # (Triton 3.3's constexpr objects: such calls take Triton's path)
            continue
        specs.setdefault(key, set()).add(str(binder(**kwargs)[1]))
    mixed = [sorted(spec) for spec in specs.values() if len(spec) > 1]
    assert not mixed, f"{len(mixed)} keys whose calls Triton specializes differently: {mixed[:2]}"
    # (and the menu reaches the distinctions: aligned or not, 1, i64, u64, constexpr values)
    assert len(set().union(*specs.values())) > 1000


def test_options_are_part_of_the_key():
    kernel = JITFunction(_probe)
    entry = launch._Kernel(kernel)
    x = torch.zeros(8)
    args = dict(x_ptr=x, y_ptr=x, n=4, m=4, scale=1.0, flag=True, BLOCK=16)
    keys = {entry.key(entry.values((), dict(args, **opts)), dict(args, **opts))
            for opts in ({}, {"num_warps": 4}, {"num_warps": 8}, {"num_warps": 4, "num_stages": 2})}
    assert len(keys) == 4


@pytest.mark.parametrize("value", [(1, 2), [1], object()], ids=["tuple", "list", "object"])
def test_arguments_it_does_not_key_are_left_to_triton(value):
    entry = launch._Kernel(JITFunction(_probe))
    args = dict(x_ptr=value, y_ptr=None, n=4, m=4, scale=1.0, flag=True, BLOCK=16)
    with pytest.raises(TypeError, match="left to Triton"):
        entry.key(entry.values((), args), args)


def test_keys_hold_no_tensor():
    """A kept key holds a tensor's dtype and alignment, never the tensor (which it would keep
    alive), and two tensors alike in both give one key."""
    entry = launch._Kernel(JITFunction(_probe))
    keys = []
    for _ in range(2):
        x = torch.zeros(64)
        args = dict(x_ptr=x, y_ptr=x[4:], n=4, m=4, scale=1.0, flag=True, BLOCK=16)
        keys.append(entry.key(entry.values((), args), args))
    assert keys[0] == keys[1]
    assert not any(isinstance(v, torch.Tensor) for v in keys[0][1])


def _stand_in(monkeypatch, hooks=None):
    """``(kernel, compiled, triton_calls)``: ``_probe`` as a JIT function whose Triton path
    is recorded and returns one stand-in compiled kernel, on device 3 and stream 7, with launch
    hooks idle unless ``hooks`` (a list) holds one."""
    kernel = JITFunction(_probe)
    compiled, triton_calls = CompiledStandIn(), []

    def triton_path(grid):
        def call(*args, **kwargs):
            triton_calls.append((grid, args, kwargs))
            return compiled
        return call

    monkeypatch.setattr(JITFunction, "__getitem__", lambda self, grid: triton_path(grid))
    monkeypatch.setattr(launch, "_RUNTIME", [lambda: 3, lambda device: 7 + device - 3,
                                             lambda: not hooks])
    monkeypatch.setattr(launch, "FAST", True)
    return kernel, compiled, triton_calls


def test_launch_keeps_the_compiled_kernel_and_hands_its_launcher_the_arguments(monkeypatch):
    """The first call takes Triton's path; a second with the same key goes to the kept
    kernel's launcher: grid padded to three, the current stream, no hooks, then every
    parameter's value in order (defaults filled in); a call with a new key takes Triton's path
    again."""
    kernel, compiled, triton_calls = _stand_in(monkeypatch)
    x = torch.zeros(64)
    args = dict(x_ptr=x, y_ptr=None, n=4, m=32, scale=0.5, flag=True, BLOCK=16, num_warps=4)
    assert launch.launch(kernel, (5,), **args) is compiled
    assert len(triton_calls) == 1 and not compiled.launches
    assert launch.launch(kernel, (6, 2), **dict(args, scale=2.0, n=20)) is compiled
    assert len(triton_calls) == 1
    assert compiled.launches == [(6, 2, 1, 7, "function", "metadata", None, None, None,
                                  x, None, 20, 32, 2.0, True, 16, None)]
    launch.launch(kernel, (6,), **dict(args, n=1))  # (1: a constant to Triton)
    launch.launch(kernel, (6,), **dict(args, num_warps=8))
    launch.launch(kernel, (6,), **dict(args, x_ptr=x[1:]))  # (not 16-byte aligned)
    assert len(triton_calls) == 4 and len(compiled.launches) == 1


def test_launch_leaves_hooked_and_unkeyed_calls_to_triton(monkeypatch):
    hooks = ["a profiler"]
    kernel, compiled, triton_calls = _stand_in(monkeypatch, hooks)
    args = dict(x_ptr=torch.zeros(8), y_ptr=None, n=4, m=4, scale=1.0, flag=True, BLOCK=16)
    for _ in range(2):
        launch.launch(kernel, (1,), **args)
    hooks.clear()
    for _ in range(2):
        launch.launch(kernel, (1,), **dict(args, y_ptr=(1, 2)))
    assert len(triton_calls) == 4 and not compiled.launches


def _check(prob, q, fmt):
    out, lse = sparse_mla_attention(q, prob.kv, prob.indices, prob.sm_scale,
                                    topk_length=prob.topk_length, return_lse=True)
    ref_out, ref_lse = sparse_mla_reference(prob.q, prob.kv, prob.indices, prob.sm_scale,
                                            topk_length=prob.topk_length)
    assert_close(out, lse, ref_out, ref_lse, **tol(fmt))


def _spy_triton_runs(monkeypatch):
    """Count the calls that take Triton's own path."""
    runs = []
    original = JITFunction.run

    def spy(self, *args, **kwargs):
        runs.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", spy)
    return runs


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
def test_a_repeated_call_skips_triton_and_matches_the_reference(monkeypatch, device, fmt):
    """The first call of a shape goes through Triton's path; a repeat of it, with new inputs of
    the same facts, does not, and every answer is the reference's. A query that starts 2 bytes
    past a 16-byte boundary is a new key: Triton's path again, and still the reference."""
    runs = _spy_triton_runs(monkeypatch)
    # (the second and third calls: new inputs, and a cache of another size whose integers
    # Triton specializes alike: 500 and 700 rows are neither 1 nor multiples of 16)
    for seed, n in ((0, 500), (1, 500), (2, 700)):
        prob = make_problem(t=3, h=16, k=200, n=n, fmt=fmt, device=device, seed=seed,
                            topk_length="partial")
        _check(prob, prob.q, fmt)
        if seed == 0:
            assert runs, "the first call of a shape should take Triton's path"
            runs.clear()
    assert not runs, f"a repeated call went through Triton's path: {runs}"

    shifted = torch.empty(prob.q.numel() + 1, dtype=prob.q.dtype, device=device)[1:]
    shifted = shifted.view(prob.q.shape).copy_(prob.q)
    assert shifted.data_ptr() % 16 != 0
    _check(prob, shifted, fmt)
    assert runs, "a query at another alignment should take Triton's path first"


@pytest.mark.gpu
def test_launch_hooks_see_every_launch(device):
    """While a launch hook is installed (a profiler's), every launch takes Triton's path,
    which calls it."""
    knobs = pytest.importorskip("triton.knobs")
    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton's launch hooks are not chains")
    prob = make_problem(t=2, h=16, k=64, n=100, device=device)
    sparse_mla_attention(prob.q, prob.kv, prob.indices, prob.sm_scale)  # (compiled, and keyed)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"] if hasattr(metadata, "get") else metadata)

    chain.add(hook)
    try:
        for _ in range(2):
            sparse_mla_attention(prob.q, prob.kv, prob.indices, prob.sm_scale)
    finally:
        chain.remove(hook)
    assert len(seen) >= 2, seen
