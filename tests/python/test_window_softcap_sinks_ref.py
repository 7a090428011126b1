#!/usr/bin/python3
"""Sliding windows, logit soft-capping and attention sinks in reference directories:
tools/headgrad_ref.py's window=, softcap=, sinks= (--window, --softcap, --sinks,
--bottom-right) end to end, and the committed references checked against a second
computation.

Usage: test_window_softcap_sinks_ref.py HEADGRAD_EXE   (meson passes the built program)
Needs PyTorch (Debian's python3-torch in /usr/bin/python3) for the writer; exits 77 (a
skip for meson) when torch cannot be imported, and says so.

The second computation is numpy in loop form, one (batch, head, query row) at a time:
the allowed keys listed from the definition (p_i = i + Tk - Tq under bottom_right, else
i; p_i - left <= j <= p_i + right), the cap C tanh(s / C), the sink in the softmax's
denominator, and the backward written out by hand (D_i = dO_i . O_i, ds = P (dP - D)
(1 - t^2), dsigma_h = -sum P_sink D), not by autograd. At the MHA level the projections,
RoPE and their backward (the inverse rotation) are written out as well.

1. The committed references (make_reference.py --cases window-softcap-sinks) against it:
   1e-12 in float64; the float32 one's golden/ from its float32 inputs.
2. The writer on a user's function (einsum, written apart from make_reference.py) at both
   levels: its files against it to 1e-12, sinks drawn last (the other inputs keep their
   values), case.yaml carrying window, softcap and sinks, and `headgrad run` passing.
3. A function whose signature lacks window, softcap or sinks is refused (ValueError, or
   exit 2 on the command line), as for positions and biases, and nothing is written.
4. headgrad export of a bottom-right decode step with a window writes causal: bottom_right
   and its directory passes its own suite.yaml.
"""
import math
import pathlib
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from torch_required import torch  # noqa: E402,F401  (skips the test, exit 77, where torch is absent)
import headgrad_main  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
REFS = REPO / "configs" / "refs"
sys.path.insert(0, str(REPO / "tools"))
import headgrad_ref  # noqa: E402

HEADGRAD = None  # set from argv in main
TOL = 1e-12


# ---------------------------------------------------------------- the second computation (numpy, loops)

def allowed(i, j, Tq, Tk, causal, window):
    """Key j for query row i, from the definition."""
    p = i + (Tk - Tq if causal == "bottom_right" else 0)
    if causal and j > p:
        return False
    if window and window.get("left") is not None and j < p - window["left"]:
        return False
    if window and window.get("right") is not None and j > p + window["right"]:
        return False
    return True


def loop_core(q, k, v, dout, *, causal=None, window=None, softcap=None, sinks=None, mask=None):
    """Forward and hand-written backward. q [B, H, Tq, d], k, v [B, Hkv, Tk, d], dout like q,
    mask None, [Tq, Tk] or [B, H, Tq, Tk] (True = attend), sinks [H] or None.
    Returns out, dq, dk, dv, dsinks."""
    B, H, Tq, d = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = 1.0 / math.sqrt(d)
    out, dq = np.zeros_like(q), np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    dsinks = np.zeros(H)
    for b in range(B):
        for h in range(H):
            kv = h // G
            for i in range(Tq):
                keys = [j for j in range(Tk) if allowed(i, j, Tq, Tk, causal, window)
                        and (mask is None or (mask[i, j] if mask.ndim == 2 else mask[b, h, i, j]))]
                s = {j: scale * float(q[b, h, i] @ k[b, kv, j]) for j in keys}
                t = {j: math.tanh(s[j] / softcap) if softcap else None for j in keys}
                c = {j: softcap * t[j] if softcap else s[j] for j in keys}
                logits = list(c.values()) + ([float(sinks[h])] if sinks is not None else [])
                if not logits:
                    continue  # no key, no sink: zeros
                m = max(logits)
                z = sum(math.exp(c[j] - m) for j in keys)
                if sinks is not None:
                    z += math.exp(float(sinks[h]) - m)
                P = {j: math.exp(c[j] - m) / z for j in keys}
                o = sum((P[j] * v[b, kv, j] for j in keys), np.zeros(v.shape[-1]))
                out[b, h, i] = o
                dO = dout[b, h, i]
                D = float(dO @ o)
                for j in keys:
                    dv[b, kv, j] += P[j] * dO
                    dc = P[j] * (float(dO @ v[b, kv, j]) - D)
                    ds = dc * (1.0 - t[j] ** 2) if softcap else dc
                    dq[b, h, i] += scale * ds * k[b, kv, j]
                    dk[b, kv, j] += scale * ds * q[b, h, i]
                if sinks is not None:
                    dsinks[h] -= math.exp(float(sinks[h]) - m) / z * D
    return out, dq, dk, dv, dsinks


