"""headgrad.check: `headgrad check` on a Python function, from Python (pytest).

The calling process serves the worker protocol itself to a `headgrad check`
subprocess, so closures, lambdas and functions defined inside a test work:
headgrad's sides talk to this process through two pipes
(HEADGRAD_PYTHON_WORKER_FDS). One case runs at a time; a case that hangs is
killed by the timeout, after which this process cannot serve the remaining
cases (they fail naming the cause).
"""
import json as _json
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

from headgrad import worker as _worker


class CheckResult:
    """What `headgrad check` said: returncode (0 pass, 1 a comparison failed,
    2 bad usage, 3 the function raised or could not run), the terminal report
    (text), and the JSON report (report: dict)."""

    def __init__(self, returncode, text, report):
        self.returncode = returncode
        self.text = text
        self.report = report

    @property
    def passed(self):
        return self.returncode == 0

    def cases(self):
        return (self.report or {}).get("cases", [])

    def failed_cases(self):
        return [c for c in self.cases() if c.get("status") not in ("pass", "xfail")]

    def __repr__(self):
        return f"CheckResult(returncode={self.returncode}, cases={len(self.cases())}, failed={len(self.failed_cases())})"


def _program():
    exe = os.environ.get("HEADGRAD_EXE")
    if exe:
        return exe
    try:
        from headgrad import _install  # written by meson install
        candidate = pathlib.Path(_install.BINDIR) / "headgrad"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("headgrad")
    if not found:
        raise FileNotFoundError("no headgrad program: set HEADGRAD_EXE or put headgrad on PATH")
    return found


def check(fn, level="mha", causal=None, kv_heads=None, rope=None, dtype=None, timeout=None, json=None,
          junit=None, html=None, extra_args=(), raise_on_failure=True, bias=None, features=True):
    """Runs `headgrad check` on fn (a function, closure, lambda or a module_function adapter).

    level:    "mha" fn(x, wq, wk, wv, wo, **kw), "core" fn(q, k, v, **kw), "rope" fn(x, positions, **kw)
    causal:   True/False for a function without a `causal` argument (None: it takes one, or is causal)
    kv_heads: add grouped-kv cases with that many kv heads
    rope:     dict(theta=.., style="interleaved"|"half", rotary_dim=..) adds RoPE cases
    dtype:    one more case in "bfloat16", "float16" or "float32"
    bias:     True/False: every mha case with or without biases bq, bk, bv, bo (None: with them
              when fn's signature names all four, as module_function's does for a module with biases)
    features: False leaves out the cases of the features of current models, which are otherwise
              added for each one whose arguments fn's signature names: window=(left, right),
              softcap=C, sinks [H], q_norm and k_norm (with qk_norm={axis, eps, gain}), x_kv
    Returns a CheckResult; raises AssertionError carrying the report on failure
    (unless raise_on_failure=False).
    """
    name = getattr(fn, "__name__", "fn")
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "fn"
    if name == "_lambda_":
        name = "lambda_fn"
    served = {name: fn}
    args = [_program(), "check", "@" + name, "--level", level]
    if causal is True:
        args.append("--causal")
    elif causal is False:
        args.append("--no-causal")
    if kv_heads:
        args += ["--kv-heads", str(int(kv_heads))]
    if rope:
        args += ["--rope", ",".join(f"{k}={v}" for k, v in dict(rope).items())]
    if dtype:
        args += ["--dtype", str(dtype).replace("torch.", "")]
    if bias is True:
        args.append("--bias")
    elif bias is False:
        args.append("--no-bias")
    if not features:
        args.append("--no-features")
    if timeout:
        args += ["--timeout", str(timeout)]
    for flag, path in (("--junit", junit), ("--html", html)):
        if path:
            args += [flag, str(path)]
    with tempfile.TemporaryDirectory(prefix="headgrad-check-") as tmp:
        report_path = pathlib.Path(json) if json else pathlib.Path(tmp) / "report.json"
        args += ["--json", str(report_path), *extra_args]
        to_worker_r, to_worker_w = os.pipe()      # headgrad -> this process
        from_worker_r, from_worker_w = os.pipe()  # this process -> headgrad
        env = dict(os.environ, HEADGRAD_PYTHON_WORKER_FDS=f"{from_worker_r},{to_worker_w}")
        out_path = pathlib.Path(tmp) / "stdout.txt"
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    pass_fds=(from_worker_r, to_worker_w))
        os.close(from_worker_r)
        os.close(to_worker_w)
        rfile = os.fdopen(to_worker_r, "rb", buffering=0)
        wfile = os.fdopen(from_worker_w, "wb")
        error = []

        def serve():
            try:
                _worker.serve(rfile, wfile, served)
            except (BrokenPipeError, OSError, _worker.wire.ProtocolError) as e:
                error.append(e)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        returncode = proc.wait()
        for f in (rfile, wfile):
            try:
                f.close()
            except OSError:
                pass
        text = out_path.read_text(errors="replace")
        report = None
        if report_path.is_file():
            report = _json.loads(report_path.read_text())
    result = CheckResult(returncode, text, report)
    if raise_on_failure and returncode != 0:
        raise AssertionError(f"headgrad check {name} (exit {returncode}):\n{text}")
    return result
