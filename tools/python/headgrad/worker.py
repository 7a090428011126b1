"""The Python worker: runs your PyTorch attention for headgrad.

`python3 -m headgrad.worker` reads requests on stdin and answers on stdout
(headgrad.wire's messages); what your function prints goes to stderr. torch is
imported once per worker, and each function's module once; the torch graph of
a forward is kept until headgrad sends the gradient of its output, so the
backward that headgrad checks is torch.autograd's, through your own backward or
autograd.Function when you wrote one.

The contract (also tools/headgrad_ref.py's):
  mha   fn(x, wq, wk, wv, wo, **kw) -> out, or (out, {"q_rot": q, "k_rot": k});
        with `bias: true` the biases come as the keyword arguments bq, bk, bv, bo
  core  fn(q, k, v, **kw) -> out, or (out, taps)
  rope  fn(x, positions, **kw) -> out
with the keyword arguments of OFFERED that the signature names (all of them
with **kwargs). A setting the function does not name is fixed: headgrad runs it
only at the value its plugin declares and says so for any other.

The features of current models, each None in a case without it:
  window={"left": L, "right": R}  query i attends key j when i - L <= j <= i + R
                        (None for an unbounded side); with causal, {left: W - 1,
                        right: 0} is a window of W keys, the query included (a
                        bottom-right causal core case comes as the whole mask)
  softcap=C             s <- C tanh(s / C) after the scale, before the masks
  sinks                 [H] logits, one per query head, in each row's softmax
                        denominator (no value, not scaled, not capped)
  q_norm, k_norm        the QK-norm gains (mha), as qk_norm={"axis": "head" |
                        "model", "eps": .., "gain": "w" | "one_plus_w"} says
  x_kv                  [B, Tk, D]: k and v projected from it (mha, cross-attention)
The tensors among them are leaves like x: their gradients are checked.
"""
import importlib
import importlib.util
import inspect
import os
import pathlib
import sys
import traceback

import torch

from headgrad import wire

OFFERED = ("num_heads", "num_kv_heads", "head_dim", "causal", "mask", "scale", "positions", "q_offset",
           "theta", "style", "rotary_dim", "bq", "bk", "bv", "bo", "window", "softcap", "sinks", "qk_norm",
           "q_norm", "k_norm", "x_kv")
BIASES = ("bq", "bk", "bv", "bo")
# the inputs that come as keyword arguments (leaves, their gradients checked) and the case key that sends them
KEYWORD_INPUTS = {"sinks": "sinks: true", "q_norm": "qk_norm", "k_norm": "qk_norm", "x_kv": "cross: true"}
QK_NORM_DEFAULT = {"axis": "head", "eps": 1e-6, "gain": "w"}
POSITIONAL = {"mha": ("x", "wq", "wk", "wv", "wo"), "core": ("q", "k", "v"), "rope": ("x",)}
_PACKAGE_DIR = str(pathlib.Path(__file__).resolve().parent)
_TORCH_DIR = str(pathlib.Path(torch.__file__).resolve().parent)


class Unsupported(Exception):
    """A case the function cannot run (a setting it does not name, at another value)."""


class UserError(Exception):
    """The function broke the contract (returned the wrong thing)."""