def rope_np(x, positions, theta, style, rotary_dim, sign=1.0):
    """x [B, H, T, d], positions [B, T]; sign -1 rotates back (the rotation's transpose)."""
    r = rotary_dim
    w = theta ** (-2.0 * np.arange(r // 2) / r)
    phi = sign * positions[:, None, :, None].astype(np.float64) * w  # [B, 1, T, r/2]
    cos, sin = np.cos(phi), np.sin(phi)
    y = x.copy()
    ia = np.arange(0, r, 2) if style == "interleaved" else np.arange(r // 2)
    ib = ia + 1 if style == "interleaved" else ia + r // 2
    a, b_ = x[..., ia], x[..., ib]
    y[..., ia], y[..., ib] = a * cos - b_ * sin, a * sin + b_ * cos
    return y


def loop_mha(t, H, Hkv, *, causal, window=None, softcap=None, rope=None):
    """MHA forward and backward around loop_core; t holds the directory's arrays."""
    x, wq, wk, wv, wo, r = (t[n] for n in ("x", "wq", "wk", "wv", "wo", "r"))
    B, T, D = x.shape
    d = wq.shape[0] // H

    def heads(y, n):  # [B, T, n*d] -> [B, n, T, d]
        return y.reshape(B, T, n, d).transpose(0, 2, 1, 3)

    def flat(y):  # [B, n, T, d] -> [B, T, n*d]
        return y.transpose(0, 2, 1, 3).reshape(B, T, -1)

    q, k, v = heads(x @ wq.T, H), heads(x @ wk.T, Hkv), heads(x @ wv.T, Hkv)
    if rope:
        q, k = rope_np(q, t["positions"], **rope), rope_np(k, t["positions"], **rope)
    do = heads(r @ wo, H)
    o, dq, dk, dv, dsinks = loop_core(q, k, v, do, causal="top_left" if causal else None, window=window,
                                      softcap=softcap, sinks=t.get("sinks"))
    res = {"out": flat(o) @ wo.T, "dwo": np.einsum("btD,btE->DE", r, flat(o)), "dsinks": dsinks,
           "q_rot": q, "k_rot": k}
    if rope:
        dq, dk = rope_np(dq, t["positions"], sign=-1.0, **rope), rope_np(dk, t["positions"], sign=-1.0, **rope)
    dq, dk, dv = flat(dq), flat(dk), flat(dv)
    res.update(dwq=np.einsum("btE,btD->ED", dq, x), dwk=np.einsum("btE,btD->ED", dk, x),
               dwv=np.einsum("btE,btD->ED", dv, x), dx=dq @ wq + dk @ wk + dv @ wv)
    return res


def load_dir(directory, stems, up=False):
    t = {}
    for s in stems:
        f = directory / f"{s}.npy"
        if f.exists():
            a = np.load(f)
            t[s] = a.astype(np.float64) if up and a.dtype.kind == "f" else a
    return t


# ---------------------------------------------------------------- a user's functions (einsum)

def user_core(q, k, v, *, causal, mask=None, window=None, softcap=None, sinks=None):
    """Core attention written with einsum and a log-sum-exp that includes the sink."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    G = H // k.shape[1]
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = torch.einsum("bhid,bhjd->bhij", q, kk) * d ** -0.5
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    keep = torch.ones(Tq, Tk, dtype=torch.bool) if mask is None else mask
    o = Tk - Tq if causal == "bottom_right" else 0
    ii, jj = torch.meshgrid(torch.arange(Tq), torch.arange(Tk), indexing="ij")
    if causal:
        keep = keep & (jj <= ii + o)
    if window is not None and window["left"] is not None:
        keep = keep & (jj >= ii + o - window["left"])
    if window is not None and window["right"] is not None:
        keep = keep & (jj <= ii + o + window["right"])
    s = s.masked_fill(~keep, float("-inf"))
    sink = (sinks.view(1, H, 1, 1) if sinks is not None else torch.full((1, H, 1, 1), float("-inf"),
                                                                          dtype=q.dtype)).expand(B, H, Tq, 1)
    lse = torch.logsumexp(torch.cat([s, sink], -1), -1, keepdim=True)
    return torch.einsum("bhij,bhjd->bhid", torch.exp(s - lse), vv)


def user_mha(x, wq, wk, wv, wo, *, num_heads, num_kv_heads, head_dim, causal, window=None, softcap=None, sinks=None):
    B, T, D = x.shape
    H, Hkv, d = num_heads, num_kv_heads, head_dim
    q = torch.einsum("btD,hdD->bhtd", x, wq.view(H, d, D))
    k = torch.einsum("btD,hdD->bhtd", x, wk.view(Hkv, d, D))
    v = torch.einsum("btD,hdD->bhtd", x, wv.view(Hkv, d, D))
    o = user_core(q, k, v, causal=causal, window=window, softcap=softcap, sinks=sinks)
    return torch.einsum("bhtd,Dhd->btD", o, wo.view(D, H, d))


def no_window(q, k, v, *, causal, mask=None, softcap=None, sinks=None):
    return user_core(q, k, v, causal=causal, mask=mask, softcap=softcap, sinks=sinks)


def no_softcap(q, k, v, *, causal, mask=None, window=None, sinks=None):
    return user_core(q, k, v, causal=causal, mask=mask, window=window, sinks=sinks)


def no_sinks(x, wq, wk, wv, wo, *, num_heads, num_kv_heads, head_dim, causal, window=None, softcap=None):
    return user_mha(x, wq, wk, wv, wo, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                    causal=causal, window=window, softcap=softcap)


def assert_close(test, got, want, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    test.assertEqual(got.shape, want.shape, what)
    err = np.abs(got - want).max() if got.size else 0.0
    test.assertLessEqual(err, TOL, f"{what}: max |diff| {err:.3g}")


CORE_STEMS = ("q", "k", "v", "r", "mask", "sinks", "out", "dq", "dk", "dv", "dsinks")
MHA_STEMS = ("x", "wq", "wk", "wv", "wo", "r", "sinks", "positions", "out", "dx", "dwq", "dwk", "dwv", "dwo",
             "dsinks", "q_rot", "k_rot")


def check_core_dir(test, directory, *, causal, window=None, softcap=None, float32=False):
    t = load_dir(directory, CORE_STEMS, up=True)
    want = load_dir(directory / "golden", CORE_STEMS) if float32 else t
    out, dq, dk, dv, dsinks = loop_core(t["q"], t["k"], t["v"], t["r"], causal=causal, window=window,
                                        softcap=softcap, sinks=t.get("sinks"), mask=t.get("mask"))
    for name, got in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv), ("dsinks", dsinks)):
        if name in want:
            assert_close(test, want[name], got, f"{directory.name}/{name}")
    return t


def check_mha_dir(test, directory, H, Hkv, *, causal, window=None, softcap=None, rope=None):
    t = load_dir(directory, MHA_STEMS)
    res = loop_mha(t, H, Hkv, causal=causal, window=window, softcap=softcap, rope=rope)
    for name in ("out", "dx", "dwq", "dwk", "dwv", "dwo", "dsinks", "q_rot", "k_rot"):
        if name in t:
            assert_close(test, t[name], res[name], f"{directory.name}/{name}")


class CommittedReferences(unittest.TestCase):
    def test_mha_window_softcap_sinks_rope(self):
        d = REFS / "mha_B2_T11_D24_H6_Hkv2_d4_causal_window3_softcap_sinks_rope_float64"
        self.assertTrue((d / "sinks.npy").exists() and (d / "dsinks.npy").exists())
        check_mha_dir(self, d, 6, 2, causal=True, window={"left": 3, "right": 0}, softcap=0.75,
                      rope=dict(theta=500000.0, style="half", rotary_dim=4))

    def test_core_decode_window_sinks(self):
        d = REFS / "core_B2_H6_Hkv2_Tq3_Tk11_d8_decode_window3_sinks_float64"
        t = check_core_dir(self, d, causal="bottom_right", window={"left": 3})
        # the window sits on the bottom-right diagonal: row i reads keys i+5 .. i+8
        for i in range(3):
            self.assertEqual([j for j in range(11) if allowed(i, j, 3, 11, "bottom_right", {"left": 3})],
                             list(range(i + 5, i + 9)))
        self.assertIn("causal: bottom_right", (d / "case.yaml").read_text())
        self.assertGreater(np.ptp(t["sinks"]), 0.5)  # distinct per head

    def test_core_float32_empty_row(self):
        d = REFS / "core_B2_H6_Hkv2_Tq10_Tk12_d8_window2_1_softcap_sinks_emptyrow_float32"
        t = check_core_dir(self, d, causal=None, window={"left": 2, "right": 1}, softcap=0.75, float32=True)
        self.assertFalse(t["mask"][4].any())  # the fully masked row: all mass on the sink
        out, dq = np.load(d / "out.npy"), np.load(d / "dq.npy")
        self.assertEqual(np.abs(out[:, :, 4]).max(), 0.0)
        self.assertEqual(np.abs(dq[:, :, 4]).max(), 0.0)


def run_headgrad(suite):
    return subprocess.run([HEADGRAD, "run", str(suite)], capture_output=True, text=True, timeout=120)


def as_suite(tmp, case_text, plugins):
    """The writer's case.yaml once per plugin (a reference case compares one plugin)."""
    body = [line for line in case_text.splitlines() if not line.lstrip().startswith("#")]
    cases = []
    for plugin in plugins:
        text = "\n".join("  " + line for line in body).replace("compare: [per_head]", f"compare: [{plugin}]")
        cases.append(text.replace('- name: "', f'- name: "{plugin}-', 1))
    (tmp / "suite.yaml").write_text("suite: user\ncases:\n" + "\n".join(cases) + "\n")
    return tmp / "suite.yaml"


class WriterOnUserFunctions(unittest.TestCase):
    def test_core_decode_through_writer_and_headgrad(self):
        shape = dict(B=2, H=4, Hkv=2, Tq=4, Tk=9, d=8)
        w = {"left": 2, "right": None}
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            out = headgrad_ref.write_reference(user_core, tmp / "refs" / "dec", shape, level="core", seed=11,
                                               causal="bottom_right", window=w, softcap=1.5, sinks=True,
                                               suite_dir=tmp)
            case = (out / "case.yaml").read_text()
            for line in ("causal: bottom_right", "window: {left: 2}", "softcap: 1.5", "sinks: true"):
                self.assertIn(line, case)
            self.assertEqual(np.load(out / "sinks.npy").shape, (4,))
            check_core_dir(self, out, causal="bottom_right", window=w, softcap=1.5)
            res = run_headgrad(as_suite(tmp, case, ["per_head", "batched", "fused_sdpa"]))
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_mha_through_writer_and_headgrad(self):
        shape = dict(B=2, T=9, D=24, H=6, Hkv=3)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            plain = headgrad_ref.write_reference(user_mha, tmp / "plain", shape, seed=4)
            out = headgrad_ref.write_reference(user_mha, tmp / "refs" / "m", shape, seed=4,
                                               window=(2, 0), softcap=0.9, sinks=True, suite_dir=tmp)
            for stem in ("x", "wq", "wk", "wv", "wo", "r"):  # sinks are drawn last
                np.testing.assert_array_equal(np.load(plain / f"{stem}.npy"), np.load(out / f"{stem}.npy"))
            self.assertEqual(np.load(out / "dsinks.npy").shape, (6,))
            s = np.load(out / "sinks.npy")
            self.assertTrue(((s >= -1) & (s <= 3)).all())
            check_mha_dir(self, out, 6, 3, causal=True, window={"left": 2, "right": 0}, softcap=0.9)
            case = (out / "case.yaml").read_text()
            self.assertIn("window: {left: 2, right: 0}", case)
            res = run_headgrad(as_suite(tmp, case, ["per_head", "batched", "fused_sdpa"]))
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_float32_golden_agrees(self):
        shape = dict(B=1, H=2, Tq=5, Tk=5, d=4)
        with tempfile.TemporaryDirectory() as tmp:
            out = headgrad_ref.write_reference(user_core, pathlib.Path(tmp) / "f", shape, level="core", seed=2,
                                               dtype="float32", window={"right": 1}, causal=False, sinks=True)
            self.assertEqual(np.load(out / "golden" / "dsinks.npy").dtype, np.float64)
            check_core_dir(self, out, causal=None, window={"right": 1}, float32=True)


class Export(unittest.TestCase):
    def test_bottom_right_window_round_trips(self):
        """headgrad export of a decode step with a window writes causal: bottom_right (the
        window's anchor), and its suite.yaml passes on its own directory."""
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            (tmp / "s.yaml").write_text(
                "suite: s\ncases:\n  - {name: dec, level: core, causal: bottom_right, compare: [per_head, batched], "
                "shape: {B: 2, H: 4, Hkv: 2, Tq: 3, Tk: 11, d: 8}, window: {left: 3}, softcap: 0.75, sinks: true}\n")
            res = subprocess.run([HEADGRAD, "export", str(tmp / "s.yaml"), "--case", "dec", "--plugin", "batched",
                                  "--out", str(tmp / "e")], capture_output=True, text=True, timeout=120)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            suite = (tmp / "e" / "suite.yaml").read_text()
            self.assertIn("causal: bottom_right", suite)
            self.assertTrue((tmp / "e" / "sinks.npy").exists())
            res = run_headgrad(tmp / "e" / "suite.yaml")
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            t = load_dir(tmp / "e", CORE_STEMS)
            out = loop_core(t["q"], t["k"], t["v"], t["r"], causal="bottom_right", window={"left": 3},
                            softcap=0.75, sinks=t["sinks"], mask=t.get("mask"))[0]
            assert_close(self, t["out"], out, "exported out")


class Refusals(unittest.TestCase):
    CORE = dict(B=1, H=2, Tq=4, Tk=4, d=4)

    def test_missing_argument_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            with self.assertRaisesRegex(ValueError, "window was given but the function takes no 'window' argument"):
                headgrad_ref.write_reference(no_window, tmp / "a", self.CORE, level="core", window={"left": 1})
            with self.assertRaisesRegex(ValueError, "softcap was given but the function takes no 'softcap'"):
                headgrad_ref.write_reference(no_softcap, tmp / "b", self.CORE, level="core", softcap=2.0)
            with self.assertRaisesRegex(ValueError, "sinks was given but the function takes no 'sinks'"):
                headgrad_ref.write_reference(no_sinks, tmp / "c", dict(B=1, T=4, D=8, H=2), sinks=True)
            self.assertFalse(any(tmp.iterdir()), "nothing is written")
            # without a window the same function is written
            headgrad_ref.write_reference(no_window, tmp / "d", self.CORE, level="core")

    def test_bad_settings(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            for kw, msg in ((dict(window={}), "window needs left or right"),
                            (dict(window={"left": -1}), "window left must be an integer >= 0"),
                            (dict(window={"width": 3}), "unknown keys"),
                            (dict(softcap=0.0), "softcap must be a finite number > 0"),
                            (dict(softcap=float("inf")), "softcap must be a finite number > 0"),
                            (dict(causal="bottom_left"), "causal must be True, False")):
                with self.assertRaisesRegex(ValueError, msg):
                    headgrad_ref.write_reference(user_core, tmp / "x", self.CORE, level="core", **kw)
            with self.assertRaisesRegex(ValueError, "bottom_right' is a core-level setting"):
                headgrad_ref.write_reference(user_mha, tmp / "y", dict(B=1, T=4, D=8, H=2), causal="bottom_right")

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            mod = tmp / "mine.py"
            mod.write_text("import sys\nsys.path.insert(0, %r)\nfrom test_window_softcap_sinks_ref import "
                           "user_core, no_window\n" % str(pathlib.Path(__file__).parent))
            base = ["/usr/bin/python3" if pathlib.Path("/usr/bin/python3").exists() else sys.executable,
                    str(REPO / "tools" / "headgrad_ref.py"), "--level", "core", "--shape", "B=1,H=2,Tq=3,Tk=6,d=4"]
            res = subprocess.run(base + [f"{mod}:no_window", "--out", str(tmp / "a"), "--window", "left=1"],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(res.returncode, 2, res.stdout + res.stderr)
            self.assertIn("takes no 'window' argument", res.stderr)
            self.assertFalse((tmp / "a").exists())
            res = subprocess.run(base + [f"{mod}:user_core", "--out", str(tmp / "b"), "--bottom-right",
                                         "--window", "2,0", "--softcap", "3", "--sinks"],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            case = (tmp / "b" / "case.yaml").read_text()
            for line in ("causal: bottom_right", "window: {left: 2, right: 0}", "softcap: 3.0", "sinks: true"):
                self.assertIn(line, case)
            check_core_dir(self, tmp / "b", causal="bottom_right", window={"left": 2, "right": 0}, softcap=3.0)


if __name__ == "__main__":
    sys.exit(headgrad_main.main(globals()))
