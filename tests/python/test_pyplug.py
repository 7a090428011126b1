#!/usr/bin/python3
"""Python functions as headgrad plugins, end to end through the built headgrad.

Usage: test_pyplug.py HEADGRAD_EXE   (meson passes the built program)
Needs PyTorch (Debian's python3-torch in /usr/bin/python3); exits 77 (a skip for
meson) when torch cannot be imported, and says so.

1. `headgrad check FILE.py:FUNCTION`: a plain MHA passes; its merge without
   transpose fails, is named merge_without_transpose and localized (it
   disappears at T = 1 and H = 1); a Python exception fails its cases with
   the type, message and the user's file:line (exit 3); a function that
   cannot take a non-contiguous x fails exactly the transposed/sliced cases
   (so it was handed real strided views); a hang is killed by --timeout and
   the next cases still run (the worker is replaced); a function without
   `causal` is causal-only and localization says it could not run `causal off`.
   What check adds for a signature (through headgrad.check, served here): a
   function that names bq, bk, bv, bo is checked with biases (bias=False
   without), one that drops bo fails on dbo; the features of current models
   (window, softcap, sinks, q_norm/k_norm, x_kv): their cases and tensors,
   features=False, two seed bugs named; at the core level with a mask, the
   fully masked row and the decode step, and a cap applied after the mask
   named softcap_after_mask there.
2. A suite's `plugins:` block (a path relative to the suite), and its errors;
   `run -j 2` and `check -j 2` give the verdicts and values of -j 1.
3. headgrad.check from Python (served by this process: closures work) on
   verbatim excerpts of public code (fixtures/, each naming repo, path, commit
   and lines) through the module adapter: nanoGPT's CausalSelfAttention (packed
   blocked c_attn, with its biases), the book's MultiHeadAttention (separate
   projections, qkv_bias) and its Llama 3 GroupedQueryAttention (GQA, RoPE in
   the split-halves pairing), each passing as it is and failing with a seed
   bug put into its source by replacing a line, named as the C++ mutant is; a
   NeoX-style per-head packing (restated: GPT-NeoX lives in transformers, too
   large to fetch here) declared blocked is named qkv_packing_mismatch and
   passes declared interleaved, its packed bias included; nanoGPT declared
   interleaved is named qkv_packing_mismatch_reverse.
   gpt-oss's sdpa (learned sinks, sliding window, GQA) passes with the window
   and sinks cases check adds for its signature, and its seed bugs (the sink
   detached, the sink scaled, the window one key wider) are named
   sink_grad_missing, sink_scaled, window_off_by_one; as an nn.Module with a
   sinks Parameter through module_function(sinks=...) too; check -j 2 on its
   window case gives -j 1's verdict, diagnosis and values.
   gemma_pytorch's GemmaAttention (soft-cap, QK-norm 1 + w, the window as
   its local mask) passes, and with the mask added before the cap, or k left
   unnormalized, is named softcap_after_mask, qk_norm_missing_on_k.
4. An autograd.Function's own backward is what is checked (a wrong dV fails dv only).
5. The pytest example in docs/python.md runs and passes.
"""
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

from torch_required import torch  # noqa: E402,F401  (skips the test, exit 77, where torch is absent)

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(REPO / "tools" / "python"))
sys.path.insert(0, str(FIXTURES))
import headgrad  # noqa: E402
import excerpts  # noqa: E402
import functions  # noqa: E402  (fixtures/functions.py: the functions CheckCommand loads by path)
import headgrad_main  # noqa: E402
from headgrad.modules import pack_qkv  # noqa: E402

HEADGRAD = None


