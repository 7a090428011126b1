#!/usr/bin/python3
"""tools/headgrad_ref.py's command line given what a hostile or careless user gives it.

Usage: test_headgrad_ref_errors.py HEADGRAD_EXE   (meson passes the built program)
Needs PyTorch (Debian's python3-torch in /usr/bin/python3); exits 77 (a skip for
meson) when torch cannot be imported, and says so.

Each bad input (a function that raises, a module that cannot be imported, a dim
of 10^26, a seed of 2^70, --rope theta=abc, sys.exit in the user's code) ends
in exit 2 with one line on stderr and nothing written, a bad argument before
torch is imported; YAML characters in --out and --rope never give a case.yaml
that headgrad cannot parse.
"""
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

from torch_required import torch  # noqa: E402,F401  (skips the test, exit 77, where torch is absent)

REPO = pathlib.Path(__file__).resolve().parents[2]
WRITER = REPO / "tools" / "headgrad_ref.py"
HEADGRAD = None  # set from argv in main


def einsum_mha(x, wq, wk, wv, wo, *, num_heads, causal):
    """A correct MHA: y = x W^T, W [out, in], scores / sqrt(d)."""
    B, T, D = x.shape
    d = wq.shape[0] // num_heads
    q = torch.einsum("btD,hdD->bhtd", x, wq.view(num_heads, d, D))
    k = torch.einsum("btD,hdD->bhtd", x, wk.view(num_heads, d, D))
    v = torch.einsum("btD,hdD->bhtd", x, wv.view(num_heads, d, D))
    s = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d)
    if causal:
        s = s + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    return torch.einsum("bhtd,Dhd->btD", torch.einsum("bhts,bhsd->bhtd", s.softmax(-1), v), wo.view(D, num_heads, d))


def raises(x, wq, wk, wv, wo):
    raise RuntimeError("deliberate failure\nwith a second line")


def exits(x, wq, wk, wv, wo):
    sys.exit(0)


class BadInputsExitTwoWithOneLine(unittest.TestCase):
    def writer(self, tmp, *args, function=f"{__file__}:einsum_mha", shape="B=2,T=5,D=8,H=2", env=None):
        return subprocess.run([sys.executable, str(WRITER), function, "--shape", shape, "--out", str(tmp / "ref"),
                               *args], capture_output=True, text=True, timeout=120, env=env)

    def assert_refused(self, res, says, tmp):
        self.assertEqual(res.returncode, 2, res.stdout + res.stderr)
        self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)
        self.assertNotIn("Traceback", res.stderr)
        self.assertIn(says, res.stderr)
        self.assertFalse((tmp / "ref" / "case.yaml").exists())

    def test_each_bad_input(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            bad_module = tmp / "broken.py"
            bad_module.write_text("import no_such_module_anywhere\n")
            syntax = tmp / "syntax.py"
            syntax.write_text("def f(:\n")
            cases = [
                (dict(function=f"{__file__}:raises"), "raises failed: RuntimeError: deliberate failure with a second line"),
                (dict(function=f"{bad_module}:f"), "cannot import"),
                (dict(function=f"{syntax}:f"), "SyntaxError"),
                (dict(function=f"{__file__}:exits"), "called sys.exit(0); nothing was written"),
            ]
            for kwargs, says in cases:
                with self.subTest(says=says):
                    self.assert_refused(self.writer(tmp, **kwargs), says, tmp)
            # A bad argument is refused before torch is imported: here a torch that cannot be
            # imported comes first on the path, and the refusal is still the argument's.
            no_torch = tmp / "no_torch"
            no_torch.mkdir()
            (no_torch / "torch.py").write_text("raise ImportError('torch was imported')\n")
            env = dict(os.environ, PYTHONPATH=str(no_torch))
            for args, shape, says in [
                    ([], "B=2,T=100000000000000000000000000,D=8,H=2", "a dim is at most 2147483647"),
                    ([], "B=2,T=5,D=7,H=2", "D=7 is not divisible by H=2"),
                    (["--seed", str(2**70)], None, "--seed: expected an integer in [0, 2^63)"),
                    (["--seed", "-1"], None, "--seed: expected an integer in [0, 2^63), got '-1'"),
                    (["--rope", "theta=abc"], None, "--rope theta='abc': expected a finite number > 1"),
                    (["--rope", "style=half]"], None, "--rope style='half]': expected interleaved or half"),
                    (["--rope", "rotary_dim=3"], None, "expected an even integer >= 2"),
                    (["--window", "3,x"], None, "--window right='x': expected an integer >= 0"),
                    (["--bottom-right", "--no-causal"], None, "cannot go with --no-causal")]:
                with self.subTest(args=args, shape=shape):
                    self.assert_refused(self.writer(tmp, *args, **(dict(shape=shape) if shape else {}), env=env),
                                        says, tmp)
            # the same torch stops a good command line, naming itself
            res = self.writer(tmp, env=env)
            self.assertEqual(res.returncode, 2, res.stderr)
            self.assertIn("torch was imported", res.stderr)

    def test_yaml_characters_in_out_still_parse(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            out = tmp / "r: [x] # {y}, 'z\""
            res = subprocess.run([sys.executable, str(WRITER), f"{__file__}:einsum_mha", "--shape", "B=2,T=5,D=8,H=2",
                                  "--out", str(out), "--suite-dir", str(tmp), "--rope", "theta=500000,style=half"],
                                 capture_output=True, text=True, timeout=120)
            # the function ignores RoPE, so headgrad fails it (exit 1): it parsed the case (not 2)
            self.assertEqual(res.returncode, 0, res.stderr)
            case = [line for line in (out / "case.yaml").read_text().splitlines() if not line.startswith("#")]
            (tmp / "suite.yaml").write_text("cases:\n" + "\n".join("  " + line for line in case) + "\n")
            run = subprocess.run([HEADGRAD, "run", str(tmp / "suite.yaml")], capture_output=True, text=True,
                                 timeout=120)
            self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
            self.assertIn("r: [x] # {y}, 'z\"", run.stdout)
            # without --rope it passes
            res = subprocess.run([sys.executable, str(WRITER), f"{__file__}:einsum_mha", "--shape", "B=2,T=5,D=8,H=2",
                                  "--out", str(out), "--suite-dir", str(tmp), "--force"],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(res.returncode, 0, res.stderr)
            case = [line for line in (out / "case.yaml").read_text().splitlines() if not line.startswith("#")]
            (tmp / "suite.yaml").write_text("cases:\n" + "\n".join("  " + line for line in case) + "\n")
            run = subprocess.run([HEADGRAD, "run", str(tmp / "suite.yaml")], capture_output=True, text=True,
                                 timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)


if __name__ == "__main__":
    HEADGRAD = sys.argv.pop(1)
    unittest.main()
