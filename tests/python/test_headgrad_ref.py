#!/usr/bin/python3
"""tools/headgrad_ref.py end to end, and the committed grouped-KV/RoPE references checked.

Usage: test_headgrad_ref.py HEADGRAD_EXE   (meson passes the built program)
Needs PyTorch (Debian's python3-torch in /usr/bin/python3); exits 77 (a skip for
meson) when torch cannot be imported, and says so.

1. A user's MHA written with einsum (not the way make_reference.py writes it) goes
   through the entry point; the built `headgrad run` checks the directory against
   per_head and passes (exit 0). The same with the scores scaled by 1/d instead of
   1/sqrt(d): headgrad run fails it (exit 1).
2. The committed references are checked by second implementations: GQA/MQA against MHA
   with Wk/Wv rows repeat-interleaved (dWk, dWv = group sums, 1e-12), core GQA against
   expanded k/v, RoPE against the complex-number form (interleaved) and HF's
   rotate_half (half), with the taps and the pass-through dims.
3. The core-level RoPE writer path (positions, q_offset, taps; a decode-like Tq < Tk)
   end to end through `headgrad run`, its refusals, and the committed core RoPE
   references against einsum attention on the complex/rotate_half rotations.
4. Float32 directories' golden/: the float32 inputs cast up bitwise, float64 expected
   tensors that a second implementation reproduces to 1e-12.
"""
import math
import pathlib
import subprocess
import sys
import tempfile
import unittest
import warnings

from torch_required import torch  # noqa: E402,F401  (skips the test, exit 77, where torch is absent)
import headgrad_main  # noqa: E402
import numpy as np  # noqa: E402  (a dependency of torch: missing, it is a failure, not a skip)

REPO = pathlib.Path(__file__).resolve().parents[2]
REFS = REPO / "configs" / "refs"
sys.path.insert(0, str(REPO / "tools"))
import headgrad_ref  # noqa: E402

HEADGRAD = None  # set from argv in main


def einsum_mha(x, wq, wk, wv, wo, *, num_heads, causal, scale_by_d=False):
    """MHA with einsum over explicit head axes: y = x W^T, W [out, in]. Hkv = H."""
    B, T, D = x.shape
    d = wq.shape[0] // num_heads
    q = torch.einsum("btD,hdD->bhtd", x, wq.view(num_heads, d, D))
    k = torch.einsum("btD,hdD->bhtd", x, wk.view(num_heads, d, D))
    v = torch.einsum("btD,hdD->bhtd", x, wv.view(num_heads, d, D))
    s = torch.einsum("bhtd,bhsd->bhts", q, k) / (d if scale_by_d else math.sqrt(d))
    if causal:
        s = s + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    o = torch.einsum("bhts,bhsd->bhtd", s.softmax(-1), v)
    return torch.einsum("bhtd,Dhd->btD", o, wo.view(D, num_heads, d))


def wrong_scale_mha(x, wq, wk, wv, wo, *, num_heads, causal):
    return einsum_mha(x, wq, wk, wv, wo, num_heads=num_heads, causal=causal, scale_by_d=True)


def run_headgrad(suite):
    return subprocess.run([HEADGRAD, "run", str(suite)], capture_output=True, text=True, timeout=120)


def run_headgrad_case(ref_dir, shape, *, causal=False, level="mha"):
    """headgrad run on one reference case: per_head against the directory."""
    suite = pathlib.Path(ref_dir).parent / "suite.yaml"
    extra = (f", shape: {shape}" if shape else "") + (", level: core" if level == "core" else "")
    suite.write_text("suite: one-reference\ncases:\n"
                     f"  - {{name: ref, compare: [per_head], reference: {pathlib.Path(ref_dir).name}, "
                     f"causal: {'true' if causal else 'false'}{extra}}}\n")
    return run_headgrad(suite)


