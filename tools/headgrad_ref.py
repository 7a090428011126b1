#!/usr/bin/python3
"""Write a headgrad reference directory from your own PyTorch attention.

headgrad checks a plugin against tensors made elsewhere: a reference directory
of plain .npy files (docs/references.md). This module makes one from a PyTorch
function of yours. It draws random inputs from a seed, runs your function,
takes the loss sum(out * r) with r random, backpropagates, and writes the
inputs, the output and the gradients.

Three levels, one writer each (shape legend: B batch, T tokens, D model width,
H query heads, Hkv key/value heads, d head width, Tq/Tk query/key tokens):

  mha   fn(x, wq, wk, wv, wo) -> out          x [B, T, D], W is [out, in], y = x W^T:
        wq [H*d, D], wk and wv [Hkv*d, D], wo [D, H*d]; out [B, T, D].
        writes x, wq, wk, wv, wo, r, out, dx, dwq, dwk, dwv, dwo (+ positions,
        q_rot, k_rot for RoPE). With bias=True (--bias) fn also gets the biases
        as keyword arguments bq [H*d], bk and bv [Hkv*d], bo [D] (y = x W^T + b,
        F.linear(x, w, b)), drawn after r, and bq, bk, bv, bo, dbq, dbk, dbv,
        dbo are written too. With qk_norm={"axis": "head"|"model", "eps": 1e-6,
        "gain": "w"|"one_plus_w"} (--qk-norm) fn also gets the QK-norm gains q_norm,
        k_norm ([d], or [H*d] and [Hkv*d] for axis model; per dim, never uniform) and
        the settings as qk_norm; with cross=True (--cross, shape Tq and Tk instead
        of T) it gets x_kv [B, Tk, D], k and v come from it, and x_kv, dx_kv are
        written (q_norm, k_norm, dq_norm, dk_norm with qk_norm).
  core  fn(q, k, v) -> out                    q [B, H, Tq, d], k and v [B, Hkv, Tk, d]
        (or [B, Tq, d] and [B, Tk, d] when shape has no H); out like q.
        writes q, k, v, r, out, dq, dk, dv (+ mask when causal or a mask is given;
        + positions, q_rot, k_rot for RoPE: keys at positions, queries at
        positions[..., :Tq] + q_offset).
  rope  fn(x, positions) -> out               x [B, T, d] (or [B, H, T, d] with H),
        positions int64 [T] or [B, T]; writes x, positions, r, out, dx.

Your function gets, as keyword arguments, those of num_heads, num_kv_heads,
head_dim, causal, positions, mask that its signature names (or all of them if
it takes **kwargs), so it need not close over the shape (a core RoPE function
also gets q_offset).

Sliding windows, soft-capping and sinks (mha and core levels): with window=
{"left": L, "right": R} (--window left=L,right=R; either bound may be left out)
fn gets window (both keys, None where unbounded: key j is in query i's window
iff p_i - L <= j <= p_i + R, p_i = i, or i + Tk - Tq with causal="bottom_right"
(--bottom-right, core level)); with softcap=C (--softcap C) it gets softcap (the
scores become C tanh(s / C) after the scale, before the masks); with sinks=True
(--sinks) it gets sinks [H], one logit per query head drawn after every other
input (U(-1, 3)), an extra softmax column with no value, and sinks, dsinks are
written. case.yaml carries window, softcap and sinks: true. A function whose
signature names none of them (and takes no **kwargs) is refused, as for positions
and the biases: the setting would be dropped silently. An mha function, or a core one with a head axis, may return
(out, {"q_rot": q, "k_rot": k}) to add the taps after the rotation.

The writer checks what it can see from outside: a function that breaks its
declared causality (or mask), whose output ignores an input (a zero gradient
is written), or that returns NaN or Inf in out or a gradient, is still written,
as it computes, with a HeadgradRefWarning naming what was seen and suggesting
`headgrad check FILE.py:FUNCTION`, which localizes and names known bugs.
A 3-D core case (q, k, v [B, T, d], no H) takes its mask as [Tq, Tk] or [B, Tq, Tk].

A float32 directory also gets golden/: the same files in float64, from the same
function run in float64 on the float32 inputs cast up (the rounded inputs, so
golden/ minus the float32 expected files is the float32 computation's own error).

Python:
    import headgrad_ref  # tools/ on sys.path
    headgrad_ref.write_reference(my_attention, "refs/mine", shape=dict(B=2, T=7, D=24, H=4))
Command line (Debian's torch lives in the system Python):
    /usr/bin/python3 tools/headgrad_ref.py mymodule:my_attention \\
        --shape B=2,T=7,D=24,H=4 --out refs/mine
Each directory also gets case.yaml, the suite case that checks it.
"""
import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import pathlib
import sys
import warnings

import numpy as np

# Imported on import as a library. The command line imports it in main(), once
# its arguments are checked: starting torch takes a second and a half, and a
# mistyped option is then answered at once.
if __name__ != "__main__":
    import torch

LEVELS = ("mha", "core", "rope")
DTYPES = ("float64", "float32", "bfloat16", "float16")  # torch's dtypes of these names
# The 16-bit dtypes: .npy has no bfloat16 (its files are float32 holding bfloat16
# values), so their case.yaml names the dtype.
LOW_PRECISION = ("bfloat16", "float16")
# Keyword arguments a user function may ask for by naming them.
OFFERED_KWARGS = ("num_heads", "num_kv_heads", "head_dim", "causal", "positions", "q_offset", "mask", "window",
                  "softcap", "sinks")
# Every file a writer may produce: an overwrite removes exactly these.
FILE_STEMS = ("x", "wq", "wk", "wv", "wo", "q", "k", "v", "mask", "r", "positions", "out", "dx", "dwq",
              "dwk", "dwv", "dwo", "dq", "dk", "dv", "q_rot", "k_rot")
BIAS_STEMS = ("bq", "bk", "bv", "bo", "dbq", "dbk", "dbv", "dbo")  # mha level, bias=True
FILE_STEMS += BIAS_STEMS
# QK-norm and cross-attention (mha level): the gains, x_kv and their gradients.
QK_NORM_CROSS_STEMS = ("q_norm", "k_norm", "dq_norm", "dk_norm", "x_kv", "dx_kv")
FILE_STEMS += QK_NORM_CROSS_STEMS
# Attention sinks (mha and core levels): one logit per query head and its gradient.
SINK_STEMS = ("sinks", "dsinks")
FILE_STEMS += SINK_STEMS
SHAPE_KEYS = {
    "mha": ("B", "T", "Tq", "Tk", "D", "H", "Hkv", "d"),
    "core": ("B", "H", "Hkv", "T", "Tq", "Tk", "d"),
    "rope": ("B", "H", "T", "d"),
}


