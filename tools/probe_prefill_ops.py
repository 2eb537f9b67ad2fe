#!/usr/bin/env python3
"""How far each torch op the prefill uses is from reference.py's op, element by element, on the
GPU (issue 21: flint-nano's log-probability gap is 2.05e-4 nats with the kernel prefill and
1.37e-4 with the reference prefill, perf-log 2026-12-02): torch's fused RMSNorm, bf16 GEMMs
with and without cuBLAS's reduced-precision (bf16) split-K reductions
(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction, True by default),
torch._grouped_mm and the residual add, at the full config's shapes, 25 to 8,192 rows. Prints,
per op, the share of elements that differ, the largest difference in bf16 ulps of the reference
value and the mean difference relative to the mean magnitude.

    python3 tools/probe_prefill_ops.py      (on the device: carry .whl; no kernel cache needed)
"""
import torch
import torch.nn.functional as F

from flint_graph import reference

torch.manual_seed(0)
dev = "cuda"
print("torch", torch.__version__, "bf16 reduced-precision reduction default:",
      torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)


def cmp(name, got, want):
    d = (got.float() - want.float()).abs()
    ulp = want.float().abs().clamp_min(1e-30) * 2 ** -8
    print(f"{name:40s} differ {100 * (d > 0).float().mean().item():6.2f}%  "
          f"max {(d / ulp).max().item():6.2f} ulp  mean|d|/mean|ref| "
          f"{(d.mean() / want.float().abs().mean()).item():.2e}")


for t in (25, 512, 2048, 8192):
    x = torch.randn(t, 2048, device=dev).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(2048, device=dev)).to(torch.bfloat16)
    cmp(f"rms_norm T={t}", F.rms_norm(x, (2048,), w, 1e-5), reference.rms_norm(x, w, 1e-5))
    for n, k in ((5120, 2048), (2048, 4096), (1024, 2048), (2048, 512)):
        wt = (torch.randn(n, k, device=dev) * k ** -0.5).to(torch.bfloat16)
        xx = x[:, :k] if k <= 2048 else torch.randn(t, k, device=dev).to(torch.bfloat16)
        want = (xx.float() @ wt.float().T).to(torch.bfloat16)
        for red in (True, False):
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = red
            cmp(f"linear T={t} {n}x{k} reduced={red}", F.linear(xx, wt), want)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    # grouped: 8 groups
    if t >= 512:
        e, n, k = 8, 512, 2048
        wg = (torch.randn(e, n, k, device=dev) * k ** -0.5).to(torch.bfloat16)
        offs = torch.linspace(0, t, e + 1, device=dev)[1:].round().int()
        got = torch._grouped_mm(x, wg.transpose(1, 2), offs=offs)
        starts = [0] + offs.tolist()[:-1]
        want = torch.cat([(x[a:b].float() @ wg[i].float().T).to(torch.bfloat16)
                          for i, (a, b) in enumerate(zip(starts, offs.tolist()))])
        cmp(f"grouped_mm T={t} {e}x{n}x{k}", got, want)
    a = torch.randn(t, 2048, device=dev).to(torch.bfloat16)
    cmp(f"residual add T={t}", x + a, reference.residual_add(x, a))
