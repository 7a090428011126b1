#!/usr/bin/python3
"""headgrad beside PyTorch at its best: the same causal MHA shapes, the same threads, one run.

PyTorch at its best means the fastest of four ways to run it, for each shape:
two OpenBLAS core types (OPENBLAS_CORETYPE=Haswell and SkylakeX: Debian's
PyTorch multiplies through OpenBLAS, which reads the variable once, at load,
so each core type runs in its own child process) times two implementations:

  manual      causal MHA written the usual batched way: project, view,
              transpose, q k^T / sqrt(d), masked_fill, softmax, @ v, transpose
              back, reshape, project;
  functional  torch.nn.functional.multi_head_attention_forward, PyTorch's own
              (one packed [3D, D] in-projection, baddbmm with an additive
              causal mask, bmm), on its native [T, B, D] layout.

Each is timed forward and forward + backward with loss = sum(out * R); the
fastest forward + backward is PyTorch's figure, and the table says which
core type and implementation it was. The two implementations are checked to
give the same output on the same weights before any timing.

Same threads means both pools on both sides: headgrad bench --threads N sets
its BLAS's and its own workers'; here torch.set_num_threads(N) and
OPENBLAS_NUM_THREADS=N (Debian's PyTorch calls OpenBLAS, which ignores the former).
Each side's own GEMM rate (gemm_size^3) is printed too: headgrad links BLIS by
default, Debian's PyTorch links OpenBLAS through libblas.so.3.

A developer tool, never needed to build or test headgrad. It needs
Debian's python3-torch, so run it with the system Python:

    /usr/bin/python3 tools/bench_pytorch.py --threads 1 --dtype float32
    /usr/bin/python3 tools/bench_pytorch.py --shape 4,512,512,8 --dtype float64 \\
        --bench build/tools/headgrad --json side_by_side.json
    /usr/bin/python3 tools/bench_pytorch.py --goals      # tools/bench_goals does this

For each shape and dtype the PyTorch children run first, then `headgrad bench
--json` for the same shape right after (interleaved, so that a change in
machine load hits both sides), and it prints headgrad / PyTorch-best time
ratios (below 1: headgrad is faster).

--goals measures every speed goal of docs/performance.md in one run and prints
each with its figure and verdict (met / missed); it exits 0 whatever the
verdicts (1 only when something could not run).

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
CORETYPES = ["Haswell", "SkylakeX"]
IMPLS = ["manual", "functional"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_shape(text):
    parts = [int(p) for p in text.strip("() ").split(",")]
    if len(parts) != 4 or parts[2] % parts[3] != 0:
        raise argparse.ArgumentTypeError(f"shape '{text}' is not B,T,D,H with D divisible by H")
    return tuple(parts)


def shape_str(shape):
    return f"({','.join(map(str, shape))})"


# ---------------------------------------------------------------- PyTorch (in a child)

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


def torch_functional(F, x_tbd, w_in, wo, heads, additive_mask):
    """x [T, B, D] -> [T, B, D] through F.multi_head_attention_forward; w_in [3D, D]
    is wq, wk, wv stacked (nn.MultiheadAttention's in_proj_weight)."""
    dm = x_tbd.shape[-1]
    out, _ = F.multi_head_attention_forward(
        x_tbd, x_tbd, x_tbd, dm, heads, w_in, None, None, None, False, 0.0, wo, None,
        training=False, need_weights=False, attn_mask=additive_mask)
    return out


def time_torch(torch, shape, dtype_name, impls, repeats, warmup, seed):
    """{impl: {fwd_ms, fwd_min_ms, fwdbwd_ms, fwdbwd_min_ms}} for one shape."""
    import torch.nn.functional as F
    b, t, dm, h = shape
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, dm, generator=g, dtype=dtype)
    ws = [torch.randn(dm, dm, generator=g, dtype=dtype) / math.sqrt(dm) for _ in range(4)]
    r = torch.randn(b, t, dm, generator=g, dtype=dtype)
    mask = torch.ones(t, t, dtype=torch.bool).tril()  # True = attend

    # Each implementation gets its own leaves, in its own layout, holding the same values.
    setups = {}
    if "manual" in impls:
        leaves = [x.clone().requires_grad_()] + [w.clone().requires_grad_() for w in ws]
        setups["manual"] = (leaves, r, lambda l: torch_mha(torch, l[0], *l[1:], h, mask))
    if "functional" in impls:
        additive = torch.zeros(t, t, dtype=dtype).masked_fill(~mask, float("-inf"))
        leaves = [x.transpose(0, 1).contiguous().requires_grad_(),              # [T, B, D]
                  torch.cat(ws[:3]).contiguous().requires_grad_(),             # [3D, D]
                  ws[3].clone().requires_grad_()]
        setups["functional"] = (leaves, r.transpose(0, 1).contiguous(),
                                lambda l: torch_functional(F, l[0], l[1], l[2], h, additive))

    outs = {}
    for name, (leaves, _, fn) in setups.items():
        with torch.no_grad():
            o = fn(leaves)
        outs[name] = o if name == "manual" else o.transpose(0, 1)
    if len(outs) == 2:
        tol = 1e-4 if dtype_name == "float32" else 1e-10
        if not torch.allclose(outs["manual"], outs["functional"], rtol=tol, atol=tol):
            diff = (outs["manual"] - outs["functional"]).abs().max().item()
            sys.exit(f"bench_pytorch: manual and functional MHA disagree at {shape_str(shape)} "
                     f"{dtype_name} (max abs diff {diff:g})")

    result = {}
    for name, (leaves, rr, fn) in setups.items():
        # (wall ms, process CPU ms) of one call: the CPU time leaves out what
        # other jobs on a loaded machine took (headgrad bench reports the same)
        def fwd():
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn(leaves)
            ms = ((time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3)
            del out
            return ms

        def fwdbwd():
            for leaf in leaves:
                leaf.grad = None
            t0, c0 = time.perf_counter(), time.process_time()
            loss = (fn(leaves) * rr).sum()
            loss.backward()
            del loss
            return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3

        for _ in range(warmup):
            fwdbwd()
        f = [fwd() for _ in range(repeats)]
        fb = [fwdbwd() for _ in range(repeats)]
        result[name] = {"fwd_ms": statistics.median(w for w, _ in f), "fwd_min_ms": min(w for w, _ in f),
                        "fwdbwd_ms": statistics.median(w for w, _ in fb),
                        "fwdbwd_min_ms": min(w for w, _ in fb),
                        "fwd_cpu_ms": statistics.median(c for _, c in f),
                        "fwdbwd_cpu_ms": statistics.median(c for _, c in fb)}
    return result


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


def torch_worker(spec):
    """The child's side: spec (JSON on stdin) names shape, dtype, impls, threads,
    repeats, warmup, seed, gemm_size; the result goes to stdout as JSON. Its
    OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS were set by the parent."""
    import torch
    torch.set_num_threads(spec["threads"])
    shape = tuple(spec["shape"])
    times = time_torch(torch, shape, spec["dtype"], spec["impls"], spec["repeats"],
                       spec["warmup"], spec["seed"])
    json.dump({"torch_version": torch.__version__,
               "gemm_gflops": torch_gemm_gflops(torch, spec["gemm_size"], spec["dtype"]),
               "times": times}, sys.stdout)


def run_torch(args, shape, dtype_name, coretype):
    """One child under OPENBLAS_CORETYPE=coretype: {impl: times}, its GEMM rate."""
    env = dict(os.environ)
    env["OPENBLAS_CORETYPE"] = coretype
    # torch.set_num_threads sizes PyTorch's OpenMP pool only: Debian's PyTorch
    # multiplies matrices through OpenBLAS, whose own pthread pool would still
    # use every core. OpenBLAS reads its count once, at load: set it first.
    env["OPENBLAS_NUM_THREADS"] = str(args.threads)
    env["OMP_NUM_THREADS"] = str(args.threads)
    spec = {"shape": list(shape), "dtype": dtype_name, "impls": args.impl, "threads": args.threads,
            "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
            "gemm_size": args.torch_gemm_size}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-worker"],
                          input=json.dumps(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"bench_pytorch: PyTorch child (OPENBLAS_CORETYPE={coretype}) at {shape_str(shape)} "
                 f"exited {proc.returncode}:\n{proc.stderr}")
    return json.loads(proc.stdout)


def torch_best(args, shape, dtype_name):
    """Every core type x implementation, and the fastest forward + backward."""
    runs = []
    gemm = {}
    version = None
    for coretype in args.coretype:
        child = run_torch(args, shape, dtype_name, coretype)
        version = child["torch_version"]
        gemm[coretype] = child["gemm_gflops"]
        for impl, t in child["times"].items():
            runs.append(dict(t, coretype=coretype, impl=impl))
    best = min(runs, key=lambda r: r["fwdbwd_ms"])
    best_fwd = min(r["fwd_ms"] for r in runs)
    best_cpu = min(runs, key=lambda r: r["fwdbwd_cpu_ms"])
    return {"runs": runs, "best": best, "best_fwd_ms": best_fwd, "best_cpu": best_cpu,
            "gemm_gflops": gemm, "torch_version": version}


# ---------------------------------------------------------------- headgrad

def run_headgrad(args, shape, dtype_name, threads=None, plugins=None):
    threads = threads or [args.threads]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [args.bench, "bench", "--shape", ",".join(map(str, shape)),
               "--repeats", str(args.repeats), "--warmup", str(args.warmup),
               "--gemm-size", str(args.gemm_size), "--json", out]
        for d in dtype_name if isinstance(dtype_name, list) else [dtype_name]:
            cmd += ["--dtype", d]
        for n in threads:
            cmd += ["--threads", str(n)]
        for p in plugins or args.plugin:
            cmd += ["--plugin", p]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.exit(f"bench_pytorch: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}")
        with open(out) as f:
            return json.load(f)


def print_table(head, lines, left):
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    for line in [head] + lines:
        print("  ".join(c.ljust(w) if i < left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths))).rstrip())


