#!/usr/bin/python3
"""Biases in reference directories: tools/headgrad_ref.py's bias=True (--bias) end to
end through the built headgrad, and the committed bias references checked.

Usage: test_bias_ref.py HEADGRAD_EXE   (meson passes the built program)
Needs PyTorch (Debian's python3-torch in /usr/bin/python3); exits 77 (a skip for
meson) when torch cannot be imported, and says so.

1. A user's MHA with biases, written with einsum over explicit head axes (not
   F.linear as make_reference.py writes it), goes through the writer with
   bias=True; `headgrad run` checks it against per_head and passes. The same
   function with its bias added after the head split in the wrong layout (bq
   viewed as [d, H]) fails (exit 1).
2. The writer refuses bias=True for a function that takes no biases, and one that
   ignores bo, naming the argument.
3. The committed references with biases against the einsum implementation (1e-12),
   and two identities worked out by hand: d loss / d bo = sum over b, t of r
   (out = ... + bo), and d loss / d bk = 0 (q . bk shifts every score of a query row
   alike, which the softmax ignores).
"""
import math
import pathlib
import subprocess
import sys
import tempfile
import unittest

from torch_required import torch  # noqa: E402,F401  (skips the test, exit 77, where torch is absent)
import headgrad_main  # noqa: E402
import numpy as np  # noqa: E402  (a dependency of torch: missing, it is a failure, not a skip)

REPO = pathlib.Path(__file__).resolve().parents[2]
REFS = REPO / "configs" / "refs"
sys.path.insert(0, str(REPO / "tools"))
import headgrad_ref  # noqa: E402

HEADGRAD = None  # set from argv in main
BIAS_REFS = ("mha_B2_T7_D8_H6_Hkv3_d4_causal_bias_float64", "mha_B2_T7_D8_H6_Hkv3_d4_causal_bias_float32")


def einsum_mha_bias(x, wq, wk, wv, wo, *, bq, bk, bv, bo, num_heads, num_kv_heads, head_dim, causal,
                    misaligned_bq=False):
    """MHA with biases, einsum over explicit head axes: y = x W^T + b. Query head h
    reads kv head h // G. misaligned_bq: bq added after the split as if it were
    [d, H] (head h gets bq[h::H]), a layout mistake."""
    B, T, D = x.shape
    H, Hkv, d = num_heads, num_kv_heads, head_dim
    q = torch.einsum("btD,hdD->bhtd", x, wq.view(H, d, D))
    if misaligned_bq:
        q = q + bq.view(d, H).t()[None, :, None, :]
    else:
        q = q + bq.view(H, d)[None, :, None, :]
    k = torch.einsum("btD,hdD->bhtd", x, wk.view(Hkv, d, D)) + bk.view(Hkv, d)[None, :, None, :]
    v = torch.einsum("btD,hdD->bhtd", x, wv.view(Hkv, d, D)) + bv.view(Hkv, d)[None, :, None, :]
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d)
    if causal:
        s = s + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    o = torch.einsum("bhts,bhsd->bhtd", s.softmax(-1), v)
    return torch.einsum("bhtd,Dhd->btD", o, wo.view(D, H, d)) + bo


def misaligned_mha(x, wq, wk, wv, wo, *, bq, bk, bv, bo, num_heads, num_kv_heads, head_dim, causal):
    return einsum_mha_bias(x, wq, wk, wv, wo, bq=bq, bk=bk, bv=bv, bo=bo, num_heads=num_heads,
                           num_kv_heads=num_kv_heads, head_dim=head_dim, causal=causal, misaligned_bq=True)


def no_bias_mha(x, wq, wk, wv, wo, *, num_heads, causal):
    return x


def ignores_bo(x, wq, wk, wv, wo, *, bq, bk, bv, bo, num_heads, num_kv_heads, head_dim, causal):
    return einsum_mha_bias(x, wq, wk, wv, wo, bq=bq, bk=bk, bv=bv, bo=torch.zeros_like(bo), num_heads=num_heads,
                           num_kv_heads=num_kv_heads, head_dim=head_dim, causal=causal)


def run_headgrad(suite):
    return subprocess.run([HEADGRAD, "run", str(suite)], capture_output=True, text=True, timeout=120)


SHAPE = dict(B=2, T=5, D=12, H=6, Hkv=3, d=2)  # GQA, d below D / H


