#!/usr/bin/python3
"""QK-norm and cross-attention in reference directories: tools/headgrad_ref.py's
qk_norm= and cross= (--qk-norm, --cross) end to end through the built headgrad, and
the committed references checked against a second implementation.

Usage: test_qk_norm_cross_ref.py HEADGRAD_EXE   (meson passes the built program)
Needs PyTorch (Debian's python3-torch in /usr/bin/python3); exits 77 (a skip for
meson) when torch cannot be imported, and says so.

1. A user's attention written with einsum over explicit head axes (not as
   make_reference.py writes it), with QK-norm in both axes and both gain
   conventions and cross-attention, goes through the writer; `headgrad run` checks
   the directory against per_head and passes. The same function normalizing q only
   fails (exit 1), naming dk_norm.
2. The writer refuses what is not defined or not taken: qk_norm for a function
   without q_norm, cross without Tq and Tk, RoPE with cross, a bad axis.
3. The committed references against the einsum implementation (1e-12 in float64,
   on golden/ for float32), and the small-activation one is small (mean(q^2) < 1e-2).
"""
import math
import pathlib
import subprocess
import sys
import tempfile
import unittest

from torch_required import torch  # noqa: E402,F401  (skips the test, exit 77, where torch is absent)
import headgrad_main  # noqa: E402
import numpy as np  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
REFS = REPO / "configs" / "refs"
sys.path.insert(0, str(REPO / "tools"))
import headgrad_ref  # noqa: E402

HEADGRAD = None  # set from argv in main


def rms(t, g, eps):
    """RMSNorm over the last dim: t / sqrt(mean(t^2) + eps) * g."""
    return t / torch.sqrt((t * t).mean(-1, keepdim=True) + eps) * g


def einsum_attention(x, wq, wk, wv, wo, *, num_heads, num_kv_heads, head_dim, causal, q_norm=None, k_norm=None,
                     qk_norm=None, x_kv=None, k_unnormed=False):
    """q, k, v with explicit head axes; QK-norm over the whole projection (axis model)
    or each head (axis head); k and v from x_kv in cross-attention; causal top-left."""
    B, Tq, D = x.shape
    src = x if x_kv is None else x_kv
    Tk = src.shape[1]
    H, Hkv, d = num_heads, num_kv_heads, head_dim
    q = torch.einsum("btD,hdD->bthd", x, wq.view(H, d, D))
    k = torch.einsum("btD,hdD->bthd", src, wk.view(Hkv, d, D))
    v = torch.einsum("btD,hdD->bthd", src, wv.view(Hkv, d, D))
    if qk_norm:
        one = 1.0 if qk_norm["gain"] == "one_plus_w" else 0.0
        if qk_norm["axis"] == "model":
            q = rms(q.reshape(B, Tq, H * d), q_norm + one, qk_norm["eps"]).view(B, Tq, H, d)
            if not k_unnormed:
                k = rms(k.reshape(B, Tk, Hkv * d), k_norm + one, qk_norm["eps"]).view(B, Tk, Hkv, d)
        else:
            q = rms(q, q_norm + one, qk_norm["eps"])
            if not k_unnormed:
                k = rms(k, k_norm + one, qk_norm["eps"])
    k, v = k.repeat_interleave(H // Hkv, 2), v.repeat_interleave(H // Hkv, 2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
    if causal:
        s = s + torch.full((Tq, Tk), float("-inf"), dtype=x.dtype).triu(1)
    o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)
    return torch.einsum("bthd,Dhd->btD", o, wo.view(D, H, d))


def q_only(x, wq, wk, wv, wo, **kw):
    return einsum_attention(x, wq, wk, wv, wo, k_unnormed=True, **kw)


def no_gains(x, wq, wk, wv, wo, *, num_heads, causal):
    return x


def run_headgrad(suite):
    return subprocess.run([HEADGRAD, "run", str(suite)], capture_output=True, text=True, timeout=120)


SELF = dict(B=2, T=5, D=24, H=6, Hkv=2)
CROSS = dict(B=2, Tq=5, Tk=9, D=24, H=6, Hkv=2)


