"""The kernels' ``cp.async`` copies rewritten in their PTX, for timing only (GPU): Triton's
async-copy lowering (3.6 and 3.8) emits ``cp.async.cg.shared.global`` with no L2 prefetch
size, where FlashMLA's sm90 sparse kernel copies its rows with ``.L2::256B`` (the L2 fetches
the whole 256-byte block a 16-byte copy falls in; under Nsight Compute, run 156, its kernel
read 5% more DRAM bytes than ours and hit L2 on 25% of requests against our 9%).
``rewritten(spec)`` compiles every kernel launched inside it with its 16-byte copies given
the prefetch size ``spec``: ``l2_128`` or ``l2_256``.

Measured (H200, runs 158 and 160, benchmarks/pp_compare.py ``shipped+l2_256``): no gain
anywhere. The 64-head bf16 tile 0.99-1.00x in decode, 0.84-0.87x in prefill T=4096 (32K and
1M rows); the few-head tiles 0.99x (fp8_ds_mla, T=128, 8 and 16 heads), 0.97x (bf16 T=128
H=16), 0.99x (bf16 prefill T=4096 H=8 over 32K rows). (A third spec, an evict-last cache
policy made by ``createpolicy`` at the kernel's entry, stopped run 158 with an illegal
instruction in the 64-head kernel, if it was that form that did; it was removed untimed.)

Triton 3.6 does not key its caches on the stages hook used here, so inside ``rewritten`` the
kernels of triton_sparse_mla.kernels compile into caches of their own (one per spec, kept for
the process) and the on-disk cache is a temporary directory.
"""

import collections
import contextlib
import importlib
import re
import sys
import tempfile

from triton import knobs
from triton.runtime.jit import JITFunction

_CP = re.compile(r"cp\.async\.cg\.shared\.global \[ [^\]]+ \], \[ [^\]]+ \], 0x10(?:, [%\w]+)?;")
_PREFETCH = {"l2_128": ".L2::128B", "l2_256": ".L2::256B"}


def rewrite(ptx, spec):
    """``ptx`` with each 16-byte ``cp.async.cg`` given the prefetch size ``spec``; returns it
    and the number of copies rewritten."""
    if spec not in _PREFETCH:
        raise ValueError(f"spec: l2_128 or l2_256, got {spec!r}")
    return _CP.subn(lambda m: m.group(0).replace("cp.async.cg.shared.global ",
                                                  f"cp.async.cg.shared.global{_PREFETCH[spec]} "), ptx)


def _kernels():
    """The JIT functions of triton_sparse_mla.kernels' modules (the Gluon ones imported first,
    and any other module imported from there, as pp_compare's ``mod:NAME``)."""
    for name in ("attention", "combine", "dedup", "gluon_sm90", "gluon_pingpong", "gluon_narrow",
                 "gluon_fp8_producer"):
        with contextlib.suppress(ImportError):  # (Gluon's: not under the interpreter)
            importlib.import_module(f"triton_sparse_mla.kernels.{name}")
    mods = [m for name, m in list(sys.modules.items()) if name.startswith("triton_sparse_mla.kernels.")]
    return {id(v): v for m in mods for v in vars(m).values() if isinstance(v, JITFunction)}.values()


_CACHES = collections.defaultdict(dict)  # spec -> {id(kernel): its device caches}


@contextlib.contextmanager
def rewritten(spec):
    """Kernels launched inside compile (once per spec) with their copies rewritten."""
    rewrite("", spec)  # (checks the spec)

    def hook(*args):
        if not args:  # Triton 3.8 asks for a key to add to its cache keys
            return f"tsm_ptx_{spec}", f"tsm_ptx_{spec}"
        stages = args[1]
        make_ptx = stages["ptx"]

        stages["ptx"] = lambda src, metadata: rewrite(make_ptx(src, metadata), spec)[0]

    kernels = list(_kernels())
    saved = [k.device_caches for k in kernels]
    for k in kernels:
        k.device_caches = _CACHES[spec].setdefault(id(k), collections.defaultdict(k.create_binder))
    saved_hook, saved_dir = knobs.runtime.add_stages_inspection_hook, knobs.cache.dir
    with tempfile.TemporaryDirectory() as tmp:
        knobs.runtime.add_stages_inspection_hook, knobs.cache.dir = hook, tmp
        try:
            yield
        finally:
            knobs.runtime.add_stages_inspection_hook, knobs.cache.dir = saved_hook, saved_dir
            for k, c in zip(kernels, saved):
                k.device_caches = c
