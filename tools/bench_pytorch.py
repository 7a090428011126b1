#!/usr/bin/python3
"""headgrad beside PyTorch: the same causal MHA shapes, the same threads, one run.

Same threads means both pools on both sides: headgrad bench --threads N sets
its BLAS's and its own workers'; here torch.set_num_threads(N) and
OPENBLAS_NUM_THREADS=N (Debian's PyTorch calls OpenBLAS, which ignores the former).
Each side's own GEMM rate (gemm_size^3) is printed too: headgrad links BLIS by
default, Debian's PyTorch links OpenBLAS through libblas.so.3.

A developer tool, never needed to build or test headgrad. It needs
Debian's python3-torch, so run it with the system Python:

    /usr/bin/python3 tools/bench_pytorch.py --threads 1 --dtype float32
    /usr/bin/python3 tools/bench_pytorch.py --shape 4,512,512,8 --dtype float64 \
        --bench build/tools/headgrad --json side_by_side.json

For each shape and dtype it times PyTorch (causal MHA written the usual batched
way: project, view, transpose, q k^T / sqrt(d), masked_fill, softmax, @ v,
transpose back, reshape, project), forward and forward + backward with
loss = sum(out * R), then runs `headgrad bench --json` for the same shape
right after (interleaved, so that a change in machine load hits both sides),
and prints headgrad / PyTorch time ratios (below 1: headgrad is faster).

Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_SHAPES = ["2,3,8,2", "8,128,256,8", "4,512,512,8", "1,2048,512,8", "1,4096,256,4"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_shape(text):
    parts = [int(p) for p in text.strip("() ").split(",")]
    if len(parts) != 4 or parts[2] % parts[3] != 0:
        raise argparse.ArgumentTypeError(f"shape '{text}' is not B,T,D,H with D divisible by H")
    return tuple(parts)


def torch_mha(torch, x, wq, wk, wv, wo, heads, mask):
    """x [B, T, D] -> [B, T, D]; W [out, in], y = x W^T (PyTorch's layout)."""
    b, t, dm = x.shape
    d = dm // heads
    q = (x @ wq.T).view(b, t, heads, d).transpose(1, 2)  # [B, H, T, d]
    k = (x @ wk.T).view(b, t, heads, d).transpose(1, 2)
    v = (x @ wv.T).view(b, t, heads, d).transpose(1, 2)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(d)  # [B, H, T, T]
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = (p @ v).transpose(1, 2).reshape(b, t, dm)  # transpose back first, then merge
    return o @ wo.T


def time_torch(torch, shape, dtype_name, repeats, warmup, seed):
    b, t, dm, h = shape
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, dm, generator=g, dtype=dtype).requires_grad_()
    ws = [(torch.randn(dm, dm, generator=g, dtype=dtype) / math.sqrt(dm)).requires_grad_()
          for _ in range(4)]
    r = torch.randn(b, t, dm, generator=g, dtype=dtype)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    leaves = [x] + ws

    def fwd():
        t0 = time.perf_counter()
        out = torch_mha(torch, x, *ws, h, mask)
        ms = (time.perf_counter() - t0) * 1e3
        del out
        return ms

    def fwdbwd():
        for leaf in leaves:
            leaf.grad = None
        t0 = time.perf_counter()
        loss = (torch_mha(torch, x, *ws, h, mask) * r).sum()
        loss.backward()
        del loss
        return (time.perf_counter() - t0) * 1e3

    for _ in range(warmup):
        fwdbwd()
    f = [fwd() for _ in range(repeats)]
    fb = [fwdbwd() for _ in range(repeats)]
    return {"fwd_ms": statistics.median(f), "fwd_min_ms": min(f),
            "fwdbwd_ms": statistics.median(fb), "fwdbwd_min_ms": min(fb)}


def torch_gemm_gflops(torch, n, dtype_name):
    """PyTorch's own matrix product rate, n^3, median of 3: headgrad and PyTorch
    may link different BLAS libraries, so each side's GEMM is stated."""
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up
    ms = []
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, b)
        ms.append((time.perf_counter() - t0) * 1e3)
    return 2.0 * n ** 3 / (statistics.median(ms) * 1e-3) / 1e9