# A dim of --shape at most (torch indexes with int64; far past any real case).
MAX_DIM = 2**31 - 1


def _fail(message):
    raise ValueError("headgrad_ref: " + message)


class HeadgradRefWarning(UserWarning):
    """What the writer saw in the function (it breaks its declared causality, ignores a
    weight, returns NaN): the directory is written anyway, as the function computes it."""


def _check_hint(fn):
    """'headgrad check path/to/file.py:name', the command that localizes and names a bug in fn."""
    try:
        file = inspect.getsourcefile(fn)
    except TypeError:
        file = None
    name = getattr(fn, "__name__", "FUNCTION")
    return f"headgrad check {file or 'FILE.py'}:{name}"


def _finding(fn, message):
    level, frame = 2, sys._getframe(1)  # the warning points at the caller's line, outside this file
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    warnings.warn(HeadgradRefWarning(
        f"headgrad_ref: {message}; written anyway (the reference holds what the function computes). "
        f"To find out why, run `{_check_hint(fn)}`: it re-runs the function at other shapes and names known bugs."),
        stacklevel=level)


# ---------------------------------------------------------------- shapes

def resolve_shape(level, shape):
    """Check a shape dict for a level and fill what follows from it.

    mha: B, T, H required; D = H * d unless given, d = D / H unless given, Hkv = H
    unless given. core: B, d and Tq/Tk (or T for both) required; H optional (no H:
    3-D tensors), Hkv = H unless given. rope: B, T, d required, H optional.
    """
    if level not in LEVELS:
        _fail(f"level '{level}' is not one of {', '.join(LEVELS)}")
    s = dict(shape)
    for key, value in s.items():
        if key not in SHAPE_KEYS[level]:
            _fail(f"shape key '{key}' is not known at the {level} level "
                  f"(known: {', '.join(SHAPE_KEYS[level])})")
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            _fail(f"shape key '{key}' must be a positive integer, got {value!r}")
        s[key] = int(value)

    def need(*keys):
        for key in keys:
            if key not in s:
                _fail(f"shape needs '{key}' at the {level} level (got {', '.join(s) or 'nothing'})")

    if level == "mha":
        if "Tq" in s or "Tk" in s:  # cross-attention: x [B, Tq, D], x_kv [B, Tk, D]
            if "T" in s:
                _fail("shape gives T and Tq/Tk; cross-attention gives Tq and Tk, self-attention T")
            need("Tq", "Tk")
            s["T"] = s["Tq"]
        need("B", "T", "H")
        if "D" not in s and "d" not in s:
            _fail("shape needs 'D' or 'd' at the mha level")
        if "d" not in s:
            if s["D"] % s["H"]:
                _fail(f"D={s['D']} is not divisible by H={s['H']}; give the head width d")
            s["d"] = s["D"] // s["H"]
        s.setdefault("D", s["H"] * s["d"])
    elif level == "core":
        need("B", "d")
        if "T" in s:
            if "Tq" in s or "Tk" in s:
                _fail("shape gives T and Tq/Tk; give T (both) or Tq and Tk")
            s["Tq"] = s["Tk"] = s.pop("T")
        need("Tq", "Tk")
        if "H" not in s and "Hkv" in s:
            _fail("shape gives Hkv without H; 3-D q, k, v (no H) have no head axis")
    else:
        need("B", "T", "d")
        if s["d"] % 2:
            _fail(f"RoPE rotates pairs; d={s['d']} is odd")
    if "H" in s and level != "rope":
        s.setdefault("Hkv", s["H"])
        if s["Hkv"] > s["H"] or s["H"] % s["Hkv"]:
            _fail(f"H={s['H']} is not a multiple of Hkv={s['Hkv']} (each kv head serves H / Hkv query heads)")
    return s


def parse_shape(text):
    """'B=2,T=7,D=24,H=4' -> {'B': 2, 'T': 7, 'D': 24, 'H': 4}."""
    shape = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            _fail(f"--shape item '{item}' is not KEY=INTEGER")
        if int(value) > MAX_DIM:
            _fail(f"--shape item '{item}': a dim is at most {MAX_DIM}")
        shape[key.strip()] = int(value)
    return shape


def parse_positions(text):
    """'0,3,4' -> [T]; '0,3,4;1000,1002,1009' -> [B, T] (rows split by ';')."""
    rows = [[int(p) for p in row.split(",") if p.strip()] for row in text.split(";") if row.strip()]
    if not rows or len({len(r) for r in rows}) != 1:
        _fail(f"--positions '{text}' must be one row or rows of equal length split by ';'")
    return np.array(rows[0] if len(rows) == 1 else rows, dtype=np.int64)


def _check_positions(positions, B, T):
    """Positions as an int64 tensor [T] or [B, T]."""
    p = torch.as_tensor(np.asarray(positions))
    if p.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        _fail(f"positions must be integers, got {p.dtype}")
    p = p.to(torch.int64)
    if tuple(p.shape) not in ((T,), (B, T)):
        _fail(f"positions have shape {list(p.shape)}, expected [T] = [{T}] or [B, T] = [{B}, {T}]")
    return p


# ---------------------------------------------------------------- calling the user's function

