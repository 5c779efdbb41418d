"""The self-check the README starts with (``triton-sparse-mla check``): on a CPU its small problems
through the interpreter, on a GPU its decode- and prefill-sized ones, attention and indexer."""

import torch

from triton_sparse_mla import check, cli
from triton_sparse_mla.indexer import flat, fp8_products


def test_self_check_passes(device, capsys):
    """``triton-sparse-mla check`` as a user runs it: exit status 0, every verdict ok (the
    ``device`` fixture skips it where no kernel can run)."""
    status = cli.main(["check"])
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line for line in lines if line.startswith(("ok", "FAIL"))]
    # every attention geometry at each size, then the indexer's prefill and decode
    assert len(verdicts) >= len(check.GEOMETRIES) + 2, lines
    assert status == 0 and all(line.startswith("ok") for line in verdicts), "\n".join(lines)
    assert lines[-1] == "verdict: all checks passed"


def test_indexer_products_follow_the_device(device):
    """The fp8 tensor cores (and the check's looser indexer bound) where the hardware converts
    e4m3 (SM89 and newer); exact fp16 products under the interpreter and below SM89."""
    if device.type == "cuda":
        expected = flat.FP8_DOT and torch.cuda.get_device_capability(device) >= (8, 9)
    else:
        expected = False
    assert fp8_products(device) is expected
