#!/usr/bin/python3
"""Write PyTorch reference directories for headgrad (a developer tool).

Each directory holds plain .npy files, the format of docs/references.md
(a float32 one also golden/: the same names in float64 from its rounded inputs):
  MHA level:  inputs x, wq, wk, wv, wo, r;   expected out, dx, dwq, dwk, dwv, dwo
  core level: inputs q, k, v, mask, r;       expected out, dq, dk, dv
  rope level: inputs x, positions, r;        expected out, dx
plus positions.npy and the taps q_rot.npy, k_rot.npy in MHA-level RoPE cases,
and the biases bq, bk, bv, bo with dbq, dbk, dbv, dbo in the MHA-level bias cases,
the QK-norm gains q_norm, k_norm with dq_norm, dk_norm and the cross-attention
input x_kv with dx_kv in the QK-norm and cross cases (--cases qk-norm-cross),
and the sink logits sinks [H] with dsinks in the window, soft-cap and sink cases
(--cases window-softcap-sinks; window and softcap live in case.yaml).
The loss is sum(out * r), so the gradients are those of that scalar.
The grouped-KV and RoPE cases are written through the user entry point
(tools/headgrad_ref.py) from the plain PyTorch functions below.

Run with Debian's python3-torch (the pyenv python3 on the dev machines has no
torch):  /usr/bin/python3 tools/make_reference.py configs/refs [--cases all]
Its output is committed; headgrad never needs PyTorch to build, run or test.
"""
import argparse
import functools
import math
import pathlib

import numpy as np
import torch
import torch.nn.functional as F

import headgrad_ref  # beside this file

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


def mm(a, b):
    """a @ b. torch 1.13 has no float16 matmul on a CPU: float16 runs it in float32
    on the exact upcasts and rounds the result once (what its bfloat16 kernels do,
    and headgrad's rule); the casts' backward rounds the gradients the same way."""
    return (a.float() @ b.float()).to(a.dtype) if a.dtype == torch.float16 else a @ b


def softmax(s):
    """Softmax over the last dim; float16 through float32 as mm() (no CPU kernel)."""
    return torch.softmax(s.float(), dim=-1).to(s.dtype) if s.dtype == torch.float16 else torch.softmax(s, dim=-1)