def _call(fn, args, offered):
    """fn(*args, **the offered keyword arguments its signature names)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: offer nothing
        params = []
    takes_all = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    names = {p.name for p in params}
    kwargs = {k: v for k, v in offered.items() if takes_all or k in names}
    return fn(*args, **kwargs), kwargs


def _split_taps(result, level):
    """An mha function may return (out, {"q_rot": ..., "k_rot": ...})."""
    if isinstance(result, tuple):
        if level == "rope" or len(result) != 2 or not isinstance(result[1], dict):
            _fail("the function returned a tuple; only an mha or core function may, "
                  "as (out, {'q_rot': .., 'k_rot': ..})")
        unknown = set(result[1]) - {"q_rot", "k_rot"}
        if unknown:
            _fail(f"unknown taps {sorted(unknown)}; the taps are q_rot and k_rot")
        return result[0], result[1]
    return result, {}


def _check_tensor(name, t, shape, dtype):
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} is a {type(t).__name__}, expected a torch.Tensor")
    if tuple(t.shape) != tuple(shape):
        _fail(f"{name} has shape {list(t.shape)}, expected {list(shape)}")
    if t.dtype != dtype:
        _fail(f"{name} is {t.dtype}, expected {dtype} (the reference's dtype)")


def _non_finite(tensors):
    """'out holds 3 NaN, dq holds 1 Inf' for the tensors that are not finite; '' when all are."""
    parts = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            continue
        nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        if nan or inf:
            what = " and ".join(f"{n} {k}" for n, k in ((nan, "NaN"), (inf, "Inf")) if n)
            parts.append(f"{name} holds {what} (of {t.numel()})")
    return ", ".join(parts)


# ---------------------------------------------------------------- the writers

class _Draw:
    """Random tensors from one seeded generator, drawn in float64, then cast.

    Keeps what it drew, in order, so _Replay can hand the same values out again
    (the golden run: float64 tensors holding exactly the values the run in the
    dtype saw)."""

    def __init__(self, seed, dtype):
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype = dtype
        self.drawn = []

    def __call__(self, *shape, std=1.0, grad=True):
        t = (torch.randn(*shape, generator=self.gen, dtype=torch.float64) * std).to(self.dtype)
        self.drawn.append(t)
        return t.requires_grad_(grad)

    def uniform(self, *shape, low, high, grad=True):
        """U(low, high) from the same generator (the sinks)."""
        t = (torch.rand(*shape, generator=self.gen, dtype=torch.float64) * (high - low) + low).to(self.dtype)
        self.drawn.append(t)
        return t.requires_grad_(grad)


class _Replay:
    """The tensors a _Draw drew, in the same order, cast to float64 (golden/)."""

    def __init__(self, draw):
        self.dtype = torch.float64
        self.queue = list(draw.drawn)

    def __call__(self, *shape, std=1.0, grad=True):
        t = self.queue.pop(0)
        assert tuple(t.shape) == shape, "the replay asks for the draws in another order"
        return t.detach().to(torch.float64).requires_grad_(grad)

    def uniform(self, *shape, low, high, grad=True):
        return self(*shape, grad=grad)


def _prepare_dir(out_dir, overwrite):
    out = pathlib.Path(out_dir)
    if out.exists() and not out.is_dir():
        _fail(f"{out} exists and is not a directory")
    ours = [out / f"{stem}.npy" for stem in FILE_STEMS] + [out / "case.yaml"]
    ours += [out / "golden" / f"{stem}.npy" for stem in FILE_STEMS]
    present = [p for p in ours if p.exists()]
    if present and not overwrite:
        _fail(f"{out} already holds a reference ({present[0].name}); "
              "pass overwrite=True (--force) to replace it")
    for p in present:
        p.unlink()
    if (out / "golden").is_dir() and not any((out / "golden").iterdir()):
        (out / "golden").rmdir()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _save(out, tensors):
    out.mkdir(exist_ok=True)
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
            t = t.float()  # .npy has no bfloat16: float32 holds every bfloat16 value exactly
        arr = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        np.save(out / f"{name}.npy", np.ascontiguousarray(arr))


def _flow_map(items):
    """{'positions': {'offset': 1000}, 'q_offset': 4} -> '{positions: {offset: 1000}, q_offset: 4}'."""
    return "{" + ", ".join(f"{k}: {_flow_map(v) if isinstance(v, dict) else v}" for k, v in items.items()) + "}"


def _yaml_str(text):
    """A double-quoted YAML scalar (JSON's escapes are YAML's): any name or path reads back as written."""
    return json.dumps(str(text))


def _case_yaml(out, level, shape_keys, causal, rope, taps, dtype, suite_dir, bias=False, qk_norm=None,
               cross=False, window=None, softcap=None, sinks=False):
    """The suite case that checks this directory, to paste into a suite in suite_dir."""
    where = pathlib.Path(os.path.relpath(out, suite_dir)) if suite_dir is not None else out
    lines = [f"# A suite case that checks this directory ({dtype}); "
             "'reference' is relative to the suite file.",
             f"- name: {_yaml_str(out.name)}",
             "  compare: [per_head]",
             f"  reference: {_yaml_str(where.as_posix())}"]
    if level != "mha":
        lines.append(f"  level: {level}")
    if shape_keys:
        lines.append("  shape: {" + ", ".join(f"{k}: {v}" for k, v in shape_keys.items()) + "}")
    if level != "rope":
        # a core directory's mask.npy holds the whole mask, so the case is not causal on top; under
        # bottom_right it says so as well (the same mask again), since a window sits on that diagonal
        if causal == "bottom_right":
            lines.append("  causal: bottom_right")
        else:
            lines.append(f"  causal: {'true' if causal and level == 'mha' else 'false'}")
    if bias:
        lines.append("  bias: true")
    if qk_norm:  # the files cannot say the norm's settings
        lines.append("  qk_norm: " + _flow_map(qk_norm))
    if cross:
        lines.append("  cross: true")
    if window:  # the window and the cap live in the case (the tensors cannot say them); sinks.npy says sinks
        lines.append("  window: " + _flow_map({k: v for k, v in window.items() if v is not None}))
    if softcap:
        lines.append(f"  softcap: {softcap!r}")
    if sinks:
        lines.append("  sinks: true")
    if rope:
        lines.append("  rope: " + _flow_map(rope))
    if taps:
        lines.append("  taps: [" + ", ".join(taps) + "]")
    if dtype in LOW_PRECISION:  # bfloat16 files are float32: only the case can say bfloat16
        lines.append(f"  dtype: {dtype}")
    if dtype != "float64":
        lines.append("  # below float64 the tolerance is relative to the oracle's own rounding error,\n"
                     "  # against the float64 tensors in golden/ (no atol/rtol needed)")
    (out / "case.yaml").write_text("\n".join(lines) + "\n")


def _check_dependence(run, x, t_axis, keep, claim, what):
    """Output row i must change with token j of x exactly where keep[i, j] (keep None: everywhere).

    The writer cannot see inside the function, so it checks what it claims (causal,
    the mask) by changing one token at a time: every token up to 64, else the last.
    Returns what it saw when the claim does not hold, else None.
    """
    n = x.shape[t_axis]
    with torch.no_grad():
        base = run(x)
        for j in range(n) if n <= 64 else [n - 1]:
            bumped = x.clone()
            bumped.select(t_axis, j).add_(1.0)
            changed = run(bumped).ne(base).movedim(t_axis, 0).flatten(1).any(1)  # [rows]
            want = torch.ones_like(changed) if keep is None else keep[:, j]
            bad = (changed != want).nonzero()
            if len(bad):
                i = int(bad[0])
                return (f"output row {i} {'depends' if changed[i] else 'does not depend'} on {what} {j}, "
                        f"but {claim} says it {'should not' if changed[i] else 'should'}")
    return None


def _dtype_of(dtype):
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).replace("torch.", "")
    if dtype not in DTYPES:
        _fail(f"dtype '{dtype}' is not one of {', '.join(DTYPES)}")
    return dtype, getattr(torch, dtype)


def _check_qk_norm(qk_norm):
    """The qk_norm settings, complete: {axis, eps, gain} with the defaults head, 1e-6, w."""
    if qk_norm is None:
        return None
    if not isinstance(qk_norm, dict):
        _fail(f"qk_norm must be a dict {{axis, eps, gain}}, got {type(qk_norm).__name__}")
    unknown = set(qk_norm) - {"axis", "eps", "gain"}
    if unknown:
        _fail(f"qk_norm has unknown keys {sorted(unknown)} (known: axis, eps, gain)")
    n = {"axis": qk_norm.get("axis", "head"), "eps": qk_norm.get("eps", 1e-6), "gain": qk_norm.get("gain", "w")}
    if n["axis"] not in ("head", "model"):
        _fail(f"qk_norm axis must be head or model, got {n['axis']!r}")
    if n["gain"] not in ("w", "one_plus_w"):
        _fail(f"qk_norm gain must be w or one_plus_w, got {n['gain']!r}")
    if isinstance(n["eps"], bool) or not isinstance(n["eps"], (int, float)) or not 0 < n["eps"] <= 1:
        _fail(f"qk_norm eps must be a number in (0, 1], got {n['eps']!r}")
    n["eps"] = float(n["eps"])
    return n


def _check_window(window):
    """{"left": L, "right": R} (either may be absent or None: unbounded; not both), or (L, R)
    with None for an unbounded side; returns the dict with both keys."""
    if window is None:
        return None
    if isinstance(window, (tuple, list)):
        if len(window) != 2:
            _fail(f"window as a pair is (left, right), got {len(window)} values")
        window = {"left": window[0], "right": window[1]}
    if not isinstance(window, dict):
        _fail(f"window must be a dict {{left, right}}, got {type(window).__name__}")
    unknown = set(window) - {"left", "right"}
    if unknown:
        _fail(f"window has unknown keys {sorted(unknown)} (known: left, right)")
    w = {"left": window.get("left"), "right": window.get("right")}
    for key, value in w.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            _fail(f"window {key} must be an integer >= 0 (keys before/after the query's diagonal), got {value!r}")
        w[key] = int(value)
    if w["left"] is None and w["right"] is None:
        _fail("window needs left or right (an unbounded window is no window)")
    return w


def _check_softcap(softcap):
    """C > 0, finite (scores capped as C tanh(s / C)); None or 0: no cap."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (
            math.isfinite(softcap) and softcap > 0):
        _fail(f"softcap must be a finite number > 0 (scores become C tanh(s / C)), got {softcap!r}")
    return float(softcap)


