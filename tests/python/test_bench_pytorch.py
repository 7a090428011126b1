#!/usr/bin/python3
"""tools/bench_pytorch.py's PyTorch side, without timing anything.

Usage: test_bench_pytorch.py   (meson runs it with /usr/bin/python3)
Needs PyTorch (Debian's python3-torch); exits 77 (a skip for meson) when torch
cannot be imported, and says so.

1. The two implementations the script times as "PyTorch at its best", its
   manual MHA and torch.nn.functional.multi_head_attention_forward on the
   [T, B, D] layout with the stacked in-projection, compute the same causal
   MHA: output and every gradient agree in float64 (1e-10), and the causal
   mask matters (without it the output differs).
2. torch_best picks the fastest forward + backward over core types and
   implementations (and, apart, the fastest in CPU time), from the children's
   figures.
"""
import importlib.util
import math
import pathlib
import sys
import unittest

from torch_required import torch  # noqa: E402,F401  (skips the test, exit 77, where torch is absent)
import torch.nn.functional as F  # noqa: E402

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "bench_pytorch.py"
spec = importlib.util.spec_from_file_location("bench_pytorch", TOOL)
bench_pytorch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_pytorch)


class TwoImplementations(unittest.TestCase):
    def test_same_causal_mha_out_and_gradients(self):
        b, t, dm, h = 2, 5, 12, 3  # d = 4
        g = torch.Generator().manual_seed(3)
        x = torch.randn(b, t, dm, generator=g, dtype=torch.float64)
        ws = [torch.randn(dm, dm, generator=g, dtype=torch.float64) / math.sqrt(dm) for _ in range(4)]
        r = torch.randn(b, t, dm, generator=g, dtype=torch.float64)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        additive = torch.zeros(t, t, dtype=torch.float64).masked_fill(~mask, float("-inf"))

        xm = x.clone().requires_grad_()
        wm = [w.clone().requires_grad_() for w in ws]
        out_m = bench_pytorch.torch_mha(torch, xm, *wm, h, mask)
        (out_m * r).sum().backward()

        xf = x.transpose(0, 1).contiguous().requires_grad_()   # [T, B, D]
        w_in = torch.cat(ws[:3]).requires_grad_()               # [3D, D]
        wo = ws[3].clone().requires_grad_()
        out_f = bench_pytorch.torch_functional(F, xf, w_in, wo, h, additive)
        (out_f * r.transpose(0, 1)).sum().backward()

        tol = dict(rtol=1e-10, atol=1e-10)
        self.assertTrue(torch.allclose(out_m, out_f.transpose(0, 1), **tol))
        self.assertTrue(torch.allclose(xm.grad, xf.grad.transpose(0, 1), **tol))
        self.assertTrue(torch.allclose(torch.cat([w.grad for w in wm[:3]]), w_in.grad, **tol))
        self.assertTrue(torch.allclose(wm[3].grad, wo.grad, **tol))

        with torch.no_grad():
            full = bench_pytorch.torch_functional(F, xf, w_in, wo, h, None)
        self.assertGreater((full - out_f).abs().max().item(), 1e-3)


class TorchBest(unittest.TestCase):
    def test_fastest_forward_backward_wins_and_cpu_time_apart(self):
        def fake_child(args, shape, dtype_name, coretype):
            times = {"Haswell": {"manual": (30.0, 10.0, 29.0), "functional": (25.0, 9.0, 24.0)},
                     "SkylakeX": {"manual": (20.0, 8.0, 26.0), "functional": (22.0, 7.0, 21.0)}}
            return {"torch_version": "x", "gemm_gflops": {"Haswell": 50.0, "SkylakeX": 90.0}[coretype],
                    "times": {impl: {"fwdbwd_ms": fb, "fwd_ms": f, "fwdbwd_cpu_ms": cpu}
                              for impl, (fb, f, cpu) in times[coretype].items()}}

        class Args:
            coretype = ["Haswell", "SkylakeX"]

        saved = bench_pytorch.run_torch
        bench_pytorch.run_torch = fake_child
        try:
            best = bench_pytorch.torch_best(Args, (1, 2, 4, 2), "float32")
        finally:
            bench_pytorch.run_torch = saved
        self.assertEqual((best["best"]["coretype"], best["best"]["impl"]), ("SkylakeX", "manual"))
        self.assertEqual(best["best"]["fwdbwd_ms"], 20.0)
        self.assertEqual(best["best_fwd_ms"], 7.0)
        self.assertEqual((best["best_cpu"]["coretype"], best["best_cpu"]["impl"]), ("SkylakeX", "functional"))
        self.assertEqual(len(best["runs"]), 4)
        self.assertEqual(best["gemm_gflops"], {"Haswell": 50.0, "SkylakeX": 90.0})


if __name__ == "__main__":
    unittest.main()