class EntryPointThroughHeadgrad(unittest.TestCase):
    def write_and_run(self, fn):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            shape = dict(B=2, T=7, D=24, H=4)
            headgrad_ref.write_reference(fn, tmp / "refs" / "mine", shape, seed=3, causal=True)
            (tmp / "suite.yaml").write_text(
                "suite: user-reference\n"
                "cases:\n"
                "  - {name: mine, compare: [per_head], reference: refs/mine, shape: {H: 4}, causal: true}\n")
            return run_headgrad(tmp / "suite.yaml")

    def test_correct_user_function_passes(self):
        res = self.write_and_run(einsum_mha)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("OK", res.stdout)

    def test_wrong_scale_fails(self):
        res = self.write_and_run(wrong_scale_mha)
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("FAIL", res.stdout)

    def test_cli_writes_the_same_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            cli = subprocess.run([sys.executable, str(REPO / "tools" / "headgrad_ref.py"),
                                  f"{__file__}:einsum_mha", "--shape", "B=2,T=5,D=12,H=3", "--seed", "4",
                                  "--out", str(tmp / "cli")], capture_output=True, text=True, timeout=120)
            self.assertEqual(cli.returncode, 0, cli.stderr)
            headgrad_ref.write_reference(einsum_mha, tmp / "api", dict(B=2, T=5, D=12, H=3), seed=4)
            for name in ("x", "wq", "out", "dx", "dwk"):
                np.testing.assert_array_equal(np.load(tmp / "cli" / f"{name}.npy"),
                                              np.load(tmp / "api" / f"{name}.npy"))
            self.assertIn("shape: {H: 3}", (tmp / "cli" / "case.yaml").read_text())

    def test_float32_directory_has_a_float64_golden(self):
        """golden/ = the same function in float64 on the float32 inputs; headgrad's
        rule then passes the correct function and fails the wrong scale, no atol given."""
        for fn, want_code in ((einsum_mha, 0), (wrong_scale_mha, 1)):
            with tempfile.TemporaryDirectory() as tmp:
                tmp = pathlib.Path(tmp)
                ref = tmp / "refs" / "mine"
                headgrad_ref.write_reference(fn, ref, dict(B=2, T=7, D=24, H=4), seed=5, dtype="float32")
                self.assertNotIn("atol:", (ref / "case.yaml").read_text())
                load = {n: torch.from_numpy(np.load(ref / f"{n}.npy")) for n in ("x", "wq", "wk", "wv", "wo", "r")}
                self.assertEqual(load["x"].dtype, torch.float32)
                leaves = {n: load[n].double().requires_grad_() for n in ("x", "wq", "wk", "wv", "wo")}
                out = fn(*(leaves[n] for n in ("x", "wq", "wk", "wv", "wo")), num_heads=4, causal=True)
                (out * load["r"].double()).sum().backward()
                want = {"out": out, **{"d" + n: leaves[n].grad for n in leaves}}
                for name, t in want.items():
                    g = np.load(ref / "golden" / f"{name}.npy")
                    self.assertEqual(g.dtype, np.float64, name)
                    np.testing.assert_allclose(g, t.detach().numpy(), rtol=0, atol=1e-12, err_msg=name)
                (tmp / "suite.yaml").write_text(
                    "suite: user-reference\n"
                    "cases:\n"
                    "  - {name: mine, compare: [per_head], reference: refs/mine, shape: {H: 4}, causal: true}\n")
                res = run_headgrad(tmp / "suite.yaml")
                self.assertEqual(res.returncode, want_code, res.stdout + res.stderr)

    def test_causal_claim_is_checked(self):
        # A function that breaks its declared causality is a finding, not a refusal:
        # written as it computes, with a warning naming what was seen and `headgrad check`.
        def full(x, wq, wk, wv, wo, *, num_heads):
            return einsum_mha(x, wq, wk, wv, wo, num_heads=num_heads, causal=False)
        def told_causal_but_full(x, wq, wk, wv, wo, *, num_heads, causal):  # naming causal: still checked
            return einsum_mha(x, wq, wk, wv, wo, num_heads=num_heads, causal=False)
        for fn in (full, told_causal_but_full):
            with tempfile.TemporaryDirectory() as tmp:
                with self.assertWarnsRegex(headgrad_ref.HeadgradRefWarning,
                                           r"row 0 depends on token of x 1, but causal=True.*written anyway"
                                           r".*headgrad check .*test_headgrad_ref.py:" + fn.__name__):
                    out = headgrad_ref.write_reference(fn, pathlib.Path(tmp) / "r", dict(B=1, T=4, D=8, H=2),
                                                       causal=True)
                x = torch.from_numpy(np.load(out / "x.npy"))
                w = [torch.from_numpy(np.load(out / f"{n}.npy")) for n in ("wq", "wk", "wv", "wo")]
                want = einsum_mha(x, *w, num_heads=2, causal=False)
                np.testing.assert_allclose(np.load(out / "out.npy"), want.numpy(), rtol=0, atol=1e-12)
                # checked against a causal plugin, the reference side is the one that differs
                res = run_headgrad_case(out, "{H: 2}", causal=True)
                self.assertEqual(res.returncode, 1, res.stdout + res.stderr)

    def test_unused_weight_and_nan_are_findings(self):
        def no_wo(x, wq, wk, wv, wo, *, num_heads):
            B, T, D = x.shape
            d = D // num_heads
            q, k, v = (torch.einsum("btD,hdD->bhtd", x, w.view(num_heads, d, D)) for w in (wq, wk, wv))
            s = (q @ k.transpose(-1, -2) / math.sqrt(d)) + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
            return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        def inverted_mask(q, k, v):  # the first row attends nothing: NaN (softmax over nothing)
            tq, tk = q.shape[-2], k.shape[-2]
            keep = torch.ones(tq, tk, dtype=torch.bool).tril()
            s = (q @ k.transpose(-1, -2)).masked_fill(keep, float("-inf"))
            return s.softmax(-1) @ v
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertWarnsRegex(headgrad_ref.HeadgradRefWarning,
                                       "the output does not depend on wo .*dwo written as zeros"):
                out = headgrad_ref.write_reference(no_wo, pathlib.Path(tmp) / "a", dict(B=1, T=3, D=8, H=2))
            self.assertEqual(float(np.abs(np.load(out / "dwo.npy")).max()), 0.0)
            with self.assertWarnsRegex(headgrad_ref.HeadgradRefWarning, r"out holds \d+ NaN .*dv holds \d+ NaN"):
                out = headgrad_ref.write_reference(inverted_mask, pathlib.Path(tmp) / "b",
                                                   dict(B=1, H=1, Tq=3, Tk=3, d=2), level="core", causal=True)
            self.assertTrue(np.isnan(np.load(out / "out.npy")).any())

    def test_3d_core_case_takes_a_b_tq_tk_mask(self):
        # CS336's SDPA test: q, k, v [B, T, d] and a mask [B, Tq, Tk], broadcast as PyTorch does
        def sdpa(q, k, v, *, mask):
            s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
            return s.softmax(-1) @ v
        keep = torch.rand(3, 4, 6, generator=torch.Generator().manual_seed(1)) > 0.4
        keep[..., 0] = True
        with tempfile.TemporaryDirectory() as tmp:
            out = headgrad_ref.write_reference(sdpa, pathlib.Path(tmp) / "r", dict(B=3, Tq=4, Tk=6, d=5),
                                               level="core", mask=keep.numpy())
            self.assertEqual(np.load(out / "mask.npy").shape, (3, 4, 6))
            res = run_headgrad_case(out, None, level="core")
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_core_mask_alignment_is_checked(self):
        def bottom_right_causal(q, k, v, *, causal):  # FlashAttention's alignment, not mask.npy's
            tq, tk = q.shape[-2], k.shape[-2]
            keep = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
            s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~keep, float("-inf"))
            return s.softmax(-1) @ v
        with tempfile.TemporaryDirectory() as tmp:
            shape = dict(B=1, H=2, Tq=3, Tk=5, d=4)
            with self.assertWarnsRegex(headgrad_ref.HeadgradRefWarning,
                                       r"row 0 depends on key 1, but causal=True \(top-left"):
                headgrad_ref.write_reference(bottom_right_causal, pathlib.Path(tmp) / "r", shape, level="core")
            # at Tq = Tk both alignments agree: written, with the mask it was checked against, no warning
            with warnings.catch_warnings():
                warnings.simplefilter("error", headgrad_ref.HeadgradRefWarning)
                out = headgrad_ref.write_reference(bottom_right_causal, pathlib.Path(tmp) / "s", dict(shape, Tk=3),
                                                   level="core")
            self.assertTrue(np.array_equal(np.load(out / "mask.npy"), np.tril(np.ones((3, 3), dtype=bool))))

    def test_bad_shapes_name_the_key(self):
        with self.assertRaisesRegex(ValueError, "H=4 is not a multiple of Hkv=3"):
            headgrad_ref.resolve_shape("mha", dict(B=1, T=2, D=8, H=4, Hkv=3))
        # Tq and Tk at the mha level are cross-attention's, instead of T
        with self.assertRaisesRegex(ValueError, "shape gives T and Tq/Tk; cross-attention gives Tq and Tk"):
            headgrad_ref.resolve_shape("mha", dict(B=1, T=2, D=8, H=2, Tq=3))
        with self.assertRaisesRegex(ValueError, "shape needs 'Tk' at the mha level"):
            headgrad_ref.resolve_shape("mha", dict(B=1, D=8, H=2, Tq=3))
        self.assertEqual(headgrad_ref.resolve_shape("mha", dict(B=1, T=2, H=12, Hkv=3, d=10))["D"], 120)


