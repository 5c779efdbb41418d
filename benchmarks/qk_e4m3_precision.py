"""Counted on a CPU: the score error of the few-head fp8_ds_mla tile whose score dots read the
raw e4m3 rows (kernels/gluon_fp8_regs.py since 142f386, its "2^n" form below), against the
fp16 operands of the other fp8 tiles.

fp16 operands ("shipped" below; the decode tiles, ``TileConfig.fp8_f16``): each row's e4m3
values times their 128-column group's scale, rounded to fp16 (q scaled by 2^-8 into fp16), the
score dots over those. Raw rows: the score dots over the raw e4m3 bytes, with q as two e4m3
parts per head (``hi = e4m3(q s)``, ``lo = e4m3(16 (q s - hi))``, ``s = 448 / max |q|`` of the
head, side by side in one B operand), each group's partial score then multiplied by the row's
scale for that group, ``1 / s`` and ``1 / (16 s)``; and the same with ``s`` the power of two
that brings the head's largest value into (224, 448], as the kernel computes it: then q's
scaling is exact and a bf16 q's 8 significant bits fit the two parts. The rope stays bf16 in
both. Every product and sum here is float64 over operands rounded as the kernel would round
them (the fp32 accumulation of the tensor cores is not modelled). Reported: the output's
relative error against the float64 reference (the tests' measure; their bound for fp8_ds_mla
rows is 3e-2), and the scores' largest error.
Usage: python benchmarks/qk_e4m3_precision.py
"""

import torch

from triton_sparse_mla.formats import dequantize_fp8_ds_mla, quantize_fp8_ds_mla

E4M3 = torch.float8_e4m3fn


def _e4m3(x):
    return x.clamp(-448.0, 448.0).to(E4M3).double()


def _attend(s, v):
    """softmax over the rows of each (token, head), then the weighted sum of ``v``."""
    return torch.einsum("thk,tkd->thd", torch.softmax(s, dim=-1), v)


def case(t, h, k, q_tail, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, 576, generator=g, dtype=torch.float64)
    if q_tail:  # a heavy tail: a few columns 30x larger, as trained q's outlier channels
        q[..., torch.randperm(512, generator=g)[:16]] *= 30.0
    q = q.to(torch.bfloat16).double()
    rows = torch.randn(t * k, 576, generator=g)
    packed = quantize_fp8_ds_mla(rows)
    kv = dequantize_fp8_ds_mla(packed).double().reshape(t, k, 576)  # exact values
    raw = packed[:, :512].contiguous().view(E4M3).double().reshape(t, k, 4, 128)
    scale = packed[:, 512:528].contiguous().view(torch.float32).double().reshape(t, k, 4)
    sm = 576 ** -0.5

    ref = torch.einsum("thd,tkd->thk", q, kv) * sm
    out_ref = _attend(ref, kv[..., :512])

    s_rope = torch.einsum("thd,tkd->thk", q[..., 512:], kv[..., 512:])  # bf16 in both forms

    # shipped: fp16 operands (the rows' values rounded to fp16; q scaled by 2^-8 exactly)
    k16 = (raw.half().double() * scale[..., None].half().double()).half().double().reshape(t, k, 512)
    q16 = (q[..., :512] * 2.0 ** -8).half().double() * 2.0 ** 8
    s_ship = (torch.einsum("thd,tkd->thk", q16, k16) + s_rope) * sm

    # candidate: the raw e4m3 bytes, q in two e4m3 parts per head (the two parts' columns
    # summed after their dots; exact here, so summed first)
    amax = q[..., :512].abs().amax(dim=-1, keepdim=True)  # [t, h, 1]

    def raw_scores(s_q, low=True):
        hi = _e4m3(q[..., :512] * s_q)
        lo = _e4m3(16.0 * (q[..., :512] * s_q - hi)) if low else torch.zeros_like(hi)
        per_group = torch.einsum("thgc,tkgc->thkg", (hi + lo / 16.0).reshape(t, h, 4, 128), raw)
        return (torch.einsum("thkg,tkg->thk", per_group, scale) / s_q + s_rope) * sm

    res = {}
    for name, s in (("shipped", s_ship), ("e4m3 q hi+lo", raw_scores(448.0 / amax)),
                    ("e4m3 q hi only", raw_scores(448.0 / amax, low=False)),
                    ("e4m3 q 2^n hi+lo", raw_scores(torch.exp2(torch.floor(torch.log2(448.0 / amax)))))):
        out = _attend(s, kv[..., :512].to(torch.float16).double())  # V as the PV dots read it
        res[name] = ((out - out_ref).norm() / out_ref.norm()).item(), (s - ref).abs().max().item()
    return res


def main():
    for t, h, k, tail in ((4, 16, 2048, False), (4, 16, 2048, True), (2, 32, 2048, True)):
        for name, (rel, smax) in case(t, h, k, tail).items():
            print(f"QKE4M3 T={t} H={h} K={k} q_tail={int(tail)} {name:17} out rel err {rel:.2e} "
                  f"score max err {smax:.2e}")


if __name__ == "__main__":
    main()