def _causal_mode(causal, level):
    """causal as given -> None, "top_left" or "bottom_right" (True is top-left, PyTorch's is_causal)."""
    if causal is None or causal is False:
        return None
    if causal is True or causal == "top_left":
        return "top_left"
    if causal == "bottom_right":
        if level != "core":
            _fail("causal='bottom_right' is a core-level setting here (the writer's mha level is top-left)")
        return "bottom_right"
    _fail(f"causal must be True, False, 'top_left' or 'bottom_right', got {causal!r}")


def allowed_keys(Tq, Tk, causal=None, window=None):
    """bool [Tq, Tk], True where causal and the window allow key j for query i (None: every key).

    p_i = i + o, o = Tk - Tq under bottom_right, else 0; causal keeps j <= p_i, the window
    p_i - left <= j <= p_i + right (an absent bound is unbounded)."""
    if causal is None and window is None:
        return None
    o = Tk - Tq if causal == "bottom_right" else 0
    p = torch.arange(Tq)[:, None] + o
    j = torch.arange(Tk)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal is not None:
        keep &= j <= p
    if window is not None and window.get("left") is not None:
        keep &= j >= p - window["left"]
    if window is not None and window.get("right") is not None:
        keep &= j <= p + window["right"]
    return keep


def _check_taken(used, window, softcap, sinks):
    """A window, a cap or sinks the function does not take would be silently dropped: refused."""
    for name, given in (("window", window), ("softcap", softcap), ("sinks", sinks)):
        if given and name not in used:
            _fail(f"{name} was given but the function takes no '{name}' argument (it is passed as a keyword "
                  f"argument {name}=...; name it in the signature or take **kwargs)")


def parse_window(text):
    """'left=3,right=0' or '3,0' or 'left=3' -> dict."""
    w = {}
    items = [part.strip() for part in text.split(",")]
    if all("=" not in item for item in items) and len(items) == 2:
        items = [f"left={items[0]}", f"right={items[1]}"]
    for item in filter(None, items):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("left", "right"):
            _fail(f"--window item '{item}' is not left=L or right=R (or give L,R)")
        if not value.strip().isdigit() or int(value) > MAX_DIM:
            _fail(f"--window {key}={value!r}: expected an integer >= 0")
        w[key] = int(value)
    return _check_window(w)


def parse_softcap(text):
    try:
        value = float(text)
    except ValueError:
        _fail(f"--softcap {text!r}: expected a number > 0")
    return _check_softcap(value)


def parse_qk_norm(text):
    """'axis=model,eps=1e-6,gain=one_plus_w' -> dict."""
    n = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in ("axis", "eps", "gain"):
            _fail(f"--qk-norm item '{item}' is not axis=.., eps=.. or gain=..")
        if key == "eps":
            try:
                value = float(value)
            except ValueError:
                _fail(f"--qk-norm eps={value!r}: expected a number in (0, 1]")
        n[key] = value
    return _check_qk_norm(n)