def core(q, k, v, keep):
    s = mm(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return mm(softmax(s), v)


def save(directory, **tensors):
    directory.mkdir(parents=True, exist_ok=True)
    for name, t in tensors.items():
        np.save(directory / f"{name}.npy", np.ascontiguousarray(t.detach().numpy()))


def write_first_cases(folder):
    """The MHA (H = Hkv) and core cases, from one generator (kept bit-stable)."""
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
        save(folder / name, x=x, wq=ws[0], wk=ws[1], wv=ws[2], wo=ws[3], r=r, out=out,
             dx=x.grad, dwq=ws[0].grad, dwk=ws[1].grad, dwv=ws[2].grad, dwo=ws[3].grad)
        if dtype != torch.float64:  # golden/: the same values computed in float64 (draws nothing)
            x64 = x.detach().double().requires_grad_()
            w64 = [w.detach().double().requires_grad_() for w in ws]
            out64 = mha(x64, *w64, H, causal)
            (out64 * r.double()).sum().backward()
            save(folder / name / "golden", out=out64, dx=x64.grad, dwq=w64[0].grad, dwk=w64[1].grad,
                 dwv=w64[2].grad, dwo=w64[3].grad)
        print("wrote", folder / name)

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
        save(folder / name, q=q, k=k, v=v, r=r, out=out, dq=q.grad, dk=k.grad, dv=v.grad,
             **extra)
        print("wrote", folder / name)


def write_first_goldens(folder):
    """golden/ for the first float32 MHA case: its committed float32 inputs cast to
    float64, the same mha() in float64 (the float32 files themselves stay as written)."""
    for B, T, D, H, causal, dtype in MHA_CASES:
        if dtype != torch.float32:
            continue
        name = f"mha_B{B}_T{T}_D{D}_H{H}_{'causal' if causal else 'full'}_float32"
        src = folder / name

        def load(stem, grad=True):
            return torch.from_numpy(np.load(src / f"{stem}.npy")).to(torch.float64).requires_grad_(grad)

        x, ws, r = load("x"), [load(w) for w in ("wq", "wk", "wv", "wo")], load("r", grad=False)
        out = mha(x, *ws, H, causal)
        (out * r).sum().backward()
        save(src / "golden", x=x, wq=ws[0], wk=ws[1], wv=ws[2], wo=ws[3], r=r, out=out,
             dx=x.grad, dwq=ws[0].grad, dwk=ws[1].grad, dwv=ws[2].grad, dwo=ws[3].grad)
        print("wrote", src / "golden")


def rope(x, positions, *, theta, style, rotary_dim):
    """Rotary embedding of x [..., T, d] at positions [T] or [B, T] (B = x's first dim).

    Frequencies w_k = theta^(-2k/r), angles p_t * w_k and their cos/sin are built in
    float64 whatever x's dtype (float32 tables cost 1e-6 relative at p ~ 1000), then
    cast. Pairs (2k, 2k+1) for style "interleaved", (k, k + r/2) for "half"; the
    first r = rotary_dim dims rotate, the rest pass through.
    """
    r = rotary_dim
    w = theta ** (-2.0 * torch.arange(r // 2, dtype=torch.float64) / r)  # [r/2]
    phi = positions.to(torch.float64)[..., None] * w                    # [T, r/2] or [B, T, r/2]
    if positions.dim() == 2 and x.dim() == 4:
        phi = phi[:, None]                                              # [B, 1, T, r/2]: every head
    cos, sin = phi.cos().to(x.dtype), phi.sin().to(x.dtype)
    rot, rest = x[..., :r], x[..., r:]
    if style == "interleaved":
        a, b = rot[..., 0::2], rot[..., 1::2]
    elif style == "half":
        a, b = rot[..., : r // 2], rot[..., r // 2:]
    else:
        raise ValueError(f"rope style '{style}' is not interleaved or half")
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    turned = torch.stack([a2, b2], dim=-1).flatten(-2) if style == "interleaved" else torch.cat([a2, b2], -1)
    return torch.cat([turned, rest], dim=-1)


def grouped_attention(x, wq, wk, wv, wo, *, num_heads, num_kv_heads, head_dim, causal, positions=None,
                      rope_settings=None):
    """MHA with Hkv <= H kv heads, head width d (y = x W^T), optional RoPE on q and k.

    Query head h reads kv head h // G (G = H / Hkv): k and v are expanded with
    repeat_interleave(G, dim=1), the documented equivalent of SDPA's enable_gqa.
    With RoPE it returns (out, {"q_rot", "k_rot"}), the taps after the rotation.
    """
    B, T, _ = x.shape
    H, Hkv, d = num_heads, num_kv_heads, head_dim

    def split(t, heads):  # [B, T, heads*d] -> [B, heads, T, d]
        return t.view(B, T, heads, d).transpose(1, 2)

    q, k, v = split(mm(x, wq.T), H), split(mm(x, wk.T), Hkv), split(mm(x, wv.T), Hkv)
    if rope_settings is not None:
        q, k = rope(q, positions, **rope_settings), rope(k, positions, **rope_settings)
    keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else None
    o = core(q, k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1), keep)
    out = mm(o.transpose(1, 2).reshape(B, T, H * d), wo.T)
    return out if rope_settings is None else (out, {"q_rot": q, "k_rot": k})


def grouped_core(q, k, v, mask=None):
    """Core attention; k, v may have Hkv heads where q [B, H, Tq, d] has H (or all [B, T, d])."""
    if q.dim() == 4 and k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return core(q, k, v, mask)


def rope_core(q, k, v, *, positions, q_offset, mask, rope_settings):
    """Core attention with RoPE: keys at positions, queries at positions[..., :Tq] + q_offset.

    q [B, H, Tq, d], k and v [B, Hkv, Tk, d] (or all [B, T, d]); the rotation in float64
    tables (rope above), then grouped_core. With a head axis it also returns the taps.
    """
    q_rot = rope(q, positions[..., : q.shape[-2]] + q_offset, **rope_settings)
    k_rot = rope(k, positions, **rope_settings)
    out = grouped_core(q_rot, k_rot, v, mask)
    return (out, {"q_rot": q_rot, "k_rot": k_rot}) if q.dim() == 4 else out


def gapped_positions(B, T, starts, seed):
    """[B, T] int64: row b starts at starts[b] and steps by random gaps of 1 to 5."""
    rng = np.random.default_rng(seed)
    gaps = rng.integers(1, 6, size=(B, T - 1))
    return np.concatenate([np.array(starts)[:, None], np.array(starts)[:, None] + gaps.cumsum(1)], 1)


# Grouped kv heads (GQA, MQA): (name, shape, dtype). H 12 / Hkv 3 hides none of the
# grouped-KV bugs (1 < Hkv < H, H != Hkv^2, B != H, B != Hkv); D 8 with d 4 also
# covers a head width given apart from D / H.
GQA_CASES = [
    ("mha_B2_T7_D8_H12_Hkv3_d4_causal_float64", dict(B=2, T=7, D=8, H=12, Hkv=3, d=4), "float64"),
    ("mha_B2_T7_D8_H12_Hkv3_d4_causal_float32", dict(B=2, T=7, D=8, H=12, Hkv=3, d=4), "float32"),
    ("mha_B2_T5_D16_H4_Hkv1_causal_float64", dict(B=2, T=5, D=16, H=4, Hkv=1), "float64"),
    ("mha_B2_T5_D16_H4_Hkv1_causal_float32", dict(B=2, T=5, D=16, H=4, Hkv=1), "float32"),
]
CORE_GQA_CASES = [
    ("core_B2_H12_Hkv3_Tq5_Tk7_d4_causal_float64", dict(B=2, H=12, Hkv=3, Tq=5, Tk=7, d=4), "float64"),
    ("core_B2_H12_Hkv3_Tq5_Tk7_d4_causal_float32", dict(B=2, H=12, Hkv=3, Tq=5, Tk=7, d=4), "float32"),
    # CS336-shaped: 3-D q, k, v [B, T, d], causal
    ("core_cs336_B2_T9_d16_causal_float64", dict(B=2, T=9, d=16), "float64"),
]
# MHA-level RoPE under GQA: (name, shape, dtype, rope settings). Row 0 of the
# positions starts at 0, row 1 at 1000; both gapped.
ROPE_MHA_CASES = [
    ("mha_B2_T7_D8_H6_Hkv3_d4_causal_rope_interleaved_float64", dict(B=2, T=7, D=8, H=6, Hkv=3, d=4),
     "float64", dict(theta=10000.0, style="interleaved", rotary_dim=4)),
    ("mha_B2_T7_D8_H6_Hkv3_d4_causal_rope_half_float64", dict(B=2, T=7, D=8, H=6, Hkv=3, d=4),
     "float64", dict(theta=500000.0, style="half", rotary_dim=4)),
    ("mha_B2_T7_D8_H6_Hkv3_d6_causal_rope_half_r4_float64", dict(B=2, T=7, D=8, H=6, Hkv=3, d=6),
     "float64", dict(theta=10000.0, style="half", rotary_dim=4)),
    ("mha_B2_T7_D8_H6_Hkv3_d4_causal_rope_interleaved_float32", dict(B=2, T=7, D=8, H=6, Hkv=3, d=4),
     "float32", dict(theta=10000.0, style="interleaved", rotary_dim=4)),
]
# Core-level RoPE: (name, shape, dtype, rope settings, positions, q_offset, mask).
# positions: row starts of gapped per-row positions (written as positions.npy, Tq = Tk),
# or an int N: keys at N + 0..Tk-1 (case.yaml {offset: N}; the runner builds them at
# Tq != Tk). mask "causal" is top-left, "decode" bottom-right (key j <= q_offset + i:
# queries are the last Tq tokens).
ROPE_CORE_CASES = [
    ("core_B2_H6_Hkv2_T7_d8_causal_rope_interleaved_float64", dict(B=2, H=6, Hkv=2, T=7, d=8), "float64",
     dict(theta=10000.0, style="interleaved", rotary_dim=8), [0, 1000], 0, "causal"),
    ("core_B2_H6_Hkv2_T7_d8_causal_rope_interleaved_float32", dict(B=2, H=6, Hkv=2, T=7, d=8), "float32",
     dict(theta=10000.0, style="interleaved", rotary_dim=8), [0, 1000], 0, "causal"),
    # decode-like: Tq < Tk, queries at 1000 + 4 + i, keys at 1000 + j
    ("core_B2_H3_Tq3_Tk7_d8_decode_rope_half_float64", dict(B=2, H=3, Tq=3, Tk=7, d=8), "float64",
     dict(theta=500000.0, style="half", rotary_dim=8), 1000, 4, "decode"),
    # gapped per-row positions with a q_offset on top, half pairing, partial rotary, GQA
    ("core_B2_H6_Hkv3_T6_d8_causal_rope_half_r4_qoff2_float64", dict(B=2, H=6, Hkv=3, T=6, d=8), "float64",
     dict(theta=10000.0, style="half", rotary_dim=4), [1000, 3], 2, "causal"),
    # CS336-shaped: 3-D q, k, v [B, T, d], interleaved, theta 10000
    ("core_cs336_B2_T9_d16_causal_rope_interleaved_float64", dict(B=2, T=9, d=16), "float64",
     dict(theta=10000.0, style="interleaved", rotary_dim=16), [0, 1000], 0, "causal"),
]
# RoPE level: (name, shape, dtype, rope settings, row starts of the positions)
ROPE_LEVEL_CASES = [
    ("rope_B2_T9_d16_half_float64", dict(B=2, T=9, d=16), "float64",
     dict(theta=500000.0, style="half", rotary_dim=16), [3, 1000]),
    ("rope_B2_H3_T7_d8_interleaved_float64", dict(B=2, H=3, T=7, d=8), "float64",
     dict(theta=10000.0, style="interleaved", rotary_dim=8), [1000, 0]),
    ("rope_B2_T9_d16_interleaved_r8_float32", dict(B=2, T=9, d=16), "float32",
     dict(theta=10000.0, style="interleaved", rotary_dim=8), [0, 1200]),
    # CS336's run_rope: [B, T, d_k] input, interleaved, theta 10000, d_k 16
    ("rope_cs336_B3_T12_d16_interleaved_float64", dict(B=3, T=12, d=16), "float64",
     dict(theta=10000.0, style="interleaved", rotary_dim=16), [0, 1000, 5]),
]


def biased_attention(x, wq, wk, wv, wo, *, bq, bk, bv, bo, num_heads, num_kv_heads, head_dim, causal):
    """MHA with biases on every projection, as nn.Linear(bias=True) computes it:
    F.linear(x, w, b) = x W^T + b; Hkv <= H kv heads (repeat_interleave), head width d."""
    B, T, _ = x.shape
    H, Hkv, d = num_heads, num_kv_heads, head_dim

    def split(t, heads):  # [B, T, heads*d] -> [B, heads, T, d]
        return t.view(B, T, heads, d).transpose(1, 2)

    q = split(F.linear(x, wq, bq), H)
    k, v = split(F.linear(x, wk, bk), Hkv), split(F.linear(x, wv, bv), Hkv)
    keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else None
    o = core(q, k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1), keep)
    return F.linear(o.transpose(1, 2).reshape(B, T, H * d), wo, bo)


# Biases (nn.Linear's default): (name, shape, dtype), GQA with d apart from D / H.
BIAS_CASES = [
    ("mha_B2_T7_D8_H6_Hkv3_d4_causal_bias_float64", dict(B=2, T=7, D=8, H=6, Hkv=3, d=4), "float64"),
    ("mha_B2_T7_D8_H6_Hkv3_d4_causal_bias_float32", dict(B=2, T=7, D=8, H=6, Hkv=3, d=4), "float32"),
]


def write_bias_cases(out):
    """MHA references with biases (float32 with golden/), through headgrad_ref."""
    for seed, (name, shape, dtype) in enumerate(BIAS_CASES, start=600):
        headgrad_ref.write_reference(biased_attention, out / name, shape, seed=seed, dtype=dtype, bias=True,
                                     suite_dir=out.parent, overwrite=True)
        print("wrote", out / name)


# 16-bit: (name, shape, dtype). PyTorch on a CPU computes each op in float32 and
# rounds its result; the writer adds golden/ (float64 on the same input values).
LOWP_CASES = [
    ("mha_B2_T8_D16_H4_causal_bfloat16", dict(B=2, T=8, D=16, H=4), "bfloat16"),
    ("mha_B2_T8_D16_H4_causal_float16", dict(B=2, T=8, D=16, H=4), "float16"),
]


# ---- QK-norm and cross-attention ----

def rms_norm(t, g, eps):
    """RMSNorm over the last dim, as HF's Qwen3RMSNorm / Olmo2RMSNorm write it:
    t * rsqrt(mean(t^2) + eps) * g, the statistics in float32 at least (as HF
    upcasts), the result in t's dtype."""
    wide = t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * g.to(wide.dtype)).to(t.dtype)


def modern_attention(x, wq, wk, wv, wo, *, num_heads, num_kv_heads, head_dim, causal, q_norm=None, k_norm=None,
                     qk_norm=None, x_kv=None, positions=None, rope_settings=None):
    """MHA with QK-norm and cross-attention, written from the models' code:
    q = x Wq^T, k = x_kv Wk^T, v = x_kv Wv^T (x_kv = x unless cross) -> QK-norm over
    the whole projection (axis model, OLMo 2: before the head reshape) -> split heads ->
    QK-norm over d (axis head, Qwen3 / Gemma 3) -> RoPE -> attention (causal top-left,
    key j <= query i) -> merge -> Wo. Gain g = w, or 1 + w (one_plus_w, Gemma)."""
    B, Tq, _ = x.shape
    src = x if x_kv is None else x_kv
    Tk = src.shape[1]
    H, Hkv, d = num_heads, num_kv_heads, head_dim
    q, k, v = mm(x, wq.T), mm(src, wk.T), mm(src, wv.T)
    if qk_norm is not None:
        gq, gk = (q_norm + 1, k_norm + 1) if qk_norm["gain"] == "one_plus_w" else (q_norm, k_norm)
    if qk_norm is not None and qk_norm["axis"] == "model":
        q, k = rms_norm(q, gq, qk_norm["eps"]), rms_norm(k, gk, qk_norm["eps"])
    q = q.view(B, Tq, H, d).transpose(1, 2)
    k, v = k.view(B, Tk, Hkv, d).transpose(1, 2), v.view(B, Tk, Hkv, d).transpose(1, 2)
    if qk_norm is not None and qk_norm["axis"] == "head":
        q, k = rms_norm(q, gq, qk_norm["eps"]), rms_norm(k, gk, qk_norm["eps"])
    if rope_settings is not None:
        q, k = rope(q, positions, **rope_settings), rope(k, positions, **rope_settings)
    keep = torch.ones(Tq, Tk, dtype=torch.bool).tril() if causal else None
    o = core(q, k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1), keep)
    out = mm(o.transpose(1, 2).reshape(B, Tq, H * d), wo.T)
    return out if rope_settings is None else (out, {"q_rot": q, "k_rot": k})


