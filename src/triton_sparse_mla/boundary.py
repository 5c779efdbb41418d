"""What every public entry point checks at its boundary: tensors (dtype, rank, device, unit
last stride, each error naming the argument), and the device the kernels will run on (a CUDA
GPU's traits, or Triton's interpreter for CPU tensors)."""

from __future__ import annotations

import os

import numpy as np
import torch

from . import configs
from .kernels.attention import triton_version
from .kernels.common import INTERPRETED


def interpreting() -> bool:
    """Whether kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Triton decides whether a kernel runs in its interpreter when it defines it: this package's
# kernels were defined with this module's import (kernels.attention's with it).
INTERPRETED_AT_IMPORT = INTERPRETED


def check_interpreter():
    """Triton's interpreter before 3.7 turns one-element arrays into loop bounds with ``int()``,
    which numpy 2.4 rejects: fail with what to install instead of a TypeError from inside it."""
    numpy_version = tuple(int(v) for v in np.__version__.split(".")[:2])
    version = triton_version()
    if version < (3, 7) and numpy_version >= (2, 4):
        raise RuntimeError(
            f"TRITON_INTERPRET=1: Triton {'.'.join(map(str, version))}'s interpreter "
            f"cannot run with numpy {np.__version__} (fixed in Triton 3.7): install "
            f"'numpy<2.4' or Triton >= 3.7")


def check_tensor(name, x, *, dtype=None, dtypes=None, rank=None, device=None):
    """Raise naming ``name`` unless ``x`` is a tensor of the given dtype(s), rank and device
    with unit stride in its last dimension."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {list(dtypes)}, got {x.dtype}")
    if rank is not None and x.dim() != rank:
        raise ValueError(f"{name}: expected {rank} dimensions, got shape {list(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name}: expected device {device}, got {x.device}")
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name}: expected unit stride in the last dimension, got strides {x.stride()}")


def device_traits(device: torch.device, name: str) -> tuple[str, int, int]:
    """``(family, sm_count, fp8_cvt level)`` for tensors on ``device`` (``name``: the argument
    an error names): a CUDA device's, or the interpreter's stand-in for CPU tensors under
    ``TRITON_INTERPRET=1``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return configs.device_traits(index)
    if device.type == "cpu" and interpreting():
        if not INTERPRETED_AT_IMPORT:
            raise RuntimeError(
                f"{name}: CPU tensors run in Triton's interpreter, but TRITON_INTERPRET=1 was set "
                f"after triton_sparse_mla was imported, when its kernels were already defined for "
                f"a GPU: set it before the import")
        check_interpreter()
        return "sm90", configs.INTERPRETER_SM_COUNT, 0
    raise ValueError(
        f"{name}: expected CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 set before the "
        f"import), got device {device}")