def write_reference(fn, out_dir, shape, *, level="mha", seed=0, causal=True, dtype="float64",
                    positions=None, q_offset=0, rope=None, mask=None, suite_dir=None, overwrite=False,
                    bias=False, qk_norm=None, cross=False, window=None, softcap=None, sinks=False):
    """Run fn on random inputs and write a reference directory; returns its path.

    fn:        your PyTorch function (signatures in the module docstring).
    out_dir:   the directory to write (created; an existing reference needs overwrite).
    shape:     dict, e.g. {"B": 2, "T": 7, "D": 24, "H": 4, "Hkv": 2} (mha),
               {"B": 2, "H": 4, "Hkv": 2, "Tq": 5, "Tk": 7, "d": 8} (core).
    seed:      seeds every random tensor (inputs, weights, r).
    causal:    mha: what your function does (checked: a mismatch is written with a
               HeadgradRefWarning naming what was seen, as are an unused weight and NaN).
               core: writes the top-left causal mask [Tq, Tk] as mask.npy; "bottom_right"
               (core) the mask j <= i + Tk - Tq, passed to fn as causal="bottom_right" and
               written into case.yaml as causal: bottom_right (a window sits on that diagonal).
    dtype:     "float64", "float32", "bfloat16" or "float16". Below float64 the
               directory also gets golden/: fn run in float64 on the same input
               values (bfloat16 files are float32, as .npy has no bfloat16).
    positions: int64 [T] or [B, T], passed to fn. mha, and core at Tq = Tk: written
               as positions.npy. core at Tq != Tk: the keys' positions N + 0..Tk-1
               (one N for every row), written into case.yaml as {offset: N}.
    q_offset:  core only: queries sit at positions[..., :Tq] + q_offset (passed to fn,
               written into case.yaml); a decode-like case has Tq < Tk.
    rope:      the RoPE settings your function uses (theta, style, rotary_dim); not
               stored in .npy files, only written into case.yaml for the suite case.
    mask:      core only: bool [Tq, Tk] or [B, H, Tq, Tk], True = attend.
    suite_dir: the folder of the suite that will use the directory: case.yaml's
               'reference' is then relative to it (default: out_dir as given).
    bias:      mha only: fn takes bq, bk, bv, bo as keyword arguments (drawn after r)
               and the directory holds them and their gradients.
    qk_norm:   mha only: {"axis": "head"|"model", "eps": 1e-6, "gain": "w"|"one_plus_w"};
               fn takes q_norm, k_norm (drawn after the biases: g = 1 + 0.5 N(0, 1) per
               dim, w = g - 1 under one_plus_w) and may take the settings as qk_norm.
    cross:     mha only: shape gives Tq and Tk; fn takes x_kv [B, Tk, D] (drawn last).
               Not causal unless causal=True (then top-left: key j <= query i).
    window:    mha and core: {"left": L, "right": R} (either may be left out: unbounded),
               or (L, R) with None for an unbounded side. Key j is in query i's window iff
               p_i - L <= j <= p_i + R, p_i = i + Tk - Tq under causal "bottom_right", else i
               (Mistral's W keys: {"left": W - 1, "right": 0} with causal). fn must take it as
               the keyword argument window (the dict, both keys, None where unbounded); the
               dependence check expects it; case.yaml says window: {...}.
    softcap:   mha and core: C > 0; fn must take it as softcap (scores C tanh(s / C), after
               the scale, before the masks). Written into case.yaml as softcap: C.
    sinks:     mha and core: fn takes sinks [H] (one logit per query head, an extra softmax
               column with no value; drawn after every other input, U(-1, 3)), and the
               directory holds sinks.npy and dsinks.npy; case.yaml says sinks: true.
    A window, a cap or sinks given to a function whose signature does not name it (and that
    takes no **kwargs) is refused, as positions and the biases are.
    """
    if level == "rope":
        return write_rope_reference(fn, out_dir, shape, positions=positions, seed=seed, dtype=dtype,
                                    rope=rope, suite_dir=suite_dir, overwrite=overwrite)
    s = resolve_shape(level, shape)
    dtype_name, dt = _dtype_of(dtype)
    if q_offset and level != "core":
        _fail("q_offset is a core-level setting (queries at positions + q_offset, keys at positions)")
    if bias and level != "mha":
        _fail("bias is an mha-level setting (bq, bk, bv, bo on the projections)")
    qk_norm = _check_qk_norm(qk_norm)
    if (qk_norm or cross) and level != "mha":
        _fail("qk_norm and cross are mha-level settings (around the projections)")
    if cross and "Tq" not in s:
        _fail("cross=True needs the shape's Tq and Tk (x [B, Tq, D], x_kv [B, Tk, D])")
    if level == "mha" and not cross and "Tq" in s:
        _fail("an mha shape with Tq and Tk is cross-attention: pass cross=True (--cross)")
    if cross and (positions is not None or rope):
        _fail("RoPE is not defined for cross-attention (the query and key streams' positions are unrelated)")
    align = _causal_mode(causal, level)
    if level == "mha":
        causal = align is not None  # what the function is told, as before: a bool
    window, softcap, sinks = _check_window(window), _check_softcap(softcap), bool(sinks)
    feats = dict(window=window, softcap=softcap, sinks=sinks)

    def run(draw):
        if level == "mha":
            return _run_mha(fn, s, draw, causal, positions, bias, qk_norm, cross, **feats)
        return _run_core(fn, s, draw, causal, mask, positions, q_offset, align=align, **feats)

    draw = _Draw(seed, dt)
    tensors, case_shape, taps, rope_extra = run(draw)
    golden = run(_Replay(draw))[0] if dt != torch.float64 else None
    out = _prepare_dir(out_dir, overwrite)
    _save(out, tensors)
    if golden is not None:
        _save(out / "golden", golden)
    _case_yaml(out, level, case_shape, align if align == "bottom_right" else causal,
               dict(rope or {}, **rope_extra) or None, taps, dtype_name, suite_dir, bias, qk_norm, cross,
               window, softcap, sinks)
    return out


def _draw_qk_norm_cross(draw, s, qk_norm, cross):
    """The QK-norm gains (per dim: g = 1 + 0.5 N(0, 1); w = g, or g - 1 under
    one_plus_w), then x_kv: after every other draw, as headgrad draws them."""
    extra = {}
    if qk_norm:
        model = qk_norm["axis"] == "model"
        for name, n in (("q_norm", s["H"] * s["d"] if model else s["d"]),
                        ("k_norm", s["Hkv"] * s["d"] if model else s["d"])):
            w = draw(n, std=0.5, grad=False)
            if qk_norm["gain"] == "w":
                w = w + 1
            extra[name] = w.detach().requires_grad_()
    if cross:
        extra["x_kv"] = draw(s["B"], s["Tk"], s["D"])
    return extra


def _draw_sinks(draw, H):
    """sinks [H] ~ U(-1, 3), after every other input (as headgrad draws them): distinct per
    head, P_sink from about 0.01 to 0.97 against N(0, 1) scores."""
    return draw.uniform(H, low=-1.0, high=3.0)