# (name, shape, dtype, causal, qk_norm settings or None, cross, rope settings or None)
QK_NORM_CROSS_CASES = [
    ("mha_B2_T7_D24_H6_Hkv2_causal_qknorm_head_rope_float64", dict(B=2, T=7, D=24, H=6, Hkv=2), "float64", True,
     dict(axis="head", eps=1e-6, gain="w"), False, dict(theta=10000.0, style="half", rotary_dim=4)),
    ("mha_B2_T6_D24_H6_Hkv3_causal_qknorm_model_1pw_rope_float32", dict(B=2, T=6, D=24, H=6, Hkv=3), "float32",
     True, dict(axis="model", eps=1e-6, gain="one_plus_w"), False, dict(theta=10000.0, style="interleaved",
                                                                          rotary_dim=4)),
    ("mha_B2_Tq5_Tk9_D24_H6_Hkv2_cross_qknorm_head_float64", dict(B=2, Tq=5, Tk=9, D=24, H=6, Hkv=2), "float64",
     False, dict(axis="head", eps=1e-6, gain="w"), True, None),
    ("mha_B2_Tq5_Tk9_D24_H6_Hkv3_cross_float32", dict(B=2, Tq=5, Tk=9, D=24, H=6, Hkv=3), "float32", False, None,
     True, None),
]