def load(name, *stems):
    return [torch.from_numpy(np.load(REFS / name / f"{s}.npy")) for s in stems]


def grads_of(fn, inputs, r):
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    (out * r).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def interleaved_rope(x, positions, theta, rotary_dim=None):
    """Complex form (Meta Llama): pair (2k, 2k+1) times exp(i p w_k) on the first r dims.

    Computed in float64 (complex128) and cast: for a float32 reference the result is
    then within float32 rounding, not bitwise."""
    r = rotary_dim or x.shape[-1]
    w = theta ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    phi = positions.double()[..., None] * w
    if x.dim() == 4 and positions.dim() == 2:
        phi = phi[:, None]
    z = torch.view_as_complex(x[..., :r].double().reshape(*x.shape[:-1], r // 2, 2).contiguous())
    turned = torch.view_as_real(z * torch.polar(torch.ones_like(phi), phi)).flatten(-2).to(x.dtype)
    return torch.cat([turned, x[..., r:]], -1)


def half_rope(x, positions, theta, rotary_dim):
    """HF Llama: x * cos + rotate_half(x) * sin on the first rotary_dim dims."""
    r = rotary_dim
    w = theta ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    phi = positions.double()[..., None] * w
    if x.dim() == 4 and positions.dim() == 2:
        phi = phi[:, None]
    emb = torch.cat([phi, phi], -1)
    rot = x[..., :r]
    rotated = torch.cat([-rot[..., r // 2:], rot[..., : r // 2]], -1)
    turned = rot * emb.cos().to(x.dtype) + rotated * emb.sin().to(x.dtype)
    return torch.cat([turned, x[..., r:]], -1)


class LowPrecisionReferences(unittest.TestCase):
    """bfloat16 files are float32 holding bfloat16 values; float16 files are '<f2'; both get
    golden/ (float64, the same function on the same input values) and pass headgrad."""

    def write_and_check(self, dtype, np_dtype, exact):
        import make_reference  # beside headgrad_ref: grouped_attention runs float16 through float32
        fn = make_reference.grouped_attention
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            out = headgrad_ref.write_reference(fn, tmp / "refs" / "lp", dict(B=2, T=6, D=16, H=4), seed=5,
                                               dtype=dtype, suite_dir=tmp)
            for stem in ("x", "wq", "out", "dx", "dwo"):
                a = np.load(out / f"{stem}.npy")
                self.assertEqual(a.dtype, np_dtype, stem)
                self.assertTrue(exact(a), f"{stem}.npy holds values outside {dtype}")
                g = np.load(out / "golden" / f"{stem}.npy") if stem not in ("x", "wq") else None
                if g is not None:  # the 16-bit result is the golden one to the dtype's rounding
                    self.assertEqual(g.dtype, np.float64)
                    eps = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
                    err = np.abs(a.astype(np.float64) - g).max() / np.abs(g).max()
                    self.assertLess(err, 16 * eps, stem)
                    self.assertGreater(err, 0, f"{stem}: no rounding at all: not computed in {dtype}?")
            self.assertIn(f"dtype: {dtype}", (out / "case.yaml").read_text())
            case = (out / "case.yaml").read_text().split("\n", 1)[1]  # the case, without its comment
            (tmp / "suite.yaml").write_text("suite: lp\ncases:\n" + "".join("  " + l + "\n" for l in case.splitlines()))
            res = run_headgrad(tmp / "suite.yaml")
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_bfloat16(self):
        def exact(a):
            return np.array_equal(torch.from_numpy(a).bfloat16().float().numpy(), a)
        self.write_and_check("bfloat16", np.float32, exact)

    def test_float16(self):
        self.write_and_check("float16", np.float16, lambda a: True)  # <f2 holds only float16


class CommittedReferences(unittest.TestCase):
    def check_gqa_against_repeated_mha(self, name, H, Hkv, tol):
        x, wq, wk, wv, wo, r, out, dx, dwq, dwk, dwv, dwo = load(
            name, "x", "wq", "wk", "wv", "wo", "r", "out", "dx", "dwq", "dwk", "dwv", "dwo")
        G, d, D = H // Hkv, wq.shape[0] // H, x.shape[-1]
        self.assertEqual(tuple(wk.shape), (Hkv * d, D))

        def repeat_rows(w):  # kv head j -> query heads jG .. jG+G-1
            return w.view(Hkv, d, D).repeat_interleave(G, 0).reshape(H * d, D)

        def mha(x_, wq_, wk_mha, wv_mha, wo_):
            return einsum_mha(x_, wq_, wk_mha, wv_mha, wo_, num_heads=H, causal=True)

        out2, (dx2, dwq2, dwk_mha, dwv_mha, dwo2) = grads_of(
            mha, [x, wq, repeat_rows(wk), repeat_rows(wv), wo], r)
        for got, want in ((out, out2), (dx, dx2), (dwq, dwq2), (dwo, dwo2),
                          (dwk, dwk_mha.view(Hkv, G, d, D).sum(1).reshape(Hkv * d, D)),
                          (dwv, dwv_mha.view(Hkv, G, d, D).sum(1).reshape(Hkv * d, D))):
            torch.testing.assert_close(got, want, atol=tol, rtol=0)

    def test_gqa_float64_is_mha_with_repeated_kv_rows(self):
        self.check_gqa_against_repeated_mha("mha_B2_T7_D8_H12_Hkv3_d4_causal_float64", 12, 3, 1e-12)

    def test_mqa_float64_is_mha_with_repeated_kv_rows(self):
        self.check_gqa_against_repeated_mha("mha_B2_T5_D16_H4_Hkv1_causal_float64", 4, 1, 1e-12)

    def test_gqa_float32_is_mha_with_repeated_kv_rows(self):
        self.check_gqa_against_repeated_mha("mha_B2_T7_D8_H12_Hkv3_d4_causal_float32", 12, 3, 1e-5)

    def test_core_gqa_is_core_on_expanded_kv(self):
        name = "core_B2_H12_Hkv3_Tq5_Tk7_d4_causal_float64"
        q, k, v, mask, r, out, dq, dk, dv = load(name, "q", "k", "v", "mask", "r", "out", "dq", "dk", "dv")
        H, Hkv = q.shape[1], k.shape[1]
        self.assertEqual((H, Hkv), (12, 3))
        self.assertTrue(torch.equal(mask, torch.ones(5, 7, dtype=torch.bool).tril()))

        def core(q_, k_, v_):  # k_, v_ already [B, H, Tk, d]
            s = torch.einsum("bhtd,bhsd->bhts", q_, k_) / math.sqrt(q_.shape[-1])
            return torch.einsum("bhts,bhsd->bhtd", s.masked_fill(~mask, float("-inf")).softmax(-1), v_)

        G = H // Hkv
        out2, (dq2, dk_full, dv_full) = grads_of(
            core, [q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)], r)
        B, _, Tk, d = k.shape
        for got, want in ((out, out2), (dq, dq2), (dk, dk_full.view(B, Hkv, G, Tk, d).sum(2)),
                          (dv, dv_full.view(B, Hkv, G, Tk, d).sum(2))):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0)

    def test_rope_level_references(self):
        cases = (("rope_cs336_B3_T12_d16_interleaved_float64", 16,
                  lambda x, p: interleaved_rope(x, p, 1e4), 1e-12),
                 ("rope_B2_H3_T7_d8_interleaved_float64", 8, lambda x, p: interleaved_rope(x, p, 1e4), 1e-12),
                 ("rope_B2_T9_d16_half_float64", 16, lambda x, p: half_rope(x, p, 5e5, 16), 1e-12),
                 ("rope_B2_T9_d16_interleaved_r8_float32", 8,
                  lambda x, p: interleaved_rope(x, p, 1e4, 8), 1e-5))
        for name, rot, rope, tol in cases:
            x, positions, r, out, dx = load(name, "x", "positions", "r", "out", "dx")
            self.assertEqual(positions.dtype, torch.int64)
            self.assertGreaterEqual(int(positions.max()), 1000, name)
            out2, (dx2,) = grads_of(lambda x_: rope(x_, positions), [x], r)
            torch.testing.assert_close(out, out2, atol=tol, rtol=0, msg=name)
            torch.testing.assert_close(dx, dx2, atol=tol, rtol=0, msg=name)
            self.assertTrue(torch.equal(out[..., rot:], x[..., rot:]), name)  # partial: pass-through bitwise

    def test_mha_rope_taps_and_output(self):
        cases = (("mha_B2_T7_D8_H6_Hkv3_d4_causal_rope_interleaved_float64",
                  lambda t, p: interleaved_rope(t, p, 1e4)),
                 ("mha_B2_T7_D8_H6_Hkv3_d4_causal_rope_half_float64", lambda t, p: half_rope(t, p, 5e5, 4)),
                 ("mha_B2_T7_D8_H6_Hkv3_d6_causal_rope_half_r4_float64",
                  lambda t, p: half_rope(t, p, 1e4, 4)))
        for name, rope in cases:
            x, wq, wk, wv, wo, positions, q_rot, k_rot, out = load(
                name, "x", "wq", "wk", "wv", "wo", "positions", "q_rot", "k_rot", "out")
            B, T, D = x.shape
            H, Hkv = q_rot.shape[1], k_rot.shape[1]
            d = q_rot.shape[-1]
            self.assertEqual((H, Hkv, tuple(positions.shape)), (6, 3, (B, T)))
            self.assertEqual(len(set(positions[:, 1:].sub(positions[:, :-1]).flatten().tolist())) > 1, True)
            q = torch.einsum("btD,hdD->bhtd", x, wq.view(H, d, D))
            k = torch.einsum("btD,hdD->bhtd", x, wk.view(Hkv, d, D))
            v = torch.einsum("btD,hdD->bhtd", x, wv.view(Hkv, d, D))
            torch.testing.assert_close(q_rot, rope(q, positions), atol=1e-12, rtol=0, msg=name)
            torch.testing.assert_close(k_rot, rope(k, positions), atol=1e-12, rtol=0, msg=name)
            # scores from the taps, k/v shared by groups of H / Hkv query heads
            G = H // Hkv
            s = torch.einsum("bhtd,bhsd->bhts", q_rot, k_rot.repeat_interleave(G, 1)) / math.sqrt(d)
            s = s + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
            o = torch.einsum("bhts,bhsd->bhtd", s.softmax(-1), v.repeat_interleave(G, 1))
            torch.testing.assert_close(out, torch.einsum("bhtd,Dhd->btD", o, wo.view(D, H, d)),
                                       atol=1e-12, rtol=0, msg=name)

    def test_core_cs336_is_three_dimensional(self):
        q, k, v, mask, out = load("core_cs336_B2_T9_d16_causal_float64", "q", "k", "v", "mask", "out")
        self.assertEqual(q.dim(), 3)
        s = (q @ k.transpose(-1, -2) / 4.0).masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(out, s.softmax(-1) @ v, atol=1e-12, rtol=0)


def einsum_core_rope(q, k, v, *, positions, q_offset, mask, style="half", theta=500000.0, ignore_q_offset=False):
    """A user's core RoPE attention: einsum over explicit heads, HF rotate_half (or the
    complex form), keys at positions, queries at positions[..., :Tq] + q_offset."""
    rope = (lambda t, p: half_rope(t, p, theta, t.shape[-1])) if style == "half" else \
        (lambda t, p: interleaved_rope(t, p, theta))
    qp = positions[..., : q.shape[-2]] + (0 if ignore_q_offset else q_offset)
    q_rot, k_rot = rope(q, qp), rope(k, positions)
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("bhtd,bhsd->bhts", q_rot, k_rot.repeat_interleave(g, 1)) / math.sqrt(q.shape[-1])
    o = torch.einsum("bhts,bhsd->bhtd", s.masked_fill(~mask, float("-inf")).softmax(-1),
                     v.repeat_interleave(g, 1))
    return o, {"q_rot": q_rot, "k_rot": k_rot}


def offset_blind_core_rope(q, k, v, *, positions, q_offset, mask):
    return einsum_core_rope(q, k, v, positions=positions, q_offset=q_offset, mask=mask, ignore_q_offset=True)


class CoreRopeWriter(unittest.TestCase):
    SHAPE = dict(B=2, H=4, Hkv=2, Tq=3, Tk=6, d=8)
    ROPE = dict(theta=500000.0, style="half", rotary_dim=8)

    def write_decode(self, tmp, fn):
        keep = np.tril(np.ones((3, 6), dtype=bool), 3)  # bottom-right: queries are the last 3 tokens
        return headgrad_ref.write_reference(fn, tmp / "refs" / "dec", self.SHAPE, level="core", seed=5,
                                            positions=1000 + np.arange(6), q_offset=3, rope=self.ROPE,
                                            mask=keep, suite_dir=tmp)

    def run_case_yaml(self, tmp, out):
        case = "\n".join(line for line in (out / "case.yaml").read_text().splitlines()
                         if not line.startswith("#"))
        (tmp / "suite.yaml").write_text("suite: core-rope\ncases:\n" + "\n".join(
            "  " + line for line in case.splitlines()) + "\n")
        return run_headgrad(tmp / "suite.yaml")

    def test_decode_reference_passes_through_headgrad(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            out = self.write_decode(tmp, einsum_core_rope)
            text = (out / "case.yaml").read_text()
            self.assertIn("rope: {theta: 500000.0, style: half, rotary_dim: 8, positions: {offset: 1000}, "
                          "q_offset: 3}", text)
            self.assertIn("taps: [q_rot, k_rot]", text)
            self.assertFalse((out / "positions.npy").exists())  # Tq != Tk: built from {offset: N}
            self.assertEqual(np.load(out / "k_rot.npy").shape, (2, 2, 6, 8))
            res = self.run_case_yaml(tmp, out)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertIn("OK", res.stdout)

    def test_a_function_that_ignores_q_offset_fails_in_headgrad(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            res = self.run_case_yaml(tmp, self.write_decode(tmp, offset_blind_core_rope))
            self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
            self.assertIn("FAIL", res.stdout)

    def test_float32_gets_a_float64_golden_of_the_same_computation(self):
        with tempfile.TemporaryDirectory() as tmp:
            shape = dict(B=2, H=4, Hkv=2, T=5, d=8)
            positions = np.array([[0, 2, 3, 7, 9], [1000, 1001, 1004, 1005, 1010]])
            out = headgrad_ref.write_reference(einsum_core_rope, pathlib.Path(tmp) / "f32", shape, level="core",
                                               dtype="float32", positions=positions, rope=self.ROPE)
            for stem in ("q", "k", "v", "r"):  # the same rounded inputs
                f32, g = np.load(out / f"{stem}.npy"), np.load(out / "golden" / f"{stem}.npy")
                self.assertEqual((f32.dtype, g.dtype), (np.float32, np.float64))
                np.testing.assert_array_equal(f32.astype(np.float64), g)
            q, k, v, r = (torch.from_numpy(np.load(out / "golden" / f"{s}.npy")) for s in ("q", "k", "v", "r"))
            mask = torch.from_numpy(np.load(out / "golden" / "mask.npy"))
            pos = torch.from_numpy(np.load(out / "golden" / "positions.npy"))
            want, (dq, dk, dv) = grads_of(lambda *t: einsum_core_rope(
                *t, positions=pos, q_offset=0, mask=mask)[0], [q, k, v], r)
            for stem, t in (("out", want), ("dq", dq), ("dk", dk), ("dv", dv)):
                g = np.load(out / "golden" / f"{stem}.npy")
                np.testing.assert_allclose(g, t.numpy(), atol=1e-12, rtol=0, err_msg=stem)
                # float32 expected vs golden: float32 rounding, not zero
                diff = np.abs(np.load(out / f"{stem}.npy") - g).max()
                self.assertTrue(0 < diff < 1e-5, f"{stem}: {diff}")

    def test_cli_core_rope_matches_the_api(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            cli = subprocess.run([sys.executable, str(REPO / "tools" / "headgrad_ref.py"),
                                  f"{__file__}:einsum_core_rope", "--level", "core",
                                  "--shape", "B=2,H=4,Hkv=2,Tq=3,Tk=6,d=8", "--seed", "6",
                                  "--positions", "1000,1001,1002,1003,1004,1005", "--q-offset", "3",
                                  "--rope", "theta=500000.0,style=half,rotary_dim=8", "--out", str(tmp / "cli")],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(cli.returncode, 0, cli.stderr)
            headgrad_ref.write_reference(einsum_core_rope, tmp / "api", self.SHAPE, level="core", seed=6,
                                         positions=1000 + np.arange(6), q_offset=3, rope=self.ROPE)
            for name in ("q", "k_rot", "q_rot", "out", "dq", "dk", "mask"):
                np.testing.assert_array_equal(np.load(tmp / "cli" / f"{name}.npy"),
                                              np.load(tmp / "api" / f"{name}.npy"))
            self.assertIn("positions: {offset: 1000}, q_offset: 3}", (tmp / "cli" / "case.yaml").read_text())
            bad = subprocess.run([sys.executable, str(REPO / "tools" / "headgrad_ref.py"),
                                  f"{__file__}:einsum_core_rope", "--level", "core",
                                  "--shape", "B=2,H=4,Hkv=2,Tq=3,Tk=6,d=8", "--q-offset", "3",
                                  "--out", str(tmp / "bad")], capture_output=True, text=True, timeout=120)
            self.assertEqual(bad.returncode, 2, bad.stdout)
            self.assertIn("q_offset needs positions", bad.stderr)

    def test_refusals_name_the_setting(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            with self.assertRaisesRegex(ValueError, r"Tq=3 != Tk=6 must be N \+ 0..Tk-1"):
                headgrad_ref.write_reference(einsum_core_rope, tmp / "a", self.SHAPE, level="core",
                                             positions=[0, 2, 3, 5, 8, 9], rope=self.ROPE)
            with self.assertRaisesRegex(ValueError, "q_offset needs positions"):
                headgrad_ref.write_reference(einsum_core_rope, tmp / "b", self.SHAPE, level="core", q_offset=3)
            with self.assertRaisesRegex(ValueError, "q_offset is a core-level setting"):
                headgrad_ref.write_reference(einsum_mha, tmp / "c", dict(B=1, T=4, D=8, H=2), q_offset=1)
            with self.assertRaisesRegex(ValueError, "takes no 'q_offset' argument"):
                headgrad_ref.write_reference(lambda q, k, v, positions, mask: q, tmp / "d", self.SHAPE,
                                             level="core", positions=1000 + np.arange(6), q_offset=3)
            self.assertFalse(any(tmp.iterdir()))


class CommittedCoreRope(unittest.TestCase):
    # (directory, rotation, rotary width, q_offset, positions when not in positions.npy, bottom-right mask)
    CASES = (("core_B2_H6_Hkv2_T7_d8_causal_rope_interleaved_float64",
              lambda t, p: interleaved_rope(t, p, 1e4), 8, 0, None, False),
             ("core_B2_H3_Tq3_Tk7_d8_decode_rope_half_float64",
              lambda t, p: half_rope(t, p, 5e5, 8), 8, 4, 1000 + torch.arange(7), True),
             ("core_B2_H6_Hkv3_T6_d8_causal_rope_half_r4_qoff2_float64",
              lambda t, p: half_rope(t, p, 1e4, 4), 4, 2, None, False),
             ("core_cs336_B2_T9_d16_causal_rope_interleaved_float64",
              lambda t, p: interleaved_rope(t, p, 1e4), 16, 0, None, False))

    def test_against_einsum_attention_on_a_second_rotation(self):
        for name, rope, rot, q_offset, positions, decode in self.CASES:
            q, k, v, mask, r, out, dq, dk, dv = load(name, "q", "k", "v", "mask", "r", "out", "dq", "dk", "dv")
            if positions is None:
                (positions,) = load(name, "positions")
                self.assertEqual((positions.dtype, positions.dim()), (torch.int64, 2), name)
                self.assertGreater(len(set(positions.diff(dim=1).flatten().tolist())), 1, name)  # gapped
            self.assertGreaterEqual(int(positions.max()), 1000, name)
            tq, tk = q.shape[-2], k.shape[-2]
            self.assertTrue(torch.equal(mask, torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq if decode else 0)))
            three_d = q.dim() == 3
            if three_d:  # [B, T, d] -> one head
                q, k, v, r = (t[:, None] for t in (q, k, v, r))
            g = q.shape[1] // k.shape[1]

            def attention(q_, k_, v_):
                qr, kr = rope(q_, positions[..., :tq] + q_offset), rope(k_, positions)
                s = torch.einsum("bhtd,bhsd->bhts", qr, kr.repeat_interleave(g, 1)) / math.sqrt(q_.shape[-1])
                return torch.einsum("bhts,bhsd->bhtd", s.masked_fill(~mask, float("-inf")).softmax(-1),
                                    v_.repeat_interleave(g, 1))
            out2, (dq2, dk2, dv2) = grads_of(attention, [q, k, v], r)
            if three_d:
                out2, dq2, dk2, dv2 = (t[:, 0] for t in (out2, dq2, dk2, dv2))
            for what, got, want in (("out", out, out2), ("dq", dq, dq2), ("dk", dk, dk2), ("dv", dv, dv2)):
                torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=f"{name} {what}")
            if three_d:
                continue
            q_rot, k_rot = load(name, "q_rot", "k_rot")
            torch.testing.assert_close(q_rot, rope(q, positions[..., :tq] + q_offset), atol=1e-12, rtol=0)
            torch.testing.assert_close(k_rot, rope(k, positions), atol=1e-12, rtol=0)
            self.assertTrue(torch.equal(q_rot[..., rot:], q[..., rot:]), name)  # pass-through bitwise

    def test_float32_golden_dirs(self):
        dirs = sorted(REFS.glob("*_float32"))
        self.assertGreaterEqual(len(dirs), 7)
        for d in dirs:
            self.assertTrue((d / "golden").is_dir(), f"{d.name} has no golden/")
            for f in sorted(d.glob("*.npy")):
                a, g = np.load(f), np.load(d / "golden" / f.name)
                if a.dtype != np.float32:  # mask (bool), positions (int64) as they are
                    np.testing.assert_array_equal(a, g, err_msg=str(f))
                    continue
                self.assertEqual((g.dtype, g.shape), (np.float64, a.shape), str(f))
                if f.stem in ("x", "wq", "wk", "wv", "wo", "q", "k", "v", "r"):
                    np.testing.assert_array_equal(a.astype(np.float64), g, err_msg=str(f))
                else:
                    np.testing.assert_allclose(a, g, atol=2e-5, rtol=1e-4, err_msg=str(f))
        # one golden recomputed by a second implementation in float64
        name = "core_B2_H6_Hkv2_T7_d8_causal_rope_interleaved_float32"
        golden = REFS / name / "golden"
        q, k, v, r, positions, mask, out = (torch.from_numpy(np.load(golden / f"{s}.npy"))
                                            for s in ("q", "k", "v", "r", "positions", "mask", "out"))
        want = einsum_core_rope(q, k, v, positions=positions, q_offset=0, mask=mask, style="interleaved",
                                theta=1e4)[0]
        torch.testing.assert_close(out, want, atol=1e-12, rtol=0)


if __name__ == "__main__":
    sys.exit(headgrad_main.main(globals()))