def _run_mha(fn, s, draw, causal, positions, bias=False, qk_norm=None, cross=False, window=None, softcap=None,
             sinks=False):
    B, T, D, H, Hkv, d = (s[k] for k in ("B", "T", "D", "H", "Hkv", "d"))
    x = draw(B, T, D)
    wq = draw(H * d, D, std=D ** -0.5)
    wk, wv = draw(Hkv * d, D, std=D ** -0.5), draw(Hkv * d, D, std=D ** -0.5)
    wo = draw(D, H * d, std=(H * d) ** -0.5)
    r = draw(B, T, D, grad=False)
    offered = {"num_heads": H, "num_kv_heads": Hkv, "head_dim": d, "causal": causal}
    biases = {}
    if bias:  # after r, as headgrad draws them: a case without biases keeps its values
        biases = {"bq": draw(H * d, std=D ** -0.5), "bk": draw(Hkv * d, std=D ** -0.5),
                  "bv": draw(Hkv * d, std=D ** -0.5), "bo": draw(D, std=(H * d) ** -0.5)}
        offered.update(biases)
    extra = _draw_qk_norm_cross(draw, s, qk_norm, cross)
    if sinks:
        extra["sinks"] = _draw_sinks(draw, H)
    offered.update(extra)
    if qk_norm:
        offered["qk_norm"] = dict(qk_norm)
    if window:
        offered["window"] = dict(window)
    if softcap:
        offered["softcap"] = softcap
    pos = None
    if positions is not None:
        pos = _check_positions(positions, B, T)
        offered["positions"] = pos
    result, used = _call(fn, (x, wq, wk, wv, wo), offered)
    if pos is not None and "positions" not in used:
        _fail("positions were given but the function takes no 'positions' argument")
    if bias and set(biases) - set(used):
        _fail("bias=True but the function takes no " + ", ".join(sorted(set(biases) - set(used))) +
              " argument (biases are passed as keyword arguments bq, bk, bv, bo)")
    _check_taken(used, window, softcap, sinks)
    if set(extra) - set(used):
        _fail("the function takes no " + ", ".join(sorted(set(extra) - set(used))) + " argument (with qk_norm: "
              "keyword arguments q_norm, k_norm; with cross: x_kv)")
    out, taps = _split_taps(result, "mha")
    _check_tensor("out", out, (B, T, D), draw.dtype)
    # What the function does against what it claims (told causal or not, it is checked)
    def run(xx):
        return _split_taps(_call(fn, (xx, wq, wk, wv, wo), offered)[0], "mha")[0]
    if cross:  # query row i against the keys' tokens j of x_kv (top-left when causal)
        def run_kv(kv):
            return _split_taps(_call(fn, (x, wq, wk, wv, wo), dict(offered, x_kv=kv))[0], "mha")[0]
        keep = allowed_keys(T, s["Tk"], "top_left" if causal else None, window)
        claim = f"causal={causal}" + (f", window={window}" if window else "")
        seen = _check_dependence(run_kv, extra["x_kv"], 1, keep, claim + " (cross-attention)", "token of x_kv")
    else:
        keep = allowed_keys(T, T, "top_left" if causal else None, window)
        if keep is not None:
            keep |= torch.eye(T, dtype=torch.bool)  # row i reads token i through its query
        claim = f"causal={causal}" + (f", window={window}" if window else "")
        seen = _check_dependence(run, x, 1, keep, claim, "token of x")
    if seen:
        _finding(fn, seen)
    (out * r).sum().backward()
    leaves = (("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo), ("x", x), *biases.items(), *extra.items())
    unused = [name for name, w in leaves if w.grad is None]
    if unused:  # its gradient is zero: what the function computes
        _finding(fn, f"the output does not depend on {', '.join(unused)} (no gradient reached it): "
                     f"{', '.join('d' + n for n in unused)} written as zeros")
    grad = {n: (w.grad if w.grad is not None else torch.zeros_like(w)) for n, w in leaves}
    tensors = {"x": x, "wq": wq, "wk": wk, "wv": wv, "wo": wo, "r": r, "out": out, "dx": grad["x"],
               "dwq": grad["wq"], "dwk": grad["wk"], "dwv": grad["wv"], "dwo": grad["wo"]}
    for name, b in (*biases.items(), *extra.items()):
        tensors[name], tensors["d" + name] = b, grad[name]
    bad = _non_finite({k: tensors[k] for k in ("out", "dx", "dwq", "dwk", "dwv", "dwo",
                                               *("d" + n for n in (*biases, *extra)))})
    if bad:
        _finding(fn, bad)
    want = {"q_rot": (B, H, T, d), "k_rot": (B, Hkv, T, d)}
    for name, t in taps.items():
        _check_tensor(name, t, want[name], draw.dtype)
        tensors[name] = t
    if pos is not None:
        tensors["positions"] = pos
    case_shape = {"H": H}
    if Hkv != H:
        case_shape["Hkv"] = Hkv
    if d * H != D:
        case_shape["d"] = d
    return tensors, case_shape, [name for name in ("q_rot", "k_rot") if name in taps], {}


def _core_positions(positions, q_offset, B, Tq, Tk):
    """Key positions for a core RoPE case, and what case.yaml's rope block needs.

    The runner reads positions.npy only at Tq = Tk (one position per token, shared
    by queries and keys); at Tq != Tk it builds them from {offset: N}."""
    if positions is None:
        if q_offset:
            _fail("q_offset needs positions (the keys' positions; queries at positions[..., :Tq] + q_offset)")
        return None, {}, False
    if q_offset < 0:
        _fail(f"q_offset must be >= 0, got {q_offset}")
    pos = _check_positions(positions, B, Tk)
    extra = {"q_offset": int(q_offset)} if q_offset else {}
    if Tq == Tk:
        return pos, extra, True
    start = int(pos.flatten()[0])
    if not torch.equal(pos, (start + torch.arange(Tk)).expand_as(pos)):
        _fail(f"positions at Tq={Tq} != Tk={Tk} must be N + 0..Tk-1 for every row (headgrad builds them "
              "from {offset: N}); explicit positions need Tq = Tk")
    return pos, dict({"positions": {"offset": start}}, **extra), False


def _run_core(fn, s, draw, causal, mask, positions, q_offset, align=None, window=None, softcap=None, sinks=False):
    B, Tq, Tk, d = s["B"], s["Tq"], s["Tk"], s["d"]
    heads = (s["H"],) if "H" in s else ()
    kv_heads = (s["Hkv"],) if "H" in s else ()
    pos, rope_extra, pos_file = _core_positions(positions, q_offset, B, Tq, Tk)
    q, k, v = draw(B, *heads, Tq, d), draw(B, *kv_heads, Tk, d), draw(B, *kv_heads, Tk, d)
    r = draw(B, *heads, Tq, d, grad=False)
    extra = {"sinks": _draw_sinks(draw, s["H"] if heads else 1)} if sinks else {}
    if sinks and not heads:
        _fail("sinks are one logit per query head: the shape needs H (q [B, H, Tq, d])")
    if mask is not None:
        keep = torch.as_tensor(np.asarray(mask))
        if keep.dtype != torch.bool:
            _fail(f"mask must hold bools (True = attend), got {keep.dtype}")
        if tuple(keep.shape) not in ((Tq, Tk), (B, *heads, Tq, Tk)):
            _fail(f"mask has shape {list(keep.shape)}, expected [Tq, Tk] or "
                  + ("[B, H, Tq, Tk]" if heads else "[B, Tq, Tk] (q, k, v are [B, T, d])"))
        if not sinks and not keep.any(-1).all():  # with sinks the row's mass goes to the sink: out 0
            _fail("a query row of the mask attends no key (softmax over nothing)")
        if align == "bottom_right":
            keep = keep & allowed_keys(Tq, Tk, align)
    elif align is not None:
        keep = allowed_keys(Tq, Tk, align)
    else:
        keep = None
    offered = {"num_heads": s.get("H"), "num_kv_heads": s.get("Hkv"), "head_dim": d,
               "causal": "bottom_right" if align == "bottom_right" else causal, "mask": keep}
    offered.update(extra)
    if window:
        offered["window"] = dict(window)
    if softcap:
        offered["softcap"] = softcap
    # what the function is expected to attend: the mask (or causal) and the window
    probe = keep
    if window:
        wkeep = allowed_keys(Tq, Tk, align if mask is None else None, window)
        if align == "bottom_right" and mask is not None:  # the window sits on the bottom-right diagonal
            wkeep = allowed_keys(Tq, Tk, "bottom_right", window)
        probe = wkeep if keep is None else keep & wkeep
    if pos is not None:
        offered.update(positions=pos, q_offset=int(q_offset))
    result, used = _call(fn, (q, k, v), offered)
    if mask is not None and "mask" not in used:
        _fail("a mask was given but the function takes no 'mask' argument")
    if pos is not None and "positions" not in used:
        _fail("positions were given but the function takes no 'positions' argument")
    if q_offset and "q_offset" not in used:
        _fail("q_offset was given but the function takes no 'q_offset' argument")
    _check_taken(used, window, softcap, sinks)
    out, taps = _split_taps(result, "core")
    if taps and not heads:
        _fail("taps need a head axis (q_rot [B, H, Tq, d]); 3-D q, k, v have none")
    # the function masks as it does (given the mask or not): checked against mask.npy
    # (a [Tq, Tk] mask or none; a per-batch mask is not probed)
    claim = "the mask" if mask is not None else (
        f"causal={causal} ({'bottom-right' if align == 'bottom_right' else 'top-left'} aligned)")
    if window:
        claim += f" and window={window}"
    seen = None
    if probe is None or probe.dim() == 2:
        seen = _check_dependence(lambda vv: _split_taps(_call(fn, (q, k, vv), offered)[0], "core")[0], v,
                                 v.dim() - 2, probe, claim, "key")
    if seen:
        _finding(fn, seen)
    _check_tensor("out", out, (B, *heads, Tq, d), draw.dtype)
    (out * r).sum().backward()
    unused = [n for n, t in (("q", q), ("k", k), ("v", v)) if t.grad is None]
    if unused:
        _finding(fn, f"the output does not depend on {', '.join(unused)} (no gradient reached it): "
                     f"{', '.join('d' + n for n in unused)} written as zeros")
    if sinks and extra["sinks"].grad is None:
        _finding(fn, "the output does not depend on sinks (no gradient reached it): dsinks written as zeros")
    g = {n: (t.grad if t.grad is not None else torch.zeros_like(t))
         for n, t in (("q", q), ("k", k), ("v", v), *extra.items())}
    tensors = {"q": q, "k": k, "v": v, "r": r, "out": out, "dq": g["q"], "dk": g["k"], "dv": g["v"]}
    if sinks:
        tensors["sinks"], tensors["dsinks"] = extra["sinks"], g["sinks"]
    bad = _non_finite({n: tensors[n] for n in ("out", "dq", "dk", "dv", *(["dsinks"] if sinks else []))})
    if bad:
        _finding(fn, bad)
    if keep is not None:
        tensors["mask"] = keep
    if pos_file:
        tensors["positions"] = pos
    want = {"q_rot": (B, *heads, Tq, d), "k_rot": (B, *kv_heads, Tk, d)}
    for name, t in taps.items():
        _check_tensor(name, t, want[name], draw.dtype)
        tensors[name] = t
    return tensors, {}, [name for name in ("q_rot", "k_rot") if name in taps], rope_extra  # q, k, v give every dim


def write_rope_reference(fn, out_dir, shape, *, positions=None, seed=0, dtype="float64", rope=None,
                         suite_dir=None, overwrite=False):
    """RoPE level: fn(x, positions) -> out with x [B, T, d] (or [B, H, T, d]).

    positions: int64 [T] or [B, T] (default 0..T-1), written as positions.npy.
    rope:      the settings your function uses (theta, style, rotary_dim), for case.yaml.
    suite_dir: as for write_reference.
    Writes x, positions, r, out, dx (+ golden/ for float32).
    """
    s = resolve_shape("rope", shape)
    dtype_name, dt = _dtype_of(dtype)
    pos = _check_positions(np.arange(s["T"]) if positions is None else positions, s["B"], s["T"])
    draw = _Draw(seed, dt)
    tensors = _run_rope(fn, s, draw, pos)
    golden = _run_rope(fn, s, _Replay(draw), pos) if dt != torch.float64 else None
    out_path = _prepare_dir(out_dir, overwrite)
    _save(out_path, tensors)
    if golden is not None:
        _save(out_path / "golden", golden)
    _case_yaml(out_path, "rope", {}, False, rope, [], dtype_name, suite_dir)
    return out_path


def _run_rope(fn, s, draw, pos):
    lead = (s["B"], s["H"]) if "H" in s else (s["B"],)
    x = draw(*lead, s["T"], s["d"])
    r = draw(*lead, s["T"], s["d"], grad=False)
    result, used = _call(fn, (x, pos), {})
    out, _ = _split_taps(result, "rope")
    _check_tensor("out", out, x.shape, draw.dtype)
    (out * r).sum().backward()
    if x.grad is None:
        _fail("the output does not depend on x (no gradient reached it)")
    return {"x": x, "positions": pos, "r": r, "out": out, "dx": x.grad}


# ---------------------------------------------------------------- command line

def load_function(spec):
    """'module:function' or 'path/to/file.py:function' -> the function."""
    module_name, sep, fn_name = spec.rpartition(":")
    if not sep or not module_name or not fn_name:
        _fail(f"'{spec}' is not MODULE:FUNCTION (or FILE.py:FUNCTION)")
    if module_name.endswith(".py"):
        path = pathlib.Path(module_name)
        if not path.is_file():
            _fail(f"no file {path}")
        if str(path.resolve().parent) not in sys.path:
            # the file's own imports of its siblings, as `python3 FILE.py` and the
            # Python plugins' worker allow them
            sys.path.insert(0, str(path.resolve().parent))
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(pathlib.Path.cwd()))
        module = importlib.import_module(module_name)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        _fail(f"{module_name} has no function {fn_name}")
    return fn


def parse_rope(text):
    """'theta=10000,style=interleaved,rotary_dim=8' -> dict (for case.yaml)."""
    rope = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in ("theta", "style", "rotary_dim"):
            _fail(f"--rope item '{item}' is not theta=.., style=.. or rotary_dim=..")
        # typed here: case.yaml gets a number or a known word, never text that breaks it
        if key == "theta":
            try:
                theta = float(value)
            except ValueError:
                theta = float("nan")
            if not (math.isfinite(theta) and theta > 1):
                _fail(f"--rope theta={value!r}: expected a finite number > 1 (the RoPE base, e.g. 10000)")
            rope[key] = theta
        elif key == "style":
            if value not in ("interleaved", "half"):
                _fail(f"--rope style={value!r}: expected interleaved or half")
            rope[key] = value
        else:
            if not value.isdigit() or int(value) < 2 or int(value) % 2:
                _fail(f"--rope rotary_dim={value!r}: expected an even integer >= 2")
            rope[key] = int(value)
    return rope


def parse_seed(text):
    """--seed: an integer in [0, 2^63) (torch's generator and the suite's seed key take int64)."""
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed < 2**63:
        _fail(f"--seed: expected an integer in [0, 2^63), got {text!r}")
    return seed


def _one_line(e):
    text = " ".join(str(e).split())
    return text if len(text) <= 500 else text[:500] + "..."


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Write a headgrad reference directory from your PyTorch attention (docs/references.md).")
    parser.add_argument("function", help="MODULE:FUNCTION or FILE.py:FUNCTION")
    parser.add_argument("--shape", required=True,
                        help="e.g. B=2,T=7,D=24,H=4 (mha), B=2,H=4,Tq=5,Tk=7,d=8 (core), B=2,T=9,d=16 (rope)")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="directory to write")
    parser.add_argument("--level", choices=LEVELS, default="mha")
    parser.add_argument("--seed", default="0", help="an integer in [0, 2^63)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                        help="mha: what your function does (checked); "
                             "core: write a causal mask (default: on)")
    parser.add_argument("--positions", help="token positions: 0,3,4 ([T]) or 0,3,4;1000,1002,1009 ([B, T])")
    parser.add_argument("--q-offset", type=int, default=0,
                        help="core: queries at positions[..., :Tq] + Q, keys at positions (decode-like)")
    parser.add_argument("--rope",
                        help="RoPE settings your function uses (for case.yaml): theta=..,style=..,rotary_dim=..")
    parser.add_argument("--suite-dir", type=pathlib.Path,
                        help="folder of the suite that will use it "
                             "('reference' in case.yaml is relative to it)")
    parser.add_argument("--force", action="store_true", help="replace an existing reference in --out")
    parser.add_argument("--bias", action="store_true",
                        help="mha: the function takes bq, bk, bv, bo keyword arguments; write them and dbq..dbo")
    parser.add_argument("--qk-norm",
                        help="mha: QK-norm settings axis=head|model,eps=..,gain=w|one_plus_w; the function takes "
                             "q_norm, k_norm keyword arguments")
    parser.add_argument("--cross", action="store_true",
                        help="mha: cross-attention (shape Tq, Tk); the function takes x_kv")
    parser.add_argument("--bottom-right", action="store_true",
                        help="core: causal aligned bottom-right (key j <= i + Tk - Tq, a decode step): the "
                             "function gets causal='bottom_right', case.yaml says causal: bottom_right")
    parser.add_argument("--window",
                        help="sliding window left=L,right=R (either may be left out; or L,R): key j is in "
                             "query i's window iff p_i - L <= j <= p_i + R, p_i = i (+ Tk - Tq with "
                             "--bottom-right); the function takes window={'left': L, 'right': R}")
    parser.add_argument("--softcap", help="logit soft-cap C > 0 (scores C tanh(s / C) after the scale, before "
                                          "the masks); the function takes softcap=C")
    parser.add_argument("--sinks", action="store_true",
                        help="attention sinks: the function takes sinks [H] (one logit per query head, drawn "
                             "last, U(-1, 3)); sinks.npy and dsinks.npy are written")
    args = parser.parse_args(argv)
    try:
        # the arguments first, torch after (see the import at the top)
        shape = parse_shape(args.shape)
        resolve_shape(args.level, shape)
        if args.bottom_right and not args.causal:
            _fail("--bottom-right is a causal alignment; it cannot go with --no-causal")
        options = dict(level=args.level, seed=parse_seed(args.seed),
                       causal="bottom_right" if args.bottom_right else args.causal, dtype=args.dtype,
                       positions=parse_positions(args.positions) if args.positions else None,
                       q_offset=args.q_offset, rope=parse_rope(args.rope) if args.rope else None,
                       suite_dir=args.suite_dir, overwrite=args.force, bias=args.bias,
                       qk_norm=parse_qk_norm(args.qk_norm) if args.qk_norm else None, cross=args.cross,
                       window=parse_window(args.window) if args.window else None,
                       softcap=parse_softcap(args.softcap) if args.softcap else None, sinks=args.sinks)
        global torch
        import torch
        try:
            fn = load_function(args.function)
        except ValueError:
            raise
        except Exception as e:  # the user's module: any error while importing it
            _fail(f"cannot import {args.function}: {type(e).__name__}: {e}")
        out = write_reference(fn, args.out, shape, **options)
    except (ValueError, ImportError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except SystemExit as e:  # the user's code called sys.exit(): nothing was written
        print(f"error: headgrad_ref: {args.function} called sys.exit({e.code!r}); nothing was written",
              file=sys.stderr)
        return 2
    except Exception as e:  # the user's function raised, or torch refused the shape
        print(f"error: headgrad_ref: {args.function} failed: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        return 2
    print(f"wrote {out}; suite case in {out / 'case.yaml'}:")
    print((out / "case.yaml").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