def _load_module(path):
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    name = "headgrad_user_" + str(abs(hash(str(path))))
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # the file's own imports (its siblings)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve(spec, served=None):
    """'FILE.py:NAME', 'module:NAME' or '@NAME' (served by the calling process) -> the callable."""
    if spec.startswith("@"):
        if served is None or spec[1:] not in served:
            raise LookupError(f"no function {spec[1:]!r} is served by this process")
        return served[spec[1:]]
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"'{spec}' is not FILE.py:FUNCTION or MODULE:FUNCTION")
    module = _load_module(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{module_name} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{module_name}:{attr} is a {type(obj).__name__}, not a function")
    return obj


def signature_names(fn, declared_only=False):
    """(names of OFFERED the signature takes, whether it takes **kwargs); declared_only: those it names itself."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return [], False
    takes_all = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    names = {p.name for p in params}
    return [k for k in OFFERED if (takes_all and not declared_only) or k in names], takes_all


def _where(fn):
    """'file.py:12' of the function, when Python knows it."""
    try:
        target = inspect.unwrap(fn)
        target = getattr(target, "__func__", target)
        code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
        return f"{code.co_filename}:{code.co_firstlineno}" if code else ""
    except Exception:
        return ""


def user_frame(tb):
    """'file.py:LINE in NAME' of the innermost frame outside torch and headgrad: the user's code."""
    frames = traceback.extract_tb(tb)
    for f in reversed(frames):
        file = str(pathlib.Path(f.filename).resolve()) if f.filename and not f.filename.startswith("<") else f.filename
        if not file.startswith(_PACKAGE_DIR) and not file.startswith(_TORCH_DIR):
            return f"{f.filename}:{f.lineno} in {f.name}"
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""


def _fixed(name, value, declared, fn_name):
    if declared is None or value == declared:
        return
    raise Unsupported(f"{fn_name} takes no '{name}' argument and is declared {name}={declared}: "
                      f"it cannot run a case with {name}={value}")


class Worker:
    def __init__(self, served=None):
        self.served = served
        self.functions = {}
        self.graphs = {}
        self.next_id = 1

    def function(self, spec):
        if spec not in self.functions:
            self.functions[spec] = resolve(spec, self.served)
        return self.functions[spec]

    # ------------------------------------------------------------ requests
    def handle(self, header, tensors):
        op = header.get("op")
        try:
            if op == "hello":
                self.graphs.clear()
                return {"op": "hello", "nonce": header.get("nonce"), "torch": torch.__version__,
                        "pid": os.getpid()}, []
            if op == "describe":
                fn = self.function(header["fn"])
                names, takes_all = signature_names(fn)
                declared = signature_names(fn, declared_only=True)[0]
                return {"op": "described", "names": names, "declared": declared, "var_keyword": takes_all,
                        "where": _where(fn), "qualname": getattr(fn, "__qualname__", type(fn).__name__)}, []
            if op == "forward":
                return self.forward(header, tensors)
            if op == "backward":
                return self.backward(header, tensors)
            if op == "release":
                self.graphs.pop(header.get("id"), None)
                return {"op": "released"}, []
            return {"op": "error", "type": "ProtocolError", "message": f"unknown request {op!r}", "where": ""}, []
        except Unsupported as e:
            return {"op": "unsupported", "message": str(e)}, []
        except Exception as e:  # the user's code failed: its type, message and line
            return {"op": "error", "type": type(e).__name__, "message": str(e), "where": user_frame(e.__traceback__),
                    "traceback": traceback.format_exc()}, []

    def forward(self, header, tensors):
        fn = self.function(header["fn"])
        fn_name = header["fn"].rpartition(":")[2].lstrip("@")
        level = header["level"]
        s = header.get("settings", {})
        fixed = header.get("fixed", {})
        names, _ = signature_names(fn)
        grad = bool(header.get("grad", True))
        positional = POSITIONAL[level]
        inputs = tuple(header.get("inputs") or positional)  # the positional ones, then keyword ones
        given = inputs[len(positional):]
        if any(b in given for b in BIASES):
            missing = [b for b in BIASES if b not in names]
            if missing:
                raise Unsupported(f"{fn_name} takes no {', '.join(missing)} argument: it cannot run a case with "
                                  "biases (bias: true)")
        for n in given:
            if n not in BIASES and n not in names:
                raise Unsupported(f"{fn_name} takes no '{n}' argument: it cannot run a case with {KEYWORD_INPUTS[n]}")
        leaves = []
        for n in inputs:
            t = tensors[n].detach()
            if grad:
                t.requires_grad_(True)
            leaves.append(t)
        # keyword inputs: the case's leaves, or None in a case without them (biases at the mha level only)
        kw = {n: leaf for n, leaf in zip(given, leaves[len(positional):])}
        absent = (BIASES if level == "mha" else ()) + tuple(KEYWORD_INPUTS) if level != "rope" else ()
        for n in absent:
            if n in names and n not in kw:
                kw[n] = None
        if level != "rope":
            self._feature_settings(s, names, fn_name, kw)
        offer = {"num_heads": s.get("num_heads"), "num_kv_heads": s.get("num_kv_heads"),
                 "head_dim": s.get("head_dim")}
        for k, v in offer.items():
            if k in names:
                kw[k] = v
        if level != "rope":
            causal, mask = bool(s.get("causal")), tensors.get("mask")
            if "causal" in names:
                kw["causal"] = causal
            else:
                _fixed("causal", causal, fixed.get("causal"), fn_name)
            if mask is not None and "mask" not in names:
                raise Unsupported(f"{fn_name} takes no 'mask' argument: it cannot run a case with a boolean mask")
            if "mask" in names:
                kw["mask"] = mask
            if s.get("scale") is not None:
                if "scale" not in names:
                    raise Unsupported(f"{fn_name} takes no 'scale' argument: it cannot run a case with scale "
                                      f"{s['scale']}")
                kw["scale"] = s["scale"]
            elif "scale" in names:
                kw["scale"] = None
        rope = s.get("rope")
        positions = tensors.get("positions")
        if level == "rope":
            args = (leaves[0], positions)
        else:
            args = tuple(leaves[:len(positional)])
            if rope is None:
                if "positions" in names:
                    kw["positions"] = None
                elif fixed.get("rope"):
                    raise Unsupported(f"{fn_name} takes no 'positions' argument and always rotates (declared rope): "
                                      "it cannot run a case without RoPE")
            else:
                if "positions" in names:
                    kw["positions"] = positions
                elif not rope.get("default_positions"):
                    raise Unsupported(f"{fn_name} takes no 'positions' argument: it cannot run a case whose tokens "
                                      "are not at positions 0..T-1")
                if rope.get("q_offset"):
                    if "q_offset" not in names:
                        raise Unsupported(f"{fn_name} takes no 'q_offset' argument: it cannot run queries at "
                                          f"q_offset {rope['q_offset']}")
                if "q_offset" in names:
                    kw["q_offset"] = int(rope.get("q_offset", 0))
        if rope is not None:
            for k in ("theta", "style", "rotary_dim"):
                if k in names:
                    kw[k] = rope[k]
                else:
                    declared = (fixed.get("rope_settings") or {}).get(k)
                    if k == "rotary_dim" and declared == 0:  # the whole head width
                        declared = s.get("head_dim")
                    _fixed(k, rope[k], declared, fn_name)
        with torch.set_grad_enabled(grad):
            result = fn(*args, **kw)
        out, taps = self._split(result, level)
        if not isinstance(out, torch.Tensor):
            raise UserError(f"{fn_name} returned a {type(out).__name__}, expected a torch.Tensor")
        reply = [("out", out)]
        for name in ("q_rot", "k_rot"):
            if name in taps:
                reply.append((name, taps[name]))
        gid = 0
        if grad and out.requires_grad:
            gid = self.next_id
            self.next_id += 1
            self.graphs[gid] = (leaves, out)
        return {"op": "out", "id": gid, "used": sorted(kw)}, reply

    @staticmethod
    def _feature_settings(s, names, fn_name, kw):
        """window={left, right}, softcap=C, qk_norm={axis, eps, gain}: None when the case has none; a case
        with one is refused to a function that does not take it (QK-norm: runs at its defaults without)."""
        for key, what in (("window", "a sliding window"), ("softcap", "logit soft-capping")):
            value = s.get(key)
            if value is not None and key not in names:
                raise Unsupported(f"{fn_name} takes no '{key}' argument: it cannot run a case with {what}")
            if key in names:
                kw[key] = value
        qk_norm = s.get("qk_norm")
        if "qk_norm" in names:
            kw["qk_norm"] = qk_norm
        elif qk_norm is not None and qk_norm != QK_NORM_DEFAULT:
            raise Unsupported(f"{fn_name} takes no 'qk_norm' argument, so it normalizes as {QK_NORM_DEFAULT} "
                              f"only: it cannot run a case with qk_norm {qk_norm}")

    @staticmethod
    def _split(result, level):
        if isinstance(result, tuple):
            if level == "rope" or len(result) != 2 or not isinstance(result[1], dict):
                raise UserError("the function returned a tuple; only an mha or core function may, as "
                                "(out, {'q_rot': .., 'k_rot': ..})")
            unknown = set(result[1]) - {"q_rot", "k_rot"}
            if unknown:
                raise UserError(f"unknown taps {sorted(unknown)}; the taps are q_rot and k_rot")
            return result[0], result[1]
        return result, {}

    def backward(self, header, tensors):
        gid = header.get("id")
        if gid not in self.graphs:
            raise UserError(f"no forward {gid} is kept (released, or the worker was restarted)")
        leaves, out = self.graphs.pop(gid)
        grad_out = tensors["grad_out"]
        if grad_out.dtype != out.dtype:
            grad_out = grad_out.to(out.dtype)
        torch.autograd.backward(out, grad_out)
        return {"op": "grads"}, [(f"g{i}", leaf.grad) for i, leaf in enumerate(leaves)]


def serve(rfile, wfile, served=None):
    """Answers requests until the other end closes the pipe."""
    worker = Worker(served)
    while True:
        msg = wire.read_message(rfile)
        if msg is None:
            return
        header, reply = worker.handle(*msg)
        wire.write_message(wfile, header, reply)


def main():
    threads = os.environ.get("HEADGRAD_NUM_THREADS")
    torch.set_num_threads(int(threads) if threads and threads.isdigit() and int(threads) > 0 else 1)
    rfile = os.fdopen(os.dup(0), "rb", buffering=0)
    wfile = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the user's prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    try:
        serve(rfile, wfile)
    except (BrokenPipeError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