class BiasWriterThroughHeadgrad(unittest.TestCase):
    def write_and_run(self, fn):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            out = headgrad_ref.write_reference(fn, tmp / "refs" / "mine", SHAPE, seed=5, causal=True, bias=True,
                                               suite_dir=tmp)
            case = (out / "case.yaml").read_text()
            self.assertIn("bias: true", case)
            for stem in ("bq", "bk", "bv", "bo", "dbq", "dbk", "dbv", "dbo"):
                self.assertTrue((out / f"{stem}.npy").is_file(), stem)
            self.assertEqual(np.load(out / "bq.npy").shape, (12,))
            self.assertEqual(np.load(out / "bk.npy").shape, (6,))
            self.assertEqual(np.load(out / "bo.npy").shape, (12,))
            (tmp / "suite.yaml").write_text("suite: user-bias\ncases:\n" + "\n".join(
                "  " + line for line in case.splitlines() if not line.startswith("#")) + "\n")
            return run_headgrad(tmp / "suite.yaml")

    def test_correct_function_with_biases_passes(self):
        res = self.write_and_run(einsum_mha_bias)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("bias", res.stdout)

    def test_misaligned_bias_fails(self):
        res = self.write_and_run(misaligned_mha)
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("dbq", res.stdout)

    def test_refusals_name_the_bias(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(ValueError, "takes no bk, bo, bq, bv argument"):
                headgrad_ref.write_reference(no_bias_mha, pathlib.Path(tmp) / "a", SHAPE, bias=True)
            # an unused bias is a finding (a warning), and its gradient is written as zeros
            with self.assertWarnsRegex(headgrad_ref.HeadgradRefWarning, "does not depend on bo"):
                out = headgrad_ref.write_reference(ignores_bo, pathlib.Path(tmp) / "b", SHAPE, bias=True)
            self.assertFalse(np.load(pathlib.Path(out) / "dbo.npy").any())
            with self.assertRaisesRegex(ValueError, "bias is an mha-level setting"):
                headgrad_ref.write_reference(no_bias_mha, pathlib.Path(tmp) / "c", dict(B=1, T=2, d=2),
                                             level="core", bias=True)

    def test_cli_bias_writes_the_same_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            (tmp / "usermod.py").write_text(
                "import sys\nsys.path.insert(0, %r)\nfrom test_bias_ref import einsum_mha_bias\n"
                % str(pathlib.Path(__file__).parent))
            res = subprocess.run([sys.executable, str(REPO / "tools" / "headgrad_ref.py"),
                                  f"{tmp / 'usermod.py'}:einsum_mha_bias", "--shape", "B=2,T=5,D=12,H=6,Hkv=3,d=2",
                                  "--seed", "5", "--bias", "--out", str(tmp / "cli")],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            api = headgrad_ref.write_reference(einsum_mha_bias, tmp / "api", SHAPE, seed=5, bias=True)
            for stem in ("bq", "bo", "dbq", "dbv", "out"):
                np.testing.assert_array_equal(np.load(tmp / "cli" / f"{stem}.npy"), np.load(api / f"{stem}.npy"))


def load(directory, *stems):
    return [torch.from_numpy(np.load(directory / f"{s}.npy")) for s in stems]


class CommittedBiasReferences(unittest.TestCase):
    def test_against_einsum_with_biases(self):
        for name in BIAS_REFS:
            d = REFS / name
            # float32: the golden/ tensors, float64 from the same (rounded) inputs
            src = d / "golden" if name.endswith("float32") else d
            x, wq, wk, wv, wo, bq, bk, bv, bo, r = load(src, "x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "r")
            leaves = [t.clone().requires_grad_() for t in (x, wq, wk, wv, wo, bq, bk, bv, bo)]
            out = einsum_mha_bias(*leaves[:5], bq=leaves[5], bk=leaves[6], bv=leaves[7], bo=leaves[8],
                                  num_heads=6, num_kv_heads=3, head_dim=4, causal=True)
            (out * r).sum().backward()
            want = dict(zip(("dx", "dwq", "dwk", "dwv", "dwo", "dbq", "dbk", "dbv", "dbo"),
                            (t.grad for t in leaves)), out=out.detach())
            for stem, t in want.items():
                got = torch.from_numpy(np.load(src / f"{stem}.npy"))
                torch.testing.assert_close(got, t, atol=1e-12, rtol=0, msg=f"{name}/{stem}")

    def test_bias_gradients_worked_out_by_hand(self):
        for name in BIAS_REFS:
            d = REFS / name / "golden" if name.endswith("float32") else REFS / name
            r, dbo, dbk = load(d, "r", "dbo", "dbk")
            # out = merged Wo^T + bo: d loss / d bo sums r over batch and positions
            torch.testing.assert_close(dbo, r.sum((0, 1)), atol=1e-12, rtol=0, msg=name)
            # scores q . (k + bk) = q . k + q . bk: the same shift for every key of a row
            self.assertLess(dbk.abs().max().item(), 1e-12, name)


if __name__ == "__main__":
    sys.exit(headgrad_main.main(globals()))