def run_headgrad(args, shape, dtype_name):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [args.bench, "bench", "--shape", ",".join(map(str, shape)), "--dtype", dtype_name,
               "--threads", str(args.threads), "--repeats", str(args.repeats),
               "--warmup", str(args.warmup), "--gemm-size", str(args.gemm_size), "--json", out]
        for p in args.plugin:
            cmd += ["--plugin", p]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.exit(f"bench_pytorch: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}")
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", type=parse_shape, help="B,T,D,H; repeatable")
    ap.add_argument("--dtype", action="append", choices=["float32", "float64"], help="repeatable")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads and headgrad --threads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--plugin", action="append", help="headgrad plugins (default batched, per_head, fused_sdpa)")
    ap.add_argument("--bench", default=os.path.join(REPO, "build", "tools", "headgrad"),
                    help="the headgrad program (run as: headgrad bench ...)")
    ap.add_argument("--gemm-size", type=int, default=2048, help="headgrad's yardstick GEMM size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every figure and ratio to this file")
    args = ap.parse_args()
    shapes = args.shape or [parse_shape(s) for s in DEFAULT_SHAPES]
    dtypes = args.dtype or ["float32"]
    args.plugin = args.plugin or ["batched", "per_head", "fused_sdpa"]

    # torch.set_num_threads sizes PyTorch's OpenMP pool only: Debian's PyTorch
    # multiplies matrices through OpenBLAS, whose own pthread pool would still
    # use every core. OpenBLAS reads its count once, at load: set it first.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch  # Debian's python3-torch: /usr/bin/python3
    torch.set_num_threads(args.threads)
    print(f"PyTorch {torch.__version__}, {args.threads} thread(s); headgrad: {args.bench}",
          file=sys.stderr)

    rows = []
    gemm = {}
    torch_gemm = {}
    for dtype_name in dtypes:
        torch_gemm[dtype_name] = torch_gemm_gflops(torch, args.gemm_size, dtype_name)
        for shape in shapes:
            print(f"  {shape} {dtype_name}: PyTorch ...", end="", flush=True, file=sys.stderr)
            tt = time_torch(torch, shape, dtype_name, args.repeats, args.warmup, args.seed)
            print(f" {tt['fwdbwd_ms']:.3f} ms; headgrad ...", end="", flush=True, file=sys.stderr)
            hg = run_headgrad(args, shape, dtype_name)
            print(" done", file=sys.stderr)
            gemm[dtype_name] = hg["gemm_gflops"]
            for r in hg["rows"]:
                if "fwd_ms" not in r:
                    continue
                rows.append({"shape": shape, "dtype": dtype_name, "plugin": r["plugin"],
                             "threads": args.threads,
                             "headgrad_fwd_ms": r["fwd_ms"], "torch_fwd_ms": tt["fwd_ms"],
                             "headgrad_fwdbwd_ms": r["fwdbwd_ms"], "torch_fwdbwd_ms": tt["fwdbwd_ms"],
                             "ratio_fwd": r["fwd_ms"] / tt["fwd_ms"],
                             "ratio_fwdbwd": r["fwdbwd_ms"] / tt["fwdbwd_ms"],
                             "headgrad_peak_bytes": r["peak_bytes"], "gemm_gflops": r["gemm_gflops"]})

    head = ["shape (B,T,D,H)", "dtype", "plugin", "hg fwd ms", "torch fwd ms", "fwd ratio",
            "hg f+b ms", "torch f+b ms", "f+b ratio"]
    lines = [[f"({','.join(map(str, r['shape']))})", r["dtype"], r["plugin"],
              f"{r['headgrad_fwd_ms']:.3f}", f"{r['torch_fwd_ms']:.3f}", f"{r['ratio_fwd']:.2f}",
              f"{r['headgrad_fwdbwd_ms']:.3f}", f"{r['torch_fwdbwd_ms']:.3f}", f"{r['ratio_fwdbwd']:.2f}"]
             for r in rows]
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    for line in [head] + lines:
        print("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip())
    print(f"\nratio = headgrad time / PyTorch time (below 1: headgrad faster); {args.threads} thread(s); "
          f"PyTorch {torch.__version__}\nsame-run {args.gemm_size}^3 GEMM GFLOP/s: headgrad "
          + ", ".join(f"{k} {v:.1f}" for k, v in gemm.items()) + "; PyTorch "
          + ", ".join(f"{k} {v:.1f}" for k, v in torch_gemm.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch_version": torch.__version__, "threads": args.threads, "rows": rows,
                       "gemm_gflops": gemm, "torch_gemm_gflops": torch_gemm}, f, indent=2)


if __name__ == "__main__":
    main()
