"""nn.Module adapters: a module as an mha-level headgrad function.

    fn = module_function(lambda D, H, Hkv, d: MultiHeadAttention(D, D, ..., num_heads=H),
                         names={"q": "W_query", "k": "W_key", "v": "W_value", "o": "out_proj"})

fn(x, wq, wk, wv, wo, num_heads, num_kv_heads, head_dim, **kw) builds the module
for the shape (once per shape, from the factory), then calls it with headgrad's
weights in place of its parameters (torch.nn.utils.stateless.functional_call),
so the gradients reach wq, wk, wv and wo through the module's own code.

Weights are routed by parameter name; `names` maps the roles to the module's
Linear (or Conv1D) submodules or weight parameters:
  q, k, v, o     separate projections
  qkv, o         one packed projection, laid out as `qkv` says:
                 "blocked"      [q | k | v] rows, [(H + 2 Hkv) d, D] (nn.MultiheadAttention's
                                in_proj_weight, GPT-2 / nanoGPT's c_attn)
                 "interleaved"  per kv group: the group's G query heads, then its k head, then its
                                v head, d rows each ([q_h; k_h; v_h] per head when Hkv = H:
                                GPT-NeoX, Megatron checkpoints)
  in_out=True    weights stored [in, out] (GPT-2's Conv1D): transposed on the way in.
Without `names`, the common spellings are tried (q_proj/k_proj/v_proj/o_proj,
W_query/W_key/W_value/out_proj, c_attn/c_proj, in_proj_weight/out_proj,
query_key_value/dense). A module whose packed projection is split in the other
layout than declared computes something else: headgrad's catalog names that
bug qkv_packing_mismatch (declared blocked, split per head) or
qkv_packing_mismatch_reverse (declared interleaved, split blocked).

Biases: a module whose routed projections all have one (q, k, v and o, or qkv
and o) takes headgrad's bq, bk, bv, bo: its function names them, so `headgrad
check` runs every case with biases, routed like the weights (a packed qkv bias
packed in the declared layout, blocked or interleaved) and the module checked
as it is. bias=None (default) finds out by building the module once at D 16,
H 2, Hkv 2, d 8; bias=True or False says it. Without them (bias=False, or some
projection has no bias), and in a case without biases, the module runs with
its biases set to zeros (said once per module class on stderr when they are
never given).

call(module, x, **kw) runs the module (default module(x)); give it for modules
that take more than x, e.g. lambda m, x, positions: m(x, positions)[0]; it is
handed those of positions, causal, mask, window, softcap and x_kv it names
(the function's signature then names them too, so `headgrad check` adds the
window, softcap and cross cases).

Sinks: sinks="NAME" routes headgrad's sinks [H] into the module's parameter of
that name (gpt-oss's AttentionBlock.sinks); the function names `sinks`, so
`headgrad check` adds the sinks cases; a case without sinks sets it to -inf (no
sink column at all).
"""
import inspect
import sys

import torch
from torch.nn.utils import stateless