def ms(v):
    """A time in ms to 3 significant digits at least: 0.0412, 4.12, 412.3."""
    return f"{v:.3g}" if v < 100 else f"{v:.1f}"


def load_line():
    with open("/proc/loadavg") as f:
        return "load average " + " ".join(f.read().split()[:3])


# ---------------------------------------------------------------- side by side

def side_by_side(args):
    shapes = args.shape or [parse_shape(s) for s in DEFAULT_SHAPES]
    dtypes = args.dtype or ["float32"]
    args.plugin = args.plugin or ["batched", "per_head", "fused_sdpa"]
    rows = []
    gemm = {}
    torch_gemm = {}
    torch_runs = []
    version = None
    for dtype_name in dtypes:
        for shape in shapes:
            print(f"  {shape_str(shape)} {dtype_name}: PyTorch ...", end="", flush=True, file=sys.stderr)
            tb = torch_best(args, shape, dtype_name)
            version = tb["torch_version"]
            torch_gemm.setdefault(dtype_name, {}).update(tb["gemm_gflops"])
            best = tb["best"]
            torch_runs.append({"shape": shape, "dtype": dtype_name, "runs": tb["runs"]})
            print(f" best {best['fwdbwd_ms']:.3f} ms ({best['coretype']}, {best['impl']}); headgrad ...",
                  end="", flush=True, file=sys.stderr)
            hg = run_headgrad(args, shape, dtype_name)
            print(" done", file=sys.stderr)
            gemm[dtype_name] = hg["gemm_gflops"]
            for r in hg["rows"]:
                if "fwd_ms" not in r:
                    continue
                rows.append({"shape": shape, "dtype": dtype_name, "plugin": r["plugin"],
                             "threads": args.threads,
                             "headgrad_fwd_ms": r["fwd_ms"], "torch_fwd_ms": tb["best_fwd_ms"],
                             "headgrad_fwdbwd_ms": r["fwdbwd_ms"], "torch_fwdbwd_ms": best["fwdbwd_ms"],
                             "torch_winner": f"{best['coretype']}/{best['impl']}",
                             "ratio_fwd": r["fwd_ms"] / tb["best_fwd_ms"],
                             "ratio_fwdbwd": r["fwdbwd_ms"] / best["fwdbwd_ms"],
                             "ratio_fwdbwd_cpu": r["fwdbwd_cpu_ms"] / tb["best_cpu"]["fwdbwd_cpu_ms"],
                             "headgrad_peak_bytes": r["peak_bytes"], "gemm_gflops": r["gemm_gflops"]})

    print("PyTorch, every core type and implementation (ms, median):")
    lines = []
    for t in torch_runs:
        for r in t["runs"]:
            lines.append([shape_str(t["shape"]), t["dtype"], r["coretype"], r["impl"],
                          f"{r['fwd_ms']:.3f}", f"{r['fwdbwd_ms']:.3f}"])
    print_table(["shape (B,T,D,H)", "dtype", "OPENBLAS_CORETYPE", "impl", "fwd ms", "f+b ms"], lines, 4)
    print("\nheadgrad against PyTorch at its best (fwd: the best PyTorch forward; f+b: the best "
          "forward + backward, and which won):")
    lines = [[shape_str(r["shape"]), r["dtype"], r["plugin"],
              f"{r['headgrad_fwd_ms']:.3f}", f"{r['torch_fwd_ms']:.3f}", f"{r['ratio_fwd']:.2f}",
              f"{r['headgrad_fwdbwd_ms']:.3f}", f"{r['torch_fwdbwd_ms']:.3f}", r["torch_winner"],
              f"{r['ratio_fwdbwd']:.2f}", f"{r['ratio_fwdbwd_cpu']:.2f}"] for r in rows]
    print_table(["shape (B,T,D,H)", "dtype", "plugin", "hg fwd ms", "torch fwd ms", "fwd ratio",
                 "hg f+b ms", "torch f+b ms", "torch won", "f+b ratio", "f+b CPU ratio"], lines, 3)
    print(f"\nratio = headgrad time / best PyTorch time (below 1: headgrad faster); CPU ratio: the same "
          f"with process CPU time (each side's fastest); {args.threads} thread(s); "
          f"PyTorch {version}\nsame-run GEMM GFLOP/s: headgrad {args.gemm_size}^3 "
          + ", ".join(f"{k} {v:.1f}" for k, v in gemm.items()) + f"; PyTorch {args.torch_gemm_size}^3 "
          + ", ".join(f"{k} " + " ".join(f"{c} {v:.1f}" for c, v in per.items())
                      for k, per in torch_gemm.items())
          + f"\n{load_line()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch_version": version, "threads": args.threads, "rows": rows,
                       "torch_runs": torch_runs, "gemm_gflops": gemm,
                       "torch_gemm_gflops": torch_gemm}, f, indent=2)