def run(*args, cwd=None, timeout=600):
    p = subprocess.run([HEADGRAD, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def cases(report):
    return {c["name"]: c for c in report["cases"]}


def failed(report):
    return [c for c in report["cases"] if c["status"] != "pass"]


class CheckCommand(unittest.TestCase):
    fixture = str(FIXTURES / "functions.py")

    def check(self, fn, *extra):
        with tempfile.TemporaryDirectory() as tmp:
            report = pathlib.Path(tmp) / "r.json"
            code, text = run("check", f"{self.fixture}:{fn}", "--json", report, *extra)
            return code, text, json.loads(report.read_text()) if report.exists() else None

    def test_plain_mha_passes(self):
        code, text, report = self.check("mha")
        self.assertEqual(code, 0, text)
        self.assertGreaterEqual(len(report["cases"]), 20)
        self.assertIn("sliced input", cases(report))
        self.assertIn("non-contiguous input[T=5,H=2]", cases(report))

    def test_merge_without_transpose_named_and_localized(self):
        code, text, report = self.check("merge_without_transpose")
        self.assertEqual(code, 1, text)
        c = cases(report)["closed-book"]
        self.assertEqual(c["diagnosis"]["best"], "merge_without_transpose", json.dumps(c["diagnosis"])[:2000])
        self.assertIn("disappears at T = 1 and H = 1", c["localization"]["sentence"])
        # where the bug cannot show, the cases pass
        self.assertEqual(cases(report)["heads, lengths, batches[B=2,T=5,H=1]"]["status"], "pass")

    def test_exception_names_type_message_and_line(self):
        code, text, report = self.check("raises")
        self.assertEqual(code, 3, text)
        line = next(i for i, l in enumerate(open(self.fixture), 1) if "no attention today" in l)
        self.assertIn(f"ValueError: no attention today (H=2) (at {self.fixture}:{line} in raises)", text)
        self.assertTrue(all(c["status"] == "error" for c in report["cases"]))

    def test_non_contiguous_inputs_are_views(self):
        code, text, report = self.check("flattens_x")
        self.assertEqual(code, 3, text)
        bad = sorted(c["name"] for c in failed(report))
        self.assertTrue(bad and all(n.startswith(("non-contiguous", "sliced")) for n in bad), bad)
        self.assertIn("view size is not compatible", text)

    def test_hang_is_killed_and_the_worker_replaced(self):
        code, text, report = self.check("hangs_at_b1_t5_h1", "--timeout", "4")
        self.assertEqual(code, 3, text)
        by = cases(report)
        self.assertEqual(by["heads, lengths, batches[B=1,T=5,H=1]"]["status"], "error")
        self.assertIn("did not finish within 4 s; killed", by["heads, lengths, batches[B=1,T=5,H=1]"]["cause"])
        self.assertEqual([name for name, c in by.items() if c["status"] != "pass"],
                         ["heads, lengths, batches[B=1,T=5,H=1]"])
        # after it, a fresh worker serves the other cases, the next one first
        self.assertEqual(by["heads, lengths, batches[B=1,T=5,H=2]"]["status"], "pass")
        self.assertEqual(by["heads, lengths, batches[B=1,T=17,H=1]"]["status"], "pass")
        self.assertEqual(by["float32"]["status"], "pass")

    def test_fixed_causal_variant_not_run(self):
        code, text, report = self.check("causal_only", "--causal")
        self.assertEqual(code, 1, text)
        names = cases(report)
        self.assertNotIn("not causal[T=4,H=1]", names)  # the suite leaves out what it cannot run
        loc = names["closed-book"]["localization"]["sentence"]
        self.assertIn("Could not run: causal off", loc)
        self.assertIn("disappears at T = 1", loc)

    def test_bad_function_spec(self):
        code, text = run("check", "nofile.py:fn")
        self.assertEqual(code, 2, text)
        self.assertIn("no file nofile.py", text)
        code, text = run("check", f"{self.fixture}:no_such_function")
        self.assertEqual(code, 3, text)
        self.assertIn("no_such_function", text)


class CasesFromTheSignature(unittest.TestCase):
    """What check adds for the arguments a function's signature names: biases, the features of
    current models. Through headgrad.check, served by this process (CheckCommand covers the
    command line's own loading of FILE.py:FUNCTION): the suite is built from the signature in
    headgrad either way, and no torch starts per check."""

    def check(self, fn, **options):
        result = headgrad.check(getattr(functions, fn), raise_on_failure=False, **options)
        return result.returncode, result.text, result.report

    def test_biases_when_the_signature_names_them(self):
        code, text, report = self.check("mha_bias")
        self.assertEqual(code, 0, text)
        self.assertTrue(all({"dbq", "dbk", "dbv", "dbo"} <= checked_tensors(c) for c in report["cases"]))
        code, text, report = self.check("mha_bias", bias=False)
        self.assertEqual(code, 0, text)
        self.assertFalse(any("dbq" in checked_tensors(c) for c in report["cases"]))
        # a function that takes bo and drops it: out, dx and dbo differ, dbo the gradient it never returned
        code, text, report = self.check("bo_dropped")
        self.assertEqual(code, 1, text)
        c = cases(report)["closed-book"]
        differ = {t["name"] for t in c["tensors"] if not t["allclose"]}
        self.assertIn("dbo", differ, json.dumps(c["tensors"])[:1500])
        self.assertNotIn("dbq", differ)
        # bias=True (--bias) on a function without them is refused, naming it
        code, text, _ = self.check("merge_without_transpose", bias=True)
        self.assertEqual(code, 2, text)
        self.assertIn("takes no bq, bk, bv, bo", text)

    def test_features_from_the_signature(self):
        # each feature whose arguments the signature names gets its cases, its tensors compared
        code, text, report = self.check("modern_mha", kv_heads=2)
        self.assertEqual(code, 0, text)
        by = cases(report)
        for name, tensors in (("window, W = 4 keys", set()), ("window, two-sided, not causal", set()),
                              ("softcap, scores at 3-5 C", set()), ("sinks", {"dsinks"}),
                              ("sinks, grouped kv heads", {"dsinks"}), ("window, softcap and sinks", {"dsinks"}),
                              ("qk_norm, per head", {"dq_norm", "dk_norm"}),
                              ("qk_norm, whole projection, gain 1 + w", {"dq_norm", "dk_norm"}),
                              ("qk_norm, grouped kv heads", {"dq_norm", "dk_norm"}),
                              ("cross, Tq != Tk", {"dx_kv"}), ("cross, more queries than keys", {"dx_kv"}),
                              ("cross, grouped kv heads", {"dx_kv"})):
            self.assertEqual(by[name]["status"], "pass", name)
            self.assertTrue(tensors <= checked_tensors(by[name]), (name, checked_tensors(by[name])))
        # only the features named: sinks_only gets the sinks cases, no other; --no-features none
        code, text, report = self.check("sinks_only")
        self.assertEqual(code, 0, text)
        feature_cases = [n for n in cases(report) if n.startswith(("window", "softcap", "sinks", "qk_norm", "cross"))]
        self.assertEqual(feature_cases, ["sinks"])
        code, text, report = self.check("modern_mha", features=False)
        self.assertEqual(code, 0, text)
        self.assertFalse([n for n in cases(report) if n.startswith(("window", "softcap", "sinks", "qk_norm", "cross"))])

    def test_feature_bugs_are_named(self):
        # a cap applied after the causal mask (masked keys leak at -C) and the QK-norm gain read as 1 + w
        for fn, case, bug in (("modern_mha_softcap_after_mask", "softcap, scores at 3-5 C", "softcap_after_mask"),
                              ("modern_mha_qk_norm_gain_convention", "qk_norm, per head", "qk_norm_gain_convention")):
            code, text, report = self.check(fn)
            self.assertEqual(code, 1, text)
            self.assertEqual(bugs_of(cases(report)[case]), [bug], json.dumps(cases(report)[case].get("diagnosis"))[:1500])
            # the cases without the feature pass
            self.assertEqual(cases(report)["closed-book"]["status"], "pass")

    def test_core_features_with_a_mask(self):
        # at the core level a function that takes `mask` also gets the fully masked row (zeros, or all
        # of it on the sink) and the bottom-right decode step (its window folded into the mask)
        code, text, report = self.check("modern_core", level="core", kv_heads=2)
        self.assertEqual(code, 0, text)
        by = cases(report)
        for name in ("window, decode step", "window, right bound only", "softcap, a fully masked row",
                     "sinks, a fully masked row", "sinks, grouped kv heads"):
            self.assertEqual(by[name]["status"], "pass", name)
        self.assertIn("dsinks", checked_tensors(by["sinks, a fully masked row"]))
        code, text, report = self.check("modern_core_softcap_after_mask", level="core")
        self.assertEqual(code, 1, text)
        c = cases(report)["softcap, a fully masked row"]
        self.assertEqual(bugs_of(c), ["softcap_after_mask"], json.dumps(c.get("diagnosis"))[:1500])
        self.assertIn("disappears at mask off and softcap off", c["localization"]["sentence"])


class SuitePlugins(unittest.TestCase):
    @staticmethod
    def write(tmp, caps, fn="mha"):
        glue = pathlib.Path(tmp) / "glue"
        glue.mkdir(exist_ok=True)
        (glue / "mine.py").write_text(f"import sys\nsys.path.insert(0, {str(FIXTURES)!r})\nfrom functions import {fn}\n")
        suite = pathlib.Path(tmp) / "suite.yaml"
        suite.write_text(textwrap.dedent(f"""\
            suite: python plugin
            plugins:
              mine: {{python: glue/mine.py:{fn}, capabilities: {caps}}}
            cases:
              - name: gqa
                compare: [mine, per_head]
                causal: true
                shape: {{B: 2, T: 5, D: 24, H: 6, Hkv: 2}}
              - name: gqa rope
                compare: [mine, batched]
                causal: true
                rope: {{theta: 10000, style: half, positions: {{generator: gapped, start: 1000}}}}
                shape: {{B: 2, T: 5, D: 24, H: 6, Hkv: 3}}
            """))
        return suite

    @classmethod
    def mixed_suite_runs(cls):
        """The suite of write() plus a failing case of a second function (kv_map_tile), run once at
        -j 1 (-v) and once at -j 2, each with a JSON report: {jobs: (exit code, log, report)}. Made
        on first use and shared by the tests below (each run starts its own Python workers)."""
        if getattr(cls, "_mixed_runs", None) is None:
            tmp = tempfile.TemporaryDirectory()
            cls.addClassCleanup(tmp.cleanup)
            suite = cls.write(tmp.name, "[mha, causal, gqa, rope]")
            text = suite.read_text() + textwrap.indent(textwrap.dedent("""\
                - name: tiled
                  compare: [tiled, per_head]
                  causal: true
                  shape: {B: 2, T: 5, D: 24, H: 6, Hkv: 2}
                """), "  ")
            text = text.replace("plugins:\n", "plugins:\n  tiled: {python: glue/mine.py:kv_map_tile, "
                                              "capabilities: [mha, causal, gqa, rope]}\n", 1)
            (pathlib.Path(tmp.name) / "glue" / "mine.py").write_text(
                f"import sys\nsys.path.insert(0, {str(FIXTURES)!r})\nfrom functions import mha, kv_map_tile\n")
            suite.write_text(text)
            cls._mixed_runs = {}
            for jobs in ("1", "2"):
                out = pathlib.Path(tmp.name) / f"j{jobs}.json"
                code, log = run("run", suite, "-j", jobs, "--json", out, *(["-v"] if jobs == "1" else []))
                cls._mixed_runs[jobs] = (code, log, json.loads(out.read_text()) if out.exists() else None)
        return cls._mixed_runs

    def test_suite_names_a_python_function(self):
        code, log, report = self.mixed_suite_runs()["1"]
        self.assertEqual(code, 1, log)
        self.assertIn("2 passed, 1 failed", log)
        by = cases(report)
        self.assertEqual((by["gqa"]["status"], by["gqa rope"]["status"]), ("pass", "pass"))
        self.assertEqual(by["gqa"]["lhs"], "mine")

    def test_bug_is_named_in_a_suite(self):
        code, log, report = self.mixed_suite_runs()["1"]
        self.assertEqual(code, 1, log)
        self.assertIn("reproduces kv_map_tile", log)
        self.assertEqual(bugs_of(cases(report)["tiled"]), ["kv_map_tile"])

    def test_parallel_jobs_give_the_serial_verdicts_and_values(self):
        # -j 2: two job workers, each starting its own Python worker for its sides (before the fix a
        # second job worker's sides found their worker's pipes closed); a failing case too, so that
        # the diagnosis is compared as well
        runs = self.mixed_suite_runs()
        code, log, _ = runs["2"]
        self.assertEqual(code, 1, log)
        self.assertIn("2 passed, 1 failed", log)
        reports = {jobs: report for jobs, (_, _, report) in runs.items()}
        for a, b in zip(reports["1"]["cases"], reports["2"]["cases"]):
            self.assertEqual((a["name"], a["status"]), (b["name"], b["status"]))
            self.assertEqual([(t["name"], t["max_abs"]) for t in a["tensors"]],
                             [(t["name"], t["max_abs"]) for t in b["tensors"]])
            self.assertEqual(bugs_of(a), bugs_of(b))
        self.assertEqual(bugs_of(reports["2"]["cases"][2]), ["kv_map_tile"])

    def test_check_in_parallel_jobs(self):
        # headgrad check -j 2 (this process's worker from describing the function is disowned by
        # each job worker, which starts its own): the serial verdicts
        verdicts = check_serial_and_parallel(self, f"{FIXTURES / 'functions.py'}:merge_without_transpose")
        self.assertEqual(verdicts["1"], verdicts["2"])
        self.assertIn(("closed-book", "fail", ["merge_without_transpose"]), [v[:3] for v in verdicts["2"]])

    def run_refused(self, fns, suite_text):
        """Runs a suite with a plugin that runs and one that cannot (exit 3): its cases by name."""
        with tempfile.TemporaryDirectory() as tmp:
            suite = self.write(tmp, "[mha]", fns)
            suite.write_text(textwrap.dedent(suite_text))
            out = pathlib.Path(tmp) / "r.json"
            code, text = run("run", suite, "--json", out)
            self.assertEqual(code, 3, text)
            return cases(json.loads(out.read_text()))

    def test_bias_capability_in_a_suite(self):
        # declared `bias`: a function that names bq..bo gets them (and is checked on dbq..dbo); one that
        # does not is told so, naming the arguments, instead of running without them
        by = self.run_refused("mha, kv_map_tile", """\
            suite: python biases
            plugins:
              mine: {python: glue/mine.py:mha, capabilities: [mha, causal, gqa, bias]}
              nobias: {python: glue/mine.py:kv_map_tile, capabilities: [mha, causal, gqa, bias]}
            defaults: {causal: true, bias: true, shape: {B: 2, T: 5, D: 24, H: 6, Hkv: 2}}
            cases:
              - {name: with biases, compare: [mine, per_head]}
              - {name: takes none, compare: [nobias, per_head]}
            """)
        self.assertEqual(by["with biases"]["status"], "pass")
        self.assertTrue({"dbq", "dbk", "dbv", "dbo"} <= checked_tensors(by["with biases"]))
        self.assertEqual(by["takes none"]["status"], "error")
        self.assertIn("kv_map_tile takes no bq, bk, bv, bo argument: it cannot run a case with biases",
                      by["takes none"]["cause"])

    def test_feature_capabilities_in_a_suite(self):
        # declared window, softcap, sinks: handed to a function that names them; one that does not is
        # told which argument it lacks instead of running without the feature
        by = self.run_refused("modern_mha, mha", """\
            suite: python features
            plugins:
              mine: {python: glue/mine.py:modern_mha, capabilities: [mha, causal, gqa, window, softcap, sinks]}
              plain: {python: glue/mine.py:mha, capabilities: [mha, causal, gqa, window]}
            defaults: {causal: true, shape: {B: 2, T: 11, D: 24, H: 6, Hkv: 2}}
            cases:
              - {name: gpt-oss-like, compare: [mine, per_head], window: {left: 3, right: 0}, softcap: 0.75, sinks: true}
              - {name: takes no window, compare: [plain, per_head], window: {left: 3, right: 0}}
            """)
        self.assertEqual(by["gpt-oss-like"]["status"], "pass")
        self.assertIn("dsinks", checked_tensors(by["gpt-oss-like"]))
        self.assertEqual(by["takes no window"]["status"], "error")
        self.assertIn("mha takes no 'window' argument: it cannot run a case with a sliding window",
                      by["takes no window"]["cause"])

    def test_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            code, text = run("run", self.write(tmp, "[mha, causal, gqaa]"))
            self.assertEqual(code, 2, text)
            self.assertRegex(text, r"suite.yaml:3:\d+: .*unknown capability 'gqaa' \(did you mean 'gqa'")
            code, text = run("run", self.write(tmp, "[mha, causal]"))
            self.assertEqual(code, 2, text)
            self.assertIn("gqa", text)  # the capability check names what is missing


def names_of(result):
    return {c["name"]: c for c in result.cases()}


def bugs_of(case):
    d = case.get("diagnosis") or {}
    return [d["best"]] if d.get("best") else []


fixture = excerpts.load


def check_serial_and_parallel(test, function, *args):
    """`headgrad check FUNCTION` at -j 1 and -j 2 (a failing one): per case its name, verdict, diagnosis
    and every tensor's max |difference|, by jobs."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in ("1", "2"):
            out = pathlib.Path(tmp) / f"j{jobs}.json"
            code, log = run("check", function, *args, "-j", jobs, "--json", out)
            test.assertEqual(code, 1, log)
            results[jobs] = [(c["name"], c["status"], bugs_of(c), [(t["name"], t["max_abs"]) for t in c["tensors"]])
                             for c in json.loads(out.read_text())["cases"]]
    return results


def checked_tensors(case):
    return {t["name"] for t in case["tensors"]}


class ModulesFromPython(unittest.TestCase):
    def assert_named(self, result, bug, disappears, case="closed-book"):
        self.assertFalse(result.passed, result.text)
        c = names_of(result)[case]
        self.assertEqual(bugs_of(c)[:1], [bug], json.dumps(c.get("diagnosis"))[:1500])
        self.assertIn(disappears, c["localization"]["sentence"])
        return c

    def test_nanogpt(self):
        # packed blocked c_attn WITH its biases, checked as it is: every case compares dbq..dbo
        def make(m):
            return headgrad.module_function(
                lambda D, H, Hkv, d: m.CausalSelfAttention(m.GPTConfig(block_size=64, n_embd=D, n_head=H,
                                                                       dropout=0.0, bias=True)), qkv="blocked")
        good = headgrad.check(make(fixture("nanogpt_attention")), causal=True)
        self.assertTrue(good.passed)
        closed = names_of(good)["closed-book"]
        self.assertTrue({"dbq", "dbk", "dbv", "dbo"} <= checked_tensors(closed), checked_tensors(closed))
        self.assertTrue(all({"dbq", "dbo"} <= checked_tensors(c) for c in good.cases()))
        merge = fixture("nanogpt_attention", ("y.transpose(1, 2).contiguous().view(B, T, C)",
                                              "y.contiguous().view(B, T, C)", 1))
        c = self.assert_named(headgrad.check(make(merge), causal=True, raise_on_failure=False),
                              "merge_without_transpose", "disappears at T = 1 and H = 1")
        self.assertIn("dbq", checked_tensors(c))
        scale = fixture("nanogpt_attention", ("(1.0 / math.sqrt(k.size(-1)))", "(1.0 / math.sqrt(C))", 1))
        self.assert_named(headgrad.check(make(scale), causal=True, raise_on_failure=False), "scale_model_dim", "H = 1")

    def test_course_mha(self):
        # separate projections, qkv_bias=True and out_proj's own bias: all four checked
        def make(m):
            return headgrad.module_function(lambda D, H, Hkv, d: m.MultiHeadAttention(D, D, 64, 0.0, H, qkv_bias=True))
        good = headgrad.check(make(fixture("rasbt_mha")), causal=True)
        self.assertTrue(good.passed)
        self.assertIn("dbv", checked_tensors(names_of(good)["closed-book"]))
        merge = fixture("rasbt_mha", ("context_vec = (attn_weights @ values).transpose(1, 2)",
                                      "context_vec = (attn_weights @ values)", 1))
        self.assert_named(headgrad.check(make(merge), causal=True, raise_on_failure=False),
                          "merge_without_transpose", "disappears at T = 1 and H = 1")

    def test_llama3_gqa_rope(self):
        def make(m):
            def call(module, x):
                T, d = x.shape[1], module.head_dim
                # compute_rope_params's table (angles twice over, split halves), in float64: the excerpt
                # rounds its frequencies to float32 (.float()), which float64 tolerances would rightly fail
                inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
                angles = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
                angles = torch.cat([angles, angles], dim=1)
                mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # as Llama3Model.forward
                return module(x, mask, angles.cos().to(x.dtype), angles.sin().to(x.dtype))
            return headgrad.module_function(lambda D, H, Hkv, d: m.GroupedQueryAttention(D, D, H, Hkv), call=call)
        good = fixture("rasbt_llama3_gqa")
        # the glue's table is the excerpt's own, to float32 rounding
        cos32, _ = good.compute_rope_params(head_dim=8, theta_base=10000, context_length=17)
        inv = 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
        ang = torch.arange(17, dtype=torch.float64)[:, None] * inv
        torch.testing.assert_close(cos32.double(), torch.cat([ang, ang], 1).cos(), rtol=0, atol=1e-6)
        rope = dict(theta=10000, style="half")
        self.assertTrue(headgrad.check(make(good), causal=True, kv_heads=2, rope=rope).passed)
        tiled = fixture("rasbt_llama3_gqa", ("repeat_interleave(self.group_size, dim=1)",
                                             "repeat(1, self.group_size, 1, 1)", 2))
        r = headgrad.check(make(tiled), causal=True, kv_heads=2, rope=rope, raise_on_failure=False)
        self.assertFalse(r.passed)
        gqa = [c for c in r.failed_cases() if c["name"].startswith("grouped kv heads")]
        self.assertTrue(gqa, r.text)
        self.assertEqual(bugs_of(gqa[0])[:1], ["kv_map_tile"], r.text[-3000:])
        self.assertIn("tile order", json.dumps(gqa[0]["diagnosis"]))
        # at G = 1 (every other case) the tiled mapping is the correct one
        self.assertEqual(names_of(r)["closed-book"]["status"], "pass")

    def test_packed_gqa_module_with_biases(self):
        # packed qkv + biases + GQA in one module (functions.py): passes as it is, every case with
        # dbq..dbo; the tiled kv mapping is named on the grouped cases, with the tile-order evidence
        import functions
        def make(bug):
            return headgrad.module_function(lambda D, H, Hkv, d: functions.PackedGqaAttention(D, H, Hkv, bug=bug),
                                            qkv="blocked", names={"qkv": "qkv", "o": "proj"})
        good = headgrad.check(make(""), causal=True, kv_heads=2)
        self.assertTrue(good.passed)
        self.assertTrue(all({"dbq", "dbk", "dbv", "dbo"} <= checked_tensors(c) for c in good.cases()))
        r = headgrad.check(make("kv_map_tile"), causal=True, kv_heads=2, raise_on_failure=False)
        gqa = [c for c in r.failed_cases() if c["name"].startswith("grouped kv heads")]
        self.assertTrue(gqa, r.text)
        for c in gqa:
            self.assertEqual(bugs_of(c)[:1], ["kv_map_tile"], r.text[-3000:])
            self.assertIn("dbk", checked_tensors(c))
            # localized as the C++ mutant is, the bias-off variant run too
            self.assertIn("Hkv = H (G = 1) and Hkv = 1", c["localization"]["sentence"])
            self.assertIn("the biases", c["localization"]["sentence"])
        self.assertIn("tile order", json.dumps(gqa[0]["diagnosis"]))
        self.assertTrue(all(c["name"].startswith("grouped kv heads") for c in r.failed_cases()))

    def test_packing_declared_wrong(self):
        # NeoX's query_key_value has a bias, packed per head like its rows: checked as it is
        from neox_attention import NeoXAttention
        neox = lambda D, H, Hkv, d: NeoXAttention(D, H)  # noqa: E731
        good = headgrad.module_function(neox, qkv="interleaved", names={"qkv": "query_key_value", "o": "dense"})
        r = headgrad.check(good, causal=True)
        self.assertTrue(r.passed)
        self.assertIn("dbk", checked_tensors(names_of(r)["closed-book"]))
        wrong = headgrad.module_function(neox, qkv="blocked", names={"qkv": "query_key_value", "o": "dense"})
        self.assert_named(headgrad.check(wrong, causal=True, raise_on_failure=False), "qkv_packing_mismatch", "H = 1")
        # the other direction: nanoGPT's c_attn split blocked, declared per head
        m = fixture("nanogpt_attention")
        reverse = headgrad.module_function(
            lambda D, H, Hkv, d: m.CausalSelfAttention(m.GPTConfig(block_size=64, n_embd=D, n_head=H, bias=True)),
            qkv="interleaved")
        self.assert_named(headgrad.check(reverse, causal=True, raise_on_failure=False),
                          "qkv_packing_mismatch_reverse", "H = 1")

    def test_pack_qkv_layouts(self):
        # blocked is cat; interleaved puts head h's q, k, v rows together (per kv group under GQA)
        H, Hkv, d, D = 4, 2, 3, 5
        wq, wk, wv = (torch.arange(n * D, dtype=torch.float64).view(n, D) + 1000 * i
                      for i, n in enumerate((H * d, Hkv * d, Hkv * d)))
        self.assertTrue(torch.equal(pack_qkv(wq, wk, wv, "blocked", H, Hkv, d), torch.cat([wq, wk, wv])))
        p = pack_qkv(wq, wk, wv, "interleaved", H, Hkv, d)
        group = 2 * d + 2 * d  # G = 2 query heads, then k, then v
        self.assertTrue(torch.equal(p[group:group + 2 * d], wq[2 * d:4 * d]))
        self.assertTrue(torch.equal(p[group + 2 * d:group + 3 * d], wk[d:2 * d]))
        self.assertTrue(torch.equal(p[group + 3 * d:group + 4 * d], wv[d:2 * d]))

    def test_biases_are_routed_when_given(self):
        # the adapter's output with headgrad's biases against the module loaded with the same parameters
        m = fixture("nanogpt_attention")
        g = torch.Generator().manual_seed(5)
        D, H, T = 12, 3, 4
        x = torch.randn(2, T, D, generator=g, dtype=torch.float64)
        wq, wk, wv, wo = (torch.randn(D, D, generator=g, dtype=torch.float64) / D ** 0.5 for _ in range(4))
        bq, bk, bv, bo = (torch.randn(D, generator=g, dtype=torch.float64) for _ in range(4))
        config = m.GPTConfig(block_size=64, n_embd=D, n_head=H, dropout=0.0, bias=True)
        fn = headgrad.module_function(lambda D, H, Hkv, d: m.CausalSelfAttention(config), qkv="blocked")
        self.assertIn("bq", inspect.signature(fn).parameters)  # found: every projection has a bias
        got = fn(x, wq, wk, wv, wo, num_heads=H, num_kv_heads=H, bq=bq, bk=bk, bv=bv, bo=bo)
        ref = m.CausalSelfAttention(config).double()
        ref.load_state_dict({"c_attn.weight": torch.cat([wq, wk, wv]), "c_attn.bias": torch.cat([bq, bk, bv]),
                             "c_proj.weight": wo, "c_proj.bias": bo, "bias": ref.bias})
        torch.testing.assert_close(got, ref(x), rtol=0, atol=1e-12)
        zeroed = fn(x, wq, wk, wv, wo, num_heads=H, num_kv_heads=H)
        ref.c_attn.bias.data.zero_()
        ref.c_proj.bias.data.zero_()
        torch.testing.assert_close(zeroed, ref(x), rtol=0, atol=1e-12)

    def test_interleaved_bias_packed_per_head(self):
        # NeoX's layout, rows and bias written out head by head here (not with pack_qkv)
        from neox_attention import NeoXAttention
        g = torch.Generator().manual_seed(7)
        D, H, T = 12, 3, 5
        d = D // H
        x = torch.randn(2, T, D, generator=g, dtype=torch.float64)
        wq, wk, wv, wo = (torch.randn(D, D, generator=g, dtype=torch.float64) / D ** 0.5 for _ in range(4))
        bq, bk, bv, bo = (torch.randn(D, generator=g, dtype=torch.float64) for _ in range(4))
        fn = headgrad.module_function(lambda D, H, Hkv, d: NeoXAttention(D, H), qkv="interleaved",
                                      names={"qkv": "query_key_value", "o": "dense"})
        got = fn(x, wq, wk, wv, wo, num_heads=H, num_kv_heads=H, bq=bq, bk=bk, bv=bv, bo=bo)
        heads = range(H)
        rows = torch.cat([w[h * d:(h + 1) * d] for h in heads for w in (wq, wk, wv)])
        bias = torch.cat([b[h * d:(h + 1) * d] for h in heads for b in (bq, bk, bv)])
        ref = NeoXAttention(D, H).double()
        ref.load_state_dict({"query_key_value.weight": rows, "query_key_value.bias": bias,
                             "dense.weight": wo, "dense.bias": bo})
        torch.testing.assert_close(got, ref(x), rtol=0, atol=1e-12)

    def test_bias_detection(self):
        m = fixture("nanogpt_attention")
        no_bias = headgrad.module_function(
            lambda D, H, Hkv, d: m.CausalSelfAttention(m.GPTConfig(block_size=64, n_embd=D, n_head=H, bias=False)))
        self.assertNotIn("bq", inspect.signature(no_bias).parameters)
        # the course's MHA with qkv_bias=False still has out_proj's bias: not every projection has one,
        # so it is checked without headgrad's biases (its own zeroed), and said so
        c = fixture("rasbt_mha")
        partial = headgrad.module_function(lambda D, H, Hkv, d: c.MultiHeadAttention(D, D, 64, 0.0, H))
        self.assertNotIn("bq", inspect.signature(partial).parameters)
        forced = headgrad.module_function(lambda D, H, Hkv, d: c.MultiHeadAttention(D, D, 64, 0.0, H), bias=True)
        x, w = torch.ones(1, 2, 8, dtype=torch.float64), torch.eye(8, dtype=torch.float64)
        b = torch.zeros(8, dtype=torch.float64)
        with self.assertRaisesRegex(ValueError, "has no bias for W_query, W_key, W_value"):
            forced(x, w, w, w, w, num_heads=2, num_kv_heads=2, bq=b, bk=b, bv=b, bo=b)

    def test_closure_and_autograd_function(self):
        import functions
        scale = {"s": 1.0}
        def closure(q, k, v, *, causal):
            return functions.core_autograd_function(q * scale["s"], k, v, causal=causal)
        self.assertTrue(headgrad.check(closure, level="core").passed)
        r = headgrad.check(functions.core_autograd_function_bad_dv, level="core", raise_on_failure=False)
        c = names_of(r)["closed-book"]
        differ = {t["name"] for t in c["tensors"] if not t["allclose"]}
        self.assertEqual(differ, {"dv"}, json.dumps(c["tensors"])[:1500])
        with self.assertRaises(AssertionError) as e:
            headgrad.check(functions.core_autograd_function_bad_dv, level="core")
        self.assertIn("dv", str(e.exception))


class GptOssSinksAndWindow(unittest.TestCase):
    """gpt-oss's sdpa (fixtures/gpt_oss_sdpa.py, verbatim): learned sinks and a sliding window, GQA."""

    def test_passes_as_it_is(self):
        import gpt_oss_glue
        r = headgrad.check(gpt_oss_glue.gpt_oss, causal=True, kv_heads=2)
        by = names_of(r)
        self.assertEqual(by["window, W = 4 keys"]["status"], "pass")
        for name in ("sinks", "sinks, grouped kv heads"):
            self.assertEqual(by[name]["status"], "pass")
            self.assertIn("dsinks", checked_tensors(by[name]))
        self.assertNotIn("softcap, scores at 3-5 C", by)  # sdpa has no cap: its glue takes no softcap

    def test_seed_bugs_named_as_the_mutants(self):
        import gpt_oss_glue
        for bug, case, only in (("sink_grad_missing", "sinks", {"dsinks"}), ("sink_scaled", "sinks", None),
                                ("window_off_by_one", "window, W = 4 keys", None)):
            r = headgrad.check(gpt_oss_glue.attention_with(bug), causal=True, raise_on_failure=False)
            c = names_of(r)[case]
            self.assertEqual(bugs_of(c)[:1], [bug], json.dumps(c.get("diagnosis"))[:1500])
            differ = {t["name"] for t in c["tensors"] if not t["allclose"]}
            if only:
                self.assertEqual(differ, only)
            # the cases without the feature pass
            self.assertEqual(names_of(r)["closed-book"]["status"], "pass", bug)

    def test_module_with_a_sinks_parameter(self):
        # module_function routes headgrad's sinks into the module's Parameter; the window reaches it through call
        import gpt_oss_glue

        def make(bug=""):
            def call(m, x, window=None):
                return m(x, gpt_oss_glue.sliding_window_of(window))
            return headgrad.module_function(lambda D, H, Hkv, d: gpt_oss_glue.SinkAttention(D, H, Hkv, bug),
                                            sinks="sinks", call=call)
        self.assertTrue({"sinks", "window"} <= set(inspect.signature(make()).parameters))
        r = headgrad.check(make(), causal=True, kv_heads=2)
        self.assertIn("dsinks", checked_tensors(names_of(r)["sinks, grouped kv heads"]))
        bad = headgrad.check(make("sink_grad_missing"), causal=True, raise_on_failure=False)
        self.assertEqual(bugs_of(names_of(bad)["sinks"])[:1], ["sink_grad_missing"])

    def test_parallel_jobs_give_the_serial_results(self):
        results = check_serial_and_parallel(self, f"{FIXTURES / 'gpt_oss_glue.py'}:gpt_oss_window_off_by_one",
                                            "--causal", "--filter", "window*")
        self.assertEqual(results["1"], results["2"])
        self.assertEqual(results["2"][0][:3], ("window, W = 4 keys", "fail", ["window_off_by_one"]))


class GemmaSoftcapAndQkNorm(unittest.TestCase):
    """gemma_pytorch's GemmaAttention (fixtures/gemma_attention.py, verbatim): Gemma 2's soft-cap, Gemma 3's
    QK-norm (gain 1 + weight), the window as its local mask, GQA."""

    def test_passes_and_seed_bugs_are_named(self):
        import gemma_glue
        r = headgrad.check(gemma_glue.gemma, kv_heads=2)
        by = names_of(r)
        for name in ("softcap, scores at 3-5 C", "softcap, not causal", "qk_norm, per head", "qk_norm, grouped kv heads",
                     "window, W = 4 keys", "window, two-sided, not causal"):
            self.assertEqual(by[name]["status"], "pass", name)
        self.assertTrue({"dq_norm", "dk_norm"} <= checked_tensors(by["qk_norm, per head"]))
        for bug, case, gone in (("softcap_after_mask", "softcap, scores at 3-5 C", "causal off and softcap off"),
                                ("qk_norm_missing_on_k", "qk_norm, per head", "disappears at qk_norm off")):
            bad = headgrad.check(gemma_glue.attention_with(bug), raise_on_failure=False)
            c = names_of(bad)[case]
            self.assertEqual(bugs_of(c)[:1], [bug], json.dumps(c.get("diagnosis"))[:1500])
            self.assertIn(gone, c["localization"]["sentence"])
            self.assertEqual(names_of(bad)["closed-book"]["status"], "pass", bug)


class DocExample(unittest.TestCase):
    def test_docs_python_example_runs(self):
        doc = (REPO / "docs" / "python.md").read_text()
        code = re.search(r"<!-- pytest example -->\s*```python\n(.*?)```", doc, re.S).group(1)
        with tempfile.TemporaryDirectory() as tmp:
            test = pathlib.Path(tmp) / "test_my_attention.py"
            test.write_text(code)
            env = dict(os.environ, PYTHONPATH=str(REPO / "tools" / "python"), HEADGRAD_EXE=HEADGRAD)
            p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                               cwd=tmp, capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("2 passed", p.stdout)


if __name__ == "__main__":
    os.environ["HEADGRAD_EXE"] = os.path.abspath(sys.argv[1])
    sys.exit(headgrad_main.main(globals()))
