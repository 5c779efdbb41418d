"""Shared fixtures: the device under test and seeded problem builders.

On a machine without CUDA the tests run through Triton's interpreter: ``TRITON_INTERPRET=1``
must be set before Triton is imported, so it is set here when no GPU is present.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def _poisoned_empty():
    """Without a GPU, memory from ``torch.empty`` and its kin comes filled (NaN in floats, the
    largest value in integers), so a kernel or test that reads memory nobody wrote fails every
    time instead of now and then (CI once failed so: a check rolled an unwritten logit column
    into a compared one). Torch fills only in its deterministic mode, asked for here with
    warnings, not errors, for the operations that have no deterministic form."""
    if torch.cuda.is_available():
        yield
        return
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.use_deterministic_algorithms(False)


@pytest.fixture(autouse=True)
def _fresh_replays():
    """Each test's calls are planned afresh, not replayed from another test's (some change the
    planner's tables or the fp8 workspace's rule): triton_sparse_mla/replay.py."""
    from triton_sparse_mla import replay

    replay.clear()


@pytest.fixture(scope="session")
def device():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
    return torch.device("cpu")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
