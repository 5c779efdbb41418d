"""The split-K combine kernel (kernels/combine.py) against a float64 merge of the partials."""

import math

import pytest
import torch

from triton_sparse_mla.kernels.combine import launch_combine


def _merge64(part_o, part_lse2, sink):
    """float64: ``out = sum_s 2^(L_s - L) o_s`` with ``L = log2(sum_s 2^L_s)``, scaled by
    ``e^lse / (e^lse + e^sink)``; ``lse`` natural-log; an all-empty row: zeros and -inf."""
    o, l2 = part_o.double(), part_lse2.double()  # [T, S, H, D], [T, H, S]
    lse2 = torch.logsumexp(l2 * math.log(2), dim=-1) / math.log(2)  # [T, H]
    w = torch.exp2(l2 - lse2[..., None]).nan_to_num(0.0)  # -inf - -inf -> nan -> 0
    out = torch.einsum("ths,tshd->thd", w, o)
    lse = lse2 * math.log(2)
    if sink is not None:
        out = out * torch.sigmoid(lse - sink.double())[..., None]
    return out, lse


@pytest.mark.parametrize("splits,heads,sink,with_lse", [
    (3, 5, True, True),     # an odd head count: the last program's second head is masked
    (2, 4, False, True),
    (5, 1, True, False),    # one head, no lse output
])
def test_combine_matches_float64(splits, heads, sink, with_lse, device):
    """Random partials with empty splits (lse -inf, huge rows) and one all-empty row, into
    a strided bf16 out; out and lse match the float64 merge."""
    g = torch.Generator().manual_seed(splits * 10 + heads)
    t = 3
    part_o = torch.randn(t, splits, heads, 512, generator=g)
    part_lse = torch.randn(t, heads, splits, generator=g) * 4
    part_lse[0, :, -1] = float("-inf")  # token 0: its last split empty for every head
    part_o[0, -1] = 1e30                # whose rows get weight 0
    part_lse[1, 0, :] = float("-inf")   # token 1, head 0: every split empty
    attn_sink = torch.randn(heads, generator=g) if sink else None
    ref_out, ref_lse = _merge64(part_o, part_lse, attn_sink)

    part_o, part_lse = part_o.to(device), part_lse.to(device)
    out = torch.full((t, heads, 512 + 64), 7.0, dtype=torch.bfloat16, device=device)[..., :512]
    lse = torch.full((t, heads), 7.0, dtype=torch.float32, device=device) if with_lse else None
    launch_combine(part_o, part_lse, attn_sink.to(device) if sink else None, out, lse)

    torch.testing.assert_close(out.double().cpu(), ref_out, rtol=1e-2, atol=1e-2)
    assert out[1, 0].abs().max().item() == 0.0  # the all-empty row is zero, not nan
    if with_lse:
        torch.testing.assert_close(lse.double().cpu(), ref_lse, rtol=1e-5, atol=1e-5)
        assert lse[1, 0].item() == float("-inf")
