"""headgrad from Python: check your PyTorch attention with headgrad.

    import headgrad
    headgrad.check(my_attention, level="mha", causal=True)   # AssertionError with the report on failure

    # an nn.Module, built per shape, headgrad's weights routed in by name
    fn = headgrad.module_function(lambda D, H, Hkv, d: MyAttention(D, H), qkv="blocked",
                                  names={"qkv": "c_attn", "o": "c_proj"})
    headgrad.check(fn, causal=True)

The worker that runs functions for `headgrad check FILE.py:FUNCTION` and
suites' `plugins:` blocks is `python3 -m headgrad.worker`.
"""
__all__ = ["check", "CheckResult", "module_function"]


def __getattr__(name):  # imported on first use: `python3 -m headgrad.worker` loads only the worker
    if name in ("check", "CheckResult"):
        from headgrad import _check
        return getattr(_check, name)
    if name == "module_function":
        from headgrad.modules import module_function
        return module_function
    raise AttributeError(f"module 'headgrad' has no attribute {name!r}")
