#!/usr/bin/python3
"""Write PyTorch reference directories for headgrad (a developer tool).

Each directory holds plain .npy files, the format of docs/design.md:
  MHA level:  inputs x, wq, wk, wv, wo, r;   expected out, dx, dwq, dwk, dwv, dwo
  core level: inputs q, k, v, mask, r;       expected out, dq, dk, dv
The loss is sum(out * r), so the gradients are those of that scalar.

Run with Debian's python3-torch (the pyenv python3 on the dev machines has no
torch):  /usr/bin/python3 tools/make_reference.py configs/refs
Its output is committed; headgrad never needs PyTorch to build, run or test.
"""
import argparse
import math
import pathlib

import numpy as np
import torch

# (B, T, D, H, causal, dtype)
MHA_CASES = [
    (2, 3, 8, 2, True, torch.float64),
    (2, 5, 12, 3, True, torch.float64),
    (1, 7, 16, 4, False, torch.float64),
    (3, 4, 6, 1, True, torch.float64),
    (2, 6, 16, 4, True, torch.float32),
]
# (B, H, Tq, Tk, d, mask): mask is "random" (a bool mask, every row keeps a key),
# "causal" (top-left aligned) or None
CORE_CASES = [
    (2, 3, 5, 7, 4, "random"),
    (1, 2, 6, 6, 8, "causal"),
    (2, 2, 4, 3, 4, None),
]


def mha(x, wq, wk, wv, wo, heads, causal):
    """Multi-head attention written the usual batched way (y = x W^T)."""
    B, T, D = x.shape
    d = D // heads

    def split(t):  # [B, T, D] -> [B, H, T, d]
        return t.view(B, T, heads, d).transpose(1, 2)

    q, k, v = split(x @ wq.T), split(x @ wk.T), split(x @ wv.T)
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v
    return o.transpose(1, 2).reshape(B, T, D) @ wo.T


def core(q, k, v, keep):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def save(directory, **tensors):
    directory.mkdir(parents=True, exist_ok=True)
    for name, t in tensors.items():
        np.save(directory / f"{name}.npy", np.ascontiguousarray(t.detach().numpy()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="folder to write the directories into")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(20261130)

    for B, T, D, H, causal, dtype in MHA_CASES:
        def rand(*shape, std=1.0):
            return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).to(dtype)

        x = rand(B, T, D).requires_grad_()
        ws = [rand(D, D, std=D ** -0.5).requires_grad_() for _ in range(4)]
        r = rand(B, T, D)
        out = mha(x, *ws, H, causal)
        (out * r).sum().backward()
        tag = "float32" if dtype == torch.float32 else "float64"
        name = f"mha_B{B}_T{T}_D{D}_H{H}_{'causal' if causal else 'full'}_{tag}"
        save(args.out / name, x=x, wq=ws[0], wk=ws[1], wv=ws[2], wo=ws[3], r=r, out=out,
             dx=x.grad, dwq=ws[0].grad, dwk=ws[1].grad, dwv=ws[2].grad, dwo=ws[3].grad)
        print("wrote", args.out / name)

    for B, H, Tq, Tk, d, mask in CORE_CASES:
        q, k, v = (torch.randn(B, H, t, d, generator=gen, dtype=torch.float64).requires_grad_()
                   for t in (Tq, Tk, Tk))
        r = torch.randn(B, H, Tq, d, generator=gen, dtype=torch.float64)
        keep = None
        if mask == "random":
            keep = torch.rand(B, H, Tq, Tk, generator=gen) < 0.6
            keep[..., 0] = True  # every query keeps a key: PyTorch gives NaN otherwise
        elif mask == "causal":
            keep = torch.ones(Tq, Tk, dtype=torch.bool).tril()
        out = core(q, k, v, keep)
        (out * r).sum().backward()
        name = f"core_B{B}_H{H}_Tq{Tq}_Tk{Tk}_d{d}_{mask or 'nomask'}"
        extra = {"mask": keep} if keep is not None else {}
        save(args.out / name, q=q, k=k, v=v, r=r, out=out, dq=q.grad, dk=k.grad, dv=v.grad,
             **extra)
        print("wrote", args.out / name)


if __name__ == "__main__":
    main()