def write_qk_norm_cross_cases(out):
    """QK-norm and cross-attention references (float32 with golden/), through headgrad_ref,
    and one small-activation QK-norm case written here (x scaled by 0.05: mean(q^2) about
    2.5e-3, where an eps off by 1e-5 moves out by 1e-2)."""
    for seed, (name, shape, dtype, causal, qk_norm, cross, settings) in enumerate(QK_NORM_CROSS_CASES, start=700):
        fn = modern_attention if settings is None else functools.partial(modern_attention, rope_settings=settings)
        positions = gapped_positions(shape["B"], shape["T"], [0, 1000], seed) if settings else None
        headgrad_ref.write_reference(fn, out / name, shape, seed=seed, dtype=dtype, causal=causal, qk_norm=qk_norm,
                                     cross=cross, positions=positions, rope=settings, suite_dir=out.parent,
                                     overwrite=True)
        print("wrote", out / name)
    # small activations: drawn in headgrad's order (x, wq, wk, wv, wo, r, q_norm, k_norm)
    B, T, D, H, Hkv = 2, 6, 24, 6, 2
    d = D // H
    settings = dict(axis="head", eps=1e-6, gain="w")
    gen = torch.Generator().manual_seed(720)

    def draw(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    x = (draw(B, T, D) * 0.05).requires_grad_()
    ws = [draw(H * d, D, std=D ** -0.5), draw(Hkv * d, D, std=D ** -0.5), draw(Hkv * d, D, std=D ** -0.5),
          draw(D, H * d, std=(H * d) ** -0.5)]
    ws = [w.requires_grad_() for w in ws]
    r = draw(B, T, D)
    gains = [(draw(d, std=0.5) + 1).requires_grad_() for _ in range(2)]
    out_t = modern_attention(x, *ws, num_heads=H, num_kv_heads=Hkv, head_dim=d, causal=True, q_norm=gains[0],
                             k_norm=gains[1], qk_norm=settings)
    (out_t * r).sum().backward()
    name = "mha_B2_T6_D24_H6_Hkv2_causal_qknorm_head_small_float64"
    save(out / name, x=x, wq=ws[0], wk=ws[1], wv=ws[2], wo=ws[3], r=r, q_norm=gains[0], k_norm=gains[1],
         out=out_t, dx=x.grad, dwq=ws[0].grad, dwk=ws[1].grad, dwv=ws[2].grad, dwo=ws[3].grad,
         dq_norm=gains[0].grad, dk_norm=gains[1].grad)
    (out / name / "case.yaml").write_text(
        "# A suite case that checks this directory (float64; x scaled by 0.05: small activations).\n"
        f"- name: {name}\n  compare: [per_head]\n  reference: \"refs/{name}\"\n  shape: {{H: {H}, Hkv: {Hkv}}}\n"
        "  causal: true\n  qk_norm: {axis: head, eps: 1.0e-06, gain: w}\n")
    print("wrote", out / name)


# ---- sliding windows, logit soft-capping, attention sinks ----

def window_keep(Tq, Tk, causal, window):
    """bool [Tq, Tk] from index arithmetic: p_i = i + (Tk - Tq) under causal bottom_right,
    else i; causal keeps j <= p_i, the window p_i - left <= j <= p_i + right (an absent bound
    is unbounded). None when nothing is masked."""
    if not causal and window is None:
        return None
    i = torch.arange(Tq).unsqueeze(1)
    j = torch.arange(Tk).unsqueeze(0)
    p = i + (Tk - Tq if causal == "bottom_right" else 0)
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        keep = keep & (j <= p)
    if window is not None:
        if window.get("left") is not None:
            keep = keep & (p - window["left"] <= j)
        if window.get("right") is not None:
            keep = keep & (j <= p + window["right"])
    return keep


def sink_core(q, k, v, keep, softcap=None, sinks=None):
    """Core attention with a cap and sinks, written as gpt-oss and Gemma 2 write them:
    s = scale q k^T; s = C tanh(s / C) (after the scale, before the mask); masked keys -inf;
    with sinks the per-head logit is appended as one more column (not scaled, not capped),
    softmax over keys and sink, the sink column dropped. k, v may have Hkv heads (expanded
    with repeat_interleave). A row with no key left gives zeros (all mass on the sink;
    without sinks, zeros too: headgrad's rule, where softmax would give NaN)."""
    if k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        col = sinks.view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        w = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    else:
        empty = s.isinf().all(-1, keepdim=True) if keep is not None else None
        w = torch.softmax(s if empty is None else s.masked_fill(empty, 0.0), dim=-1)
        if empty is not None:
            w = w.masked_fill(empty, 0.0)
    return w @ v


def sink_attention(x, wq, wk, wv, wo, *, num_heads, num_kv_heads, head_dim, causal, window=None, softcap=None,
                   sinks=None, positions=None, rope_settings=None):
    """MHA (y = x W^T, Hkv kv heads, head width d, optional RoPE) around sink_core;
    causal top-left (self-attention: Tq = Tk)."""
    B, T, _ = x.shape
    H, Hkv, d = num_heads, num_kv_heads, head_dim

    def split(t, heads):
        return t.view(B, T, heads, d).transpose(1, 2)

    q, k, v = split(x @ wq.T, H), split(x @ wk.T, Hkv), split(x @ wv.T, Hkv)
    if rope_settings is not None:
        q, k = rope(q, positions, **rope_settings), rope(k, positions, **rope_settings)
    o = sink_core(q, k, v, window_keep(T, T, causal, window), softcap, sinks)
    out = o.transpose(1, 2).reshape(B, T, H * d) @ wo.T
    return out if rope_settings is None else (out, {"q_rot": q, "k_rot": k})


def sink_core_fn(q, k, v, *, causal, mask=None, window=None, softcap=None, sinks=None):
    """Core level: the window built here from index arithmetic (causal=True top-left,
    'bottom_right' on the last key), ANDed with the mask handed over (mask.npy)."""
    keep = window_keep(q.shape[-2], k.shape[-2], causal, window)
    if mask is not None:
        keep = mask if keep is None else keep & mask
    return sink_core(q, k, v, keep, softcap, sinks)


# (name, level, shape, dtype, causal, window, softcap, rope settings, mask): every one with sinks.
SINK_CASES = [
    # gpt-oss-like: W 4 keys at T 11 (> W + 1), a small cap (the scores reach 3-5 C), GQA 6/2, RoPE
    ("mha_B2_T11_D24_H6_Hkv2_d4_causal_window3_softcap_sinks_rope_float64", "mha",
     dict(B=2, T=11, D=24, H=6, Hkv=2, d=4), "float64", True, dict(left=3, right=0), 0.75,
     dict(theta=500000.0, style="half", rotary_dim=4), None),
    # a decode step: Tq 3 of Tk 11 on the bottom-right diagonal, W 4 (keys i+5 .. i+8)
    ("core_B2_H6_Hkv2_Tq3_Tk11_d8_decode_window3_sinks_float64", "core", dict(B=2, H=6, Hkv=2, Tq=3, Tk=11, d=8),
     "float64", "bottom_right", dict(left=3), None, None, None),
    # float32: a two-sided non-causal window, the cap, sinks and a mask with a fully masked row
    ("core_B2_H6_Hkv2_Tq10_Tk12_d8_window2_1_softcap_sinks_emptyrow_float32", "core",
     dict(B=2, H=6, Hkv=2, Tq=10, Tk=12, d=8), "float32", False, dict(left=2, right=1), 0.75, None, "empty_row"),
]


def write_sink_cases(out):
    """Window, soft-cap and sink references (float32 with golden/), through headgrad_ref,
    from sink_attention / sink_core_fn above (no SDPA: torch 1.13 has none)."""
    for seed, (name, level, shape, dtype, causal, window, softcap, settings, mask) in enumerate(SINK_CASES,
                                                                                                start=800):
        kw = {}
        if level == "mha":
            fn = sink_attention
            if settings is not None:
                fn = functools.partial(sink_attention, rope_settings=settings)
                kw.update(positions=gapped_positions(shape["B"], shape["T"], [0, 1000], seed), rope=settings)
        else:
            fn = sink_core_fn
            if mask == "empty_row":  # random keeps, every row but row 4 keeps key 0; row 4 keeps none
                rng = np.random.default_rng(seed)
                keep = rng.random((shape["Tq"], shape["Tk"])) < 0.7
                keep[:, 0] = True
                keep[4] = False
                kw["mask"] = keep
        headgrad_ref.write_reference(fn, out / name, shape, level=level, seed=seed, dtype=dtype, causal=causal,
                                     window=window, softcap=softcap, sinks=True, suite_dir=out.parent,
                                     overwrite=True, **kw)
        print("wrote", out / name)


def write_lowp_cases(out):
    """bfloat16 and float16 MHA references (with golden/), through headgrad_ref."""
    for seed, (name, shape, dtype) in enumerate(LOWP_CASES, start=500):
        headgrad_ref.write_reference(grouped_attention, out / name, shape, seed=seed, dtype=dtype,
                                     suite_dir=out.parent, overwrite=True)
        print("wrote", out / name)


def write_gqa_rope_cases(out):
    """Grouped-KV and RoPE cases, each from its own seed, through headgrad_ref."""
    for seed, (name, shape, dtype) in enumerate(GQA_CASES, start=100):
        headgrad_ref.write_reference(grouped_attention, out / name, shape, seed=seed, dtype=dtype,
                                     suite_dir=out.parent, overwrite=True)
        print("wrote", out / name)
    for seed, (name, shape, dtype) in enumerate(CORE_GQA_CASES, start=200):
        headgrad_ref.write_reference(grouped_core, out / name, shape, level="core", seed=seed, dtype=dtype,
                                     suite_dir=out.parent, overwrite=True)
        print("wrote", out / name)
    for seed, (name, shape, dtype, settings) in enumerate(ROPE_MHA_CASES, start=300):
        fn = functools.partial(grouped_attention, rope_settings=settings)
        positions = gapped_positions(shape["B"], shape["T"], [0, 1000], seed)
        headgrad_ref.write_reference(fn, out / name, shape, seed=seed, dtype=dtype, positions=positions,
                                     rope=settings, suite_dir=out.parent, overwrite=True)
        print("wrote", out / name)
    for seed, (name, shape, dtype, settings, where, q_offset, mask) in enumerate(ROPE_CORE_CASES, start=500):
        fn = functools.partial(rope_core, rope_settings=settings)
        tq, tk = shape.get("Tq", shape.get("T")), shape.get("Tk", shape.get("T"))
        if isinstance(where, int):
            positions = where + np.arange(tk)
        else:
            positions = gapped_positions(shape["B"], tk, where, seed)
        keep = np.tril(np.ones((tq, tk), dtype=bool), tk - tq if mask == "decode" else 0)
        headgrad_ref.write_reference(fn, out / name, shape, level="core", seed=seed, dtype=dtype,
                                     positions=positions, q_offset=q_offset, rope=settings, mask=keep,
                                     suite_dir=out.parent, overwrite=True)
        print("wrote", out / name)
    for seed, (name, shape, dtype, settings, starts) in enumerate(ROPE_LEVEL_CASES, start=400):
        fn = functools.partial(rope, **settings)
        headgrad_ref.write_rope_reference(fn, out / name, shape, seed=seed, dtype=dtype, rope=settings,
                                          positions=gapped_positions(shape["B"], shape["T"], starts, seed),
                                          suite_dir=out.parent, overwrite=True)
        print("wrote", out / name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="folder to write the directories into")
    parser.add_argument("--cases", choices=["all", "first", "gqa-rope", "lowp", "bias", "qk-norm-cross",
                                            "window-softcap-sinks"],
                        default="gqa-rope",
                        help="which directories to write (default: the grouped-KV and RoPE ones)")
    args = parser.parse_args()
    # The first cases are committed as written once; another torch build may round
    # them differently, so they are rewritten only on request.
    if args.cases in ("all", "first"):
        write_first_cases(args.out)
    if args.cases in ("all", "gqa-rope"):
        write_gqa_rope_cases(args.out)
        write_first_goldens(args.out)
    if args.cases in ("all", "lowp"):
        write_lowp_cases(args.out)
    if args.cases in ("all", "bias"):
        write_bias_cases(args.out)
    if args.cases in ("all", "qk-norm-cross"):
        write_qk_norm_cross_cases(args.out)
    if args.cases in ("all", "window-softcap-sinks"):
        write_sink_cases(args.out)


if __name__ == "__main__":
    main()