_AUTO = [
    {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"},
    {"q": "W_query", "k": "W_key", "v": "W_value", "o": "out_proj"},
    {"q": "query", "k": "key", "v": "value", "o": "out"},
    {"q": "wq", "k": "wk", "v": "wv", "o": "wo"},
    {"qkv": "c_attn", "o": "c_proj"},
    {"qkv": "in_proj_weight", "o": "out_proj"},
    {"qkv": "query_key_value", "o": "dense"},
    {"qkv": "qkv", "o": "proj"},
]
_warned = set()


def pack_qkv(wq, wk, wv, layout, num_heads, num_kv_heads, head_dim):
    """The packed [(H + 2 Hkv) d, D] weight in `layout` from separate wq, wk, wv ([out, in])."""
    if layout == "blocked":
        return torch.cat([wq, wk, wv], 0)
    if layout != "interleaved":
        raise ValueError(f"qkv layout '{layout}' is not 'blocked' or 'interleaved'")
    H, Hkv, d = num_heads, num_kv_heads, head_dim
    G = H // Hkv
    D = wq.shape[1]
    q = wq.reshape(Hkv, G * d, D)
    k = wk.reshape(Hkv, d, D)
    v = wv.reshape(Hkv, d, D)
    return torch.cat([q, k, v], 1).reshape((H + 2 * Hkv) * d, D)


def _param_name(module, role_target):
    """'c_attn' -> 'c_attn.weight' (a submodule), 'in_proj_weight' stays (a parameter)."""
    params = dict(module.named_parameters())
    if role_target in params:
        return role_target
    if role_target + ".weight" in params:
        return role_target + ".weight"
    return None


def _resolve_names(module, names):
    if names is not None:
        out = {}
        for role, target in names.items():
            if role not in ("q", "k", "v", "o", "qkv"):
                raise ValueError(f"names: unknown role '{role}' (q, k, v, o or qkv, o)")
            p = _param_name(module, target)
            if p is None:
                raise ValueError(f"names: {type(module).__name__} has no parameter or submodule '{target}' "
                                 f"(its parameters: {', '.join(n for n, _ in module.named_parameters())})")
            out[role] = p
        return out
    for candidate in _AUTO:
        resolved = {role: _param_name(module, t) for role, t in candidate.items()}
        if all(resolved.values()):
            return resolved
    raise ValueError(f"cannot tell which parameters of {type(module).__name__} are the q, k, v and output "
                     f"projections ({', '.join(n for n, _ in module.named_parameters())}); pass names={{...}}")


def _bias_of(weight_name):
    return weight_name[: -len("weight")] + "bias" if weight_name.endswith("weight") else None


def _missing_biases(module, roles):
    """The roles whose projection has no bias parameter."""
    params = dict(module.named_parameters())
    return [r for r, n in roles.items() if _bias_of(n) not in params]


def _detect_bias(factory, names):
    """Whether every routed projection of the module has a bias (built once at a small shape)."""
    try:
        m = factory(16, 2, 2, 8)
    except Exception as e:  # a factory with its own constraints: say how to decide
        print(f"headgrad: module_function could not build the module at D=16, H=2, Hkv=2, d=8 to look for "
              f"biases ({type(e).__name__}: {e}); checked without biases: pass bias=True to check them",
              file=sys.stderr)
        return False
    return not _missing_biases(m, _resolve_names(m, names))


CALL_KEYWORDS = ("positions", "causal", "mask", "window", "softcap", "x_kv")


def module_function(factory, names=None, qkv=None, in_out=False, call=None, any_head_dim=False, bias=None,
                    sinks=None):
    """An mha-level headgrad function that runs the module `factory(D, H, Hkv, d)` builds.

    any_head_dim: the module takes a head width d other than D / H (HF's head_dim):
    headgrad check then adds a case with d != D / H.
    bias: whether the module's projections take headgrad's biases (None: found out).
    sinks: the name of the module's sinks parameter [H], if it has one."""
    cache = {}
    if bias is None:
        bias = _detect_bias(factory, names)

    def run(x, wq, wk, wv, wo, num_heads, num_kv_heads, head_dim=None, **kw):
        D = x.shape[-1]
        head_dim = head_dim or wq.shape[0] // num_heads
        key = (D, num_heads, num_kv_heads, head_dim, x.dtype)
        if key not in cache:
            torch.manual_seed(0)
            m = factory(D, num_heads, num_kv_heads, head_dim)
            m = m.to(x.dtype).eval()  # eval: dropout off
            cache[key] = (m, _resolve_names(m, names))
        m, roles = cache[key]
        params = dict(m.named_parameters())
        if "qkv" in roles:
            layout = qkv or "blocked"
            routed = {roles["qkv"]: pack_qkv(wq, wk, wv, layout, num_heads, num_kv_heads, head_dim)}
        else:
            if qkv:
                raise ValueError(f"qkv='{qkv}' declared, but the module has separate q, k, v projections")
            routed = {roles["q"]: wq, roles["k"]: wk, roles["v"]: wv}
        routed[roles["o"]] = wo
        for n in list(routed):
            w = routed[n]
            if in_out:
                w = w.t()
            if tuple(w.shape) != tuple(params[n].shape):
                raise ValueError(f"{type(m).__name__}.{n} has shape {list(params[n].shape)}, headgrad's weight is "
                                 f"{list(w.shape)}" + ("" if in_out else " (stored [in, out]? pass in_out=True)"))
            routed[n] = w
        # headgrad's biases when the case has them (bq [H*d], bk, bv [Hkv*d], bo [D]), routed like the
        # weights; else every bias of the routed projections is zero
        given = {r: kw.get("b" + r) for r in ("q", "k", "v", "o")}
        if any(v is not None for v in given.values()):
            missing = _missing_biases(m, roles)
            if missing:
                where = ", ".join(roles[r].removesuffix(".weight") for r in missing)
                raise ValueError(f"{type(m).__name__} has no bias for {where}: it "
                                 "cannot take headgrad's biases (module_function(..., bias=False) checks it without)")
            if "qkv" in roles:  # one bias vector packed as the weight's rows are
                b = pack_qkv(given["q"][:, None], given["k"][:, None], given["v"][:, None], qkv or "blocked",
                             num_heads, num_kv_heads, head_dim)[:, 0]
                routed[_bias_of(roles["qkv"])] = b
            else:
                for r in ("q", "k", "v"):
                    routed[_bias_of(roles[r])] = given[r]
            routed[_bias_of(roles["o"])] = given["o"]
        if sinks is not None:
            if sinks not in params:
                raise ValueError(f"sinks='{sinks}': {type(m).__name__} has no such parameter "
                                 f"({', '.join(params)})")
            given_sinks = kw.get("sinks")
            routed[sinks] = given_sinks if given_sinks is not None else torch.full_like(params[sinks], float("-inf"))
        # a case without biases (or a module that is not handed them): its own biases zeroed
        biases = [b for b in (_bias_of(n) for n in list(routed)) if b and b in params and b not in routed]
        for b in biases:
            routed[b] = torch.zeros_like(params[b])
        if biases and not bias and type(m) not in _warned:
            _warned.add(type(m))
            why = "not every projection has one" if _missing_biases(m, roles) else "bias=False"
            print(f"headgrad: {type(m).__name__} has biases ({', '.join(biases)}): checked with them zeroed "
                  f"({why})", file=sys.stderr)
        if call is None:
            args, kwargs = (x,), {}
        else:
            wanted = inspect.signature(call).parameters
            args, kwargs = (m, x), {k: v for k, v in kw.items() if k in wanted}
        if call is None:
            out = stateless.functional_call(m, routed, args)
        else:
            out = _with_params(m, routed, lambda: call(*args, **kwargs))
        if isinstance(out, tuple) and not (len(out) == 2 and isinstance(out[1], dict)):
            out = out[0]  # modules that return (out, attention weights, ...)
        return out

    run.__name__ = getattr(factory, "__name__", "module")
    if run.__name__ == "<lambda>":
        run.__name__ = "module_function"
    run.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("x", "wq", "wk", "wv", "wo")]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in ("num_heads", "num_kv_heads") + ("head_dim",) * any_head_dim]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in ("bq", "bk", "bv", "bo") if bias]
        + [inspect.Parameter("sinks", inspect.Parameter.KEYWORD_ONLY, default=None)] * (sinks is not None)
        + ([inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
            for n in inspect.signature(call).parameters if n in CALL_KEYWORDS]
           if call is not None else []))
    return run


def _with_params(module, routed, thunk):
    """thunk() with the module's parameters replaced (functional_call around a custom call)."""
    class _Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = module

        def forward(self):
            return thunk()

    return stateless.functional_call(_Wrap(), {"m." + k: v for k, v in routed.items()}, ())
