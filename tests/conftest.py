"""Shared fixtures: the device under test and seeded problem builders.

On a machine without CUDA the tests run through Triton's interpreter: ``TRITON_INTERPRET=1``
must be set before Triton is imported, so it is set here when no GPU is present.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