# ---------------------------------------------------------------- the goals

def hg_row(result, plugin, threads=1, dtype="float32"):
    for r in result["rows"]:
        if r["plugin"] == plugin and r["threads"] == threads and r["dtype"] == dtype and "fwdbwd_ms" in r:
            return r
    sys.exit(f"bench_pytorch: headgrad bench gave no {plugin} {dtype} row at {threads} thread(s)")


def goals(args):
    """Every speed goal, measured in this one run; one verdict each (float32, and bfloat16 against it)."""
    args.threads = 1
    small, mid, long_ = (2, 3, 8, 2), (4, 512, 512, 8), (1, 2048, 512, 8)
    plugins = ["batched", "per_head", "fused_sdpa"]
    measured = {}
    for shape in (small, mid, long_):
        print(f"  {shape_str(shape)}: PyTorch ...", end="", flush=True, file=sys.stderr)
        tb = torch_best(args, shape, "float32")
        print(f" best {tb['best']['fwdbwd_ms']:.3f} ms; headgrad ...", end="", flush=True, file=sys.stderr)
        threads = [1, 2] if shape == mid else [1]
        hg = run_headgrad(args, shape, "float32", threads=threads, plugins=plugins)
        print(" done", file=sys.stderr)
        measured[shape] = (tb, hg)
    # bfloat16 against float32, in one headgrad run (headgrad alone: PyTorch is not in this goal)
    print(f"  {shape_str(long_)}: headgrad float32 and bfloat16 ...", end="", flush=True, file=sys.stderr)
    lowp = run_headgrad(args, long_, ["float32", "bfloat16"], threads=[1], plugins=["batched", "fused_sdpa"])
    print(" done", file=sys.stderr)

    out = []  # [goal, figure, target, verdict]

    def vs_torch(plugin, shape, limit):
        tb, hg = measured[shape]
        r = hg_row(hg, plugin)
        best, best_cpu = tb["best"], tb["best_cpu"]
        ratio = r["fwdbwd_ms"] / best["fwdbwd_ms"]
        cpu = r["fwdbwd_cpu_ms"] / best_cpu["fwdbwd_cpu_ms"]
        out.append([f"{plugin} / PyTorch f+b at {shape_str(shape)}",
                    f"{ratio:.2f} ({ms(r['fwdbwd_ms'])} / {ms(best['fwdbwd_ms'])} ms, "
                    f"{best['coretype']}/{best['impl']}); CPU time {cpu:.2f} "
                    f"({ms(r['fwdbwd_cpu_ms'])} / {ms(best_cpu['fwdbwd_cpu_ms'])} ms, "
                    f"{best_cpu['coretype']}/{best_cpu['impl']})", f"<= {limit}", ratio <= limit, ratio,
                    cpu <= limit])

    def causal_of_gemm(plugin, shape, limit):
        _, hg = measured[shape]
        r = hg_row(hg, plugin)
        frac = r["gflops_fwdbwd_causal"] / r["gemm_gflops_adjacent"]
        cpu_gflops = r["flops"]["fwdbwd_causal"] / (r["fwdbwd_cpu_ms"] * 1e6)
        cpu = cpu_gflops / r["gemm_gflops_cpu_adjacent"]
        out.append([f"{plugin} causal-useful GFLOP/s / sgemm at {shape_str(shape)}",
                    f"{frac:.2f} ({r['gflops_fwdbwd_causal']:.1f} / {r['gemm_gflops_adjacent']:.1f} "
                    f"adjacent; {r['gemm_fraction_fwdbwd_causal']:.2f} of the run's); CPU time {cpu:.2f} "
                    f"({cpu_gflops:.1f} / {r['gemm_gflops_cpu_adjacent']:.1f})",
                    f">= {limit}", frac >= limit, frac, cpu >= limit])

    vs_torch("batched", mid, 0.8)
    vs_torch("fused_sdpa", long_, 0.5)
    vs_torch("per_head", mid, 1.2)
    causal_of_gemm("fused_sdpa", long_, 0.8)
    causal_of_gemm("batched", mid, 0.7)
    for p in plugins:
        vs_torch(p, small, 0.25)
    for p in ("batched", "fused_sdpa"):
        r32, r16 = hg_row(lowp, p, dtype="float32"), hg_row(lowp, p, dtype="bfloat16")
        ratio, cpu = r16["fwdbwd_ms"] / r32["fwdbwd_ms"], r16["fwdbwd_cpu_ms"] / r32["fwdbwd_cpu_ms"]
        out.append([f"{p} bfloat16 / float32 f+b at {shape_str(long_)}",
                    f"{ratio:.2f} ({ms(r16['fwdbwd_ms'])} / {ms(r32['fwdbwd_ms'])} ms; bfloat16 products: "
                    f"{lowp['environment']['bf16_products']}); CPU time {cpu:.2f}",
                    "<= 1.0", ratio <= 1.0, ratio, cpu <= 1.0])
    _, hg = measured[mid]
    for p in plugins:
        r1, r2 = hg_row(hg, p, 1), hg_row(hg, p, 2)
        # sgemm scaling as timed right before and after each row
        scaling = r2["gemm_gflops_adjacent"] / r1["gemm_gflops_adjacent"]
        predicted = r1["fwdbwd_ms"] / scaling
        ratio = r2["fwdbwd_ms"] / predicted
        out.append([f"{p} 2 threads f+b at {shape_str(mid)} / sgemm-predicted",
                    f"{ratio:.2f} ({ms(r2['fwdbwd_ms'])} ms; predicted {ms(predicted)} = "
                    f"{ms(r1['fwdbwd_ms'])} / {scaling:.2f})", "<= 1.1", ratio <= 1.1, ratio, None])

    print("Speed goals, float32 unless stated, fwd+bwd medians, one thread unless stated; PyTorch at its best = "
          "the fastest of OPENBLAS_CORETYPE Haswell/SkylakeX x manual/functional MHA.\n"
          "The verdict is on wall time; 'on CPU time' judges the same goal by process CPU time (each "
          "side's fastest), which a loaded machine does not distort (n/a for two threads):")
    def verdict(ok):
        return "n/a" if ok is None else "met" if ok else "MISSED"
    print_table(["goal", "figure", "target", "verdict", "on CPU time"],
                [[g, f, t, verdict(ok), verdict(cpu_ok)] for g, f, t, ok, _, cpu_ok in out], 2)
    tb, hg = measured[mid]
    gemm1 = [g for g in hg["gemm"] if g["threads"] == 1][0]["gflops"]
    gemm2 = [g for g in hg["gemm"] if g["threads"] == 2][0]["gflops"]
    print(f"\nheadgrad sgemm {args.gemm_size}^3: {gemm1:.1f} GFLOP/s on 1 thread, {gemm2:.1f} on 2; "
          "PyTorch sgemm " + ", ".join(f"{c} {v:.1f}" for c, v in tb["gemm_gflops"].items())
          + f" GFLOP/s ({args.torch_gemm_size}^3); PyTorch {tb['torch_version']}; {load_line()}; "
          f"{sum(bool(o[3]) for o in out)}/{len(out)} met on wall time, "
          f"{sum(bool(o[5]) for o in out)}/{sum(o[5] is not None for o in out)} on CPU time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"goals": [{"goal": g, "figure": fig, "target": t, "met": ok, "value": v,
                                  "met_on_cpu_time": cpu_ok}
                                 for g, fig, t, ok, v, cpu_ok in out],
                       "measured": [{"shape": s, "torch": tb, "headgrad": hg}
                                    for s, (tb, hg) in measured.items()]}, f, indent=2)


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--torch-worker":
        torch_worker(json.load(sys.stdin))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goals", action="store_true",
                    help="measure every speed goal in one run and print its verdict (float32, and "
                         "bfloat16 against float32; ignores --shape, --dtype, --threads, --plugin)")
    ap.add_argument("--shape", action="append", type=parse_shape, help="B,T,D,H; repeatable")
    ap.add_argument("--dtype", action="append", choices=["float32", "float64"], help="repeatable")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads and headgrad --threads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--plugin", action="append", help="headgrad plugins (default batched, per_head, fused_sdpa)")
    ap.add_argument("--coretype", action="append", choices=CORETYPES,
                    help="OPENBLAS_CORETYPE for PyTorch's children; repeatable (default both)")
    ap.add_argument("--impl", action="append", choices=IMPLS,
                    help="PyTorch implementations; repeatable (default both)")
    ap.add_argument("--bench", default=os.path.join(REPO, "build", "tools", "headgrad"),
                    help="the headgrad program (run as: headgrad bench ...)")
    ap.add_argument("--gemm-size", type=int, default=2048, help="headgrad's yardstick GEMM size")
    ap.add_argument("--torch-gemm-size", type=int, default=1024, help="PyTorch's GEMM size (stated only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every figure and ratio to this file")
    args = ap.parse_args()
    args.coretype = args.coretype or CORETYPES
    args.impl = args.impl or IMPLS
    if not os.path.exists(args.bench):
        sys.exit(f"bench_pytorch: no headgrad program at {args.bench} (build with tools/build, or --bench)")
    print(f"PyTorch children under OPENBLAS_CORETYPE {', '.join(args.coretype)}, implementations "
          f"{', '.join(args.impl)}; headgrad: {args.bench}", file=sys.stderr)
    if args.goals:
        goals(args)
    else:
        side_by_side(args)


if __name__ == "__main__":
    main()