class WriterThroughHeadgrad(unittest.TestCase):
    def write_and_run(self, fn, shape, **kw):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            out = headgrad_ref.write_reference(fn, tmp / "refs" / "mine", shape, seed=5, suite_dir=tmp, **kw)
            case = (out / "case.yaml").read_text()
            (tmp / "suite.yaml").write_text("suite: user\ncases:\n" + "\n".join(
                "  " + line for line in case.splitlines() if not line.startswith("#")) + "\n")
            return out.name, case, run_headgrad(tmp / "suite.yaml")

    def test_qk_norm_both_axes_and_gains_pass(self):
        for axis in ("head", "model"):
            for gain in ("w", "one_plus_w"):
                _, case, res = self.write_and_run(einsum_attention, SELF, causal=True,
                                                  qk_norm=dict(axis=axis, eps=1e-6, gain=gain))
                self.assertIn(f"qk_norm: {{axis: {axis}, eps: 1e-06, gain: {gain}}}", case)
                self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_cross_with_qk_norm_passes_and_writes_x_kv(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = headgrad_ref.write_reference(einsum_attention, pathlib.Path(tmp) / "c", CROSS, seed=3, causal=False,
                                               cross=True, qk_norm=dict(axis="head"))
            self.assertEqual(np.load(out / "x_kv.npy").shape, (2, 9, 24))
            self.assertEqual(np.load(out / "dx_kv.npy").shape, (2, 9, 24))
            self.assertEqual(np.load(out / "x.npy").shape, (2, 5, 24))
            self.assertEqual(np.load(out / "q_norm.npy").shape, (4,))
            g = np.load(out / "q_norm.npy")
            self.assertGreater(g.max() - g.min(), 0.1)  # per dim, not uniform
        _, case, res = self.write_and_run(einsum_attention, CROSS, causal=False, cross=True,
                                          qk_norm=dict(axis="head"))
        self.assertIn("cross: true", case)
        self.assertIn("causal: false", case)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        _, _, res = self.write_and_run(einsum_attention, CROSS, causal=True, cross=True)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_norm_on_q_only_fails_naming_dk_norm(self):
        _, _, res = self.write_and_run(q_only, SELF, causal=True, qk_norm=dict(axis="head"))
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("dk_norm", res.stdout)

    def test_refusals(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            with self.assertRaisesRegex(ValueError, "takes no k_norm, q_norm argument"):
                headgrad_ref.write_reference(no_gains, tmp / "a", SELF, qk_norm=dict(axis="head"))
            with self.assertRaisesRegex(ValueError, "cross=True needs the shape's Tq and Tk"):
                headgrad_ref.write_reference(einsum_attention, tmp / "b", SELF, cross=True)
            with self.assertRaisesRegex(ValueError, "RoPE is not defined for cross-attention"):
                headgrad_ref.write_reference(einsum_attention, tmp / "c", CROSS, cross=True, rope=dict(theta=1e4))
            with self.assertRaisesRegex(ValueError, "qk_norm axis must be head or model"):
                headgrad_ref.write_reference(einsum_attention, tmp / "d", SELF, qk_norm=dict(axis="heads"))
            with self.assertRaisesRegex(ValueError, "is cross-attention: pass cross=True"):
                headgrad_ref.write_reference(einsum_attention, tmp / "e", CROSS)


def load(directory, *stems):
    return [torch.from_numpy(np.load(directory / f"{s}.npy")) for s in stems]


# (directory, H, Hkv, causal, qk_norm, cross); RoPE directories are left to the suite
COMMITTED = [
    ("mha_B2_T6_D24_H6_Hkv2_causal_qknorm_head_small_float64", 6, 2, True, dict(axis="head", eps=1e-6, gain="w"),
     False),
    ("mha_B2_Tq5_Tk9_D24_H6_Hkv2_cross_qknorm_head_float64", 6, 2, False, dict(axis="head", eps=1e-6, gain="w"), True),
    ("mha_B2_Tq5_Tk9_D24_H6_Hkv3_cross_float32", 6, 3, False, None, True),
]


class CommittedReferences(unittest.TestCase):
    def test_against_einsum(self):
        for name, H, Hkv, causal, qk_norm, cross in COMMITTED:
            d = REFS / name
            src = d / "golden" if name.endswith("float32") else d
            stems = ["x", "wq", "wk", "wv", "wo"] + (["q_norm", "k_norm"] if qk_norm else []) + (["x_kv"] if cross else [])
            # float32: the inputs are the float32 files, golden/ their float64 expected tensors
            leaves = [t.detach().double().requires_grad_() for t in load(d, *stems)]
            named = dict(zip(stems, leaves))
            (r,) = load(d, "r")
            out = einsum_attention(*leaves[:5], num_heads=H, num_kv_heads=Hkv, head_dim=24 // H, causal=causal,
                                   q_norm=named.get("q_norm"), k_norm=named.get("k_norm"), qk_norm=qk_norm,
                                   x_kv=named.get("x_kv"))
            (out * r.double()).sum().backward()
            want = {"out": out.detach(), **{"d" + s: t.grad for s, t in named.items()}}
            for stem, t in want.items():
                got = torch.from_numpy(np.load(src / f"{stem}.npy"))
                torch.testing.assert_close(got, t, atol=1e-12, rtol=0, msg=f"{name}/{stem}")

    def test_small_activation_case_is_small(self):
        x, wq = load(REFS / "mha_B2_T6_D24_H6_Hkv2_causal_qknorm_head_small_float64", "x", "wq")
        self.assertLess(((x @ wq.T) ** 2).mean().item(), 1e-2)


if __name__ == "__main__":
    sys.exit(headgrad_main.main(globals()))
