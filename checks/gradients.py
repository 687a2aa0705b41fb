"""Can it be trained? Gradients through a learner's function, and why not.

Chapter 14 trains through the learner's own forward pass: chapter 12's `model_forward`, the block
of chapter 11 it calls, and the pieces of chapters 02-10 under it. A function whose values are
right can still stop training: it runs under `torch.no_grad()` or `torch.inference_mode()`, cuts
the graph (`.detach()`, `.data`, a tensor rebuilt with `torch.tensor(...)`, NumPy), changes in
place a parameter or a tensor the backward pass needs, or gives gradients that are inf or NaN.

`trace(fn, args, leaves)` runs `fn(*args)` with gradients on, watching every call of the
learner's code under it (`sys.setprofile`), then one backward pass to `leaves`, and returns a
`Cut` (None when every leaf gets a finite, non-zero gradient and no function of the learner's
drops it): the cause, the learner's function at fault and its chapter (read from the notebook its
code came from: borrowing compiles a cell as "<12_lm_head_logits.ipynb: cell model_forward>"),
the construct in its source that does it (`.detach()`, ...), and the leaves without a gradient.

`probe(name, fn)` does that for a function the course knows by name (`model_forward`,
`rms_norm`, `apply_rope`, ...), on tiny inputs of its own; `PROBED` lists them.

The learner's code is every frame whose file is not torch's, the course's or Python's own.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import os
import re
import sys
import sysconfig
import textwrap
from collections.abc import Callable, Sequence

import torch

from .config import ModelConfig
from .i18n import N_
from .mistakes import Mistake

# Causes, in the words of the checks that tell them.
NO_GRAD = "no_grad"                # ran with gradient tracking off (no_grad, inference_mode)
CUT = "cut"                        # the graph cut (.detach(), .data, torch.tensor(...), NumPy)
IN_PLACE = "in_place"              # a parameter, or a tensor the backward needs, changed in place
NOT_FINITE = "not_finite"          # gradients inf or NaN
ZERO = "zero"                      # a gradient that is zero everywhere

_NOT_LEARNERS = tuple(os.path.dirname(p) + os.sep for p in (torch.__file__, __file__)) + tuple(
    {sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})
# Borrowing compiles a notebook's cells as "<12_lm_head_logits.ipynb: cell model_forward>".
_CELL = re.compile(r"<(?:.*\s)?(\d\d)_[^:>]*\.ipynb[:>]")
_GRAD_MODE_FILES = ("_contextlib.py", "grad_mode.py")


@dataclasses.dataclass
class Cut:
    """Why gradients do not flow: `cause` (one of the causes above), the learner's `function` at
    fault and its `chapter` ("08"; None when its code is not from a chapter's notebook), the
    `construct` in its source that does it ("`.detach()`"; "" when none is found), and the
    leaves (`names`) without a usable gradient."""

    cause: str
    function: str
    chapter: str | None = None
    construct: str = ""
    names: list[str] = dataclasses.field(default_factory=list)

    def where(self) -> str:
        """"`apply_rope` (chapter 08)", or "`apply_rope`" when the chapter is unknown."""
        from .i18n import _

        if self.chapter is None:
            return f"`{self.function}`"
        return _("`{function}` (chapter {chapter})").format(function=self.function,
                                                           chapter=self.chapter)

    def detail(self) -> str:
        """One clause: where, and what, in the reader's language."""
        from .i18n import _

        text = {NO_GRAD: _("{where} runs with gradient tracking off"),
                CUT: _("{where} cuts the graph"),
                IN_PLACE: _("{where} changes in place a tensor that autograd needs"),
                NOT_FINITE: _("gradients through {where} are inf or NaN"),
                ZERO: _("gradients through {where} are zero")}[self.cause].format(
                    where=self.where())
        if self.construct:
            text += f" ({self.construct})"
        if self.names and self.cause in (CUT, NOT_FINITE, ZERO):
            shown = ", ".join(self.names[:3]) + (", ..." if len(self.names) > 3 else "")
            text += _(": {names}").format(names=shown)
        return text


# --------------------------------------------------------------------------------------------
# Whose code a frame runs


def _is_learners(code) -> bool:
    name = code.co_filename
    return not (name.startswith(_NOT_LEARNERS) or name.startswith("<frozen") or
                code.co_name.startswith("<"))


def chapter_of(code) -> str | None:
    """The chapter whose notebook a function's code came from ("08"), else None."""
    found = _CELL.match(code.co_filename)
    return found.group(1) if found else None


def _tensors(value, depth: int = 0) -> list[torch.Tensor]:
    """The tensors in an argument: itself, or inside dicts, lists and tuples (three levels:
    params["layers"][i]["wqkv"])."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth < 3 and isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, depth + 1)]
    if depth < 3 and isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, depth + 1)]
    return []


def _float_outputs(value) -> list[torch.Tensor]:
    return [t for t in _tensors(value) if t.is_floating_point()]


@dataclasses.dataclass
class _Call:
    code: object
    grad: bool
    inference: bool
    decorated: bool            # a torch grad-mode wrapper sits between it and its caller
    parent: int | None         # the learner's call that called it
    inputs: set                # ids of the tensors it was given
    takes_grad: bool           # a floating input required grad
    cut: bool = False          # returned floating tensors none of which requires grad
    off_inside: bool = False   # called something with gradients off (a `with` block of its own)
    used: list = dataclasses.field(default_factory=list)   # builtins it called (`detach`, ...)


@contextlib.contextmanager
def _watching():
    """Records every call of the learner's code made inside, in call order."""
    calls: list[_Call] = []
    open_calls: dict[int, int] = {}
    previous = sys.getprofile()

    def hook(frame, event, arg):
        code = frame.f_code
        caller = open_calls.get(id(frame) if event == "c_call" else id(frame.f_back))
        if caller is not None and event in ("call", "c_call"):
            if calls[caller].grad and not torch.is_grad_enabled():
                calls[caller].off_inside = True
            if event == "c_call" and len(calls[caller].used) < 64:
                calls[caller].used.append(getattr(arg, "__name__", ""))
        if event in ("call", "return") and _is_learners(code):
            if event == "call":
                parent, decorated, up = None, False, frame.f_back
                while up is not None:
                    if id(up) in open_calls:
                        parent = open_calls[id(up)]
                        break
                    decorated |= up.f_code.co_filename.endswith(_GRAD_MODE_FILES)
                    up = up.f_back
                given = [t for v in frame.f_locals.values() for t in _tensors(v)]
                open_calls[id(frame)] = len(calls)
                calls.append(_Call(code, torch.is_grad_enabled(),
                                   torch.is_inference_mode_enabled(), decorated, parent,
                                   {id(t) for t in given},
                                   any(t.requires_grad for t in given if t.is_floating_point())))
            elif id(frame) in open_calls:
                call = calls[open_calls.pop(id(frame))]
                out = _float_outputs(arg)
                call.cut = bool(call.takes_grad and out and
                                not any(t.requires_grad for t in out))
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(hook)
    try:
        yield calls
    finally:
        sys.setprofile(previous)


# --------------------------------------------------------------------------------------------
# What in a function's source does it


_CONSTRUCTS = {
    NO_GRAD: [("no_grad", "`torch.no_grad()`"), ("inference_mode", "`torch.inference_mode()`"),
              ("set_grad_enabled", "`torch.set_grad_enabled(False)`")],
    CUT: [("tensor", "`torch.tensor(...)`"), ("numpy", "`.numpy()`"), ("tolist", "`.tolist()`"),
          ("item", "`.item()`"), ("detach", "`.detach()`"), ("data", "`.data`"),
          ("requires_grad_", "`.requires_grad_(False)`")],
}


def _source_tree(code) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(code)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None


def _names_in(tree: ast.AST) -> set[str]:
    """The attribute names used (`x.detach`, `torch.tensor`) and plain names called."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            found.add(node.func.id)
    return found


def _in_place_ops(tree: ast.AST) -> list[str]:
    """`x.mul_(...)`, `x *= ...`, `x[...] = ...`, as written."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                re.fullmatch(r"[a-z][a-z0-9_]*[a-z0-9]_", node.func.attr) and \
                node.func.attr != "requires_grad_":
            found.append(f"`.{node.func.attr}(...)`")
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, (ast.Name,
                                                                          ast.Subscript)):
            found.append(f"`{ast.unparse(node.target)} {_OPS.get(type(node.op), '?')}= ...`")
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript)
                                                  for t in node.targets):
            target = next(t for t in node.targets if isinstance(t, ast.Subscript))
            found.append(f"`{ast.unparse(target)} = ...`")
    return found


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.MatMult: "@"}


def construct(code, cause: str, used: Sequence[str] = ()) -> str:
    """What in the function causes `cause`, as shown ("`.detach()`"): a builtin it called
    (`used`, in the order called), else a construct in its source; "" when neither shows."""
    if cause == IN_PLACE:
        ran = [name for name in used if re.fullmatch(r"[a-z][a-z0-9_]*[a-z0-9]_", name)
               and name != "requires_grad_"]
        if ran:
            return f"`.{ran[0]}(...)`"
    else:
        ran = [shown for name, shown in _CONSTRUCTS.get(cause, []) if name in used]
        if ran:
            return ran[0]
    tree = _source_tree(code)
    if tree is None:
        return ""
    if cause == IN_PLACE:
        ops = _in_place_ops(tree)
        return ops[0] if ops else ""
    names = _names_in(tree)
    # In the source, `.data` first: it is the one construct that no call shows while running.
    written = sorted(_CONSTRUCTS.get(cause, []), key=lambda pair: pair[0] != "data")
    return next((shown for name, shown in written if name in names), "")


# --------------------------------------------------------------------------------------------
# Tracing one forward and backward


def trace(fn: Callable, args: Sequence, leaves: Sequence[tuple[str, torch.Tensor]],
          kwargs: dict | None = None) -> Cut | None:
    """Run `fn(*args, **kwargs)` with gradients on and backpropagate a fixed projection of its
    floating outputs to `leaves` ((name, tensor) pairs, tensors that require grad). None when
    every leaf gets a finite, non-zero gradient and no function of the learner's under it drops
    them (given tensors that require grad, returns floating ones that do not); else the `Cut`
    that says why. Gradients turned off where nothing needed them (a table of frequencies, the
    positions) are no cut. Exceptions other than autograd's own propagate."""
    top = getattr(inspect.unwrap(fn), "__code__", None)
    top_name = getattr(fn, "__name__", "the function")
    with torch.enable_grad(), _watching() as calls:
        try:
            out = fn(*args, **(kwargs or {}))
        except RuntimeError as exc:
            if "in-place" in str(exc) or "inplace" in str(exc):
                return _blame_in_place(calls, top, top_name, exc)
            raise
    found = _blame_cut(calls)
    if found is not None:
        return found
    top = calls[0] if calls else top
    outputs = [t for t in _float_outputs(out) if t.requires_grad]
    if not outputs:
        return _explain(calls, top, top_name, [name for name, _t in leaves])
    with torch.enable_grad():
        loss = sum((t.float() * _probe_like(t)).sum() for t in outputs)
        try:
            grads = torch.autograd.grad(loss, [t for _n, t in leaves], allow_unused=True)
        except RuntimeError as exc:
            if "inplace" in str(exc) or "in-place" in str(exc):
                return _blame_in_place(calls, top, top_name, exc)
            raise
    missing = [name for (name, _t), g in zip(leaves, grads) if g is None]
    if missing:
        return _blame_missing(calls, leaves, grads, top, top_name)
    bad = [name for (name, _t), g in zip(leaves, grads) if not bool(g.isfinite().all())]
    if bad:
        return _cut_at(top, top_name, NOT_FINITE, bad)
    zero = [name for (name, _t), g in zip(leaves, grads) if not bool(g.ne(0).any())]
    if zero:
        return _cut_at(top, top_name, ZERO, zero)
    return None


def _probe_like(t: torch.Tensor) -> torch.Tensor:
    """A fixed projection, so that no gradient cancels out (as it would for a plain sum through
    a softmax or a norm)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.device)


def _cut_at(at, name: str, cause: str, names: list[str]) -> Cut:
    """The Cut at `at`: one of the learner's calls, a code object, or None (`name` only)."""
    if at is None:
        return Cut(cause, name, None, "", names)
    code, used = (at.code, at.used) if isinstance(at, _Call) else (at, [])
    return Cut(cause, code.co_name, chapter_of(code), construct(code, cause, used), names)


def _explain(calls: list[_Call], at, name: str, names: list[str]) -> Cut:
    """Why the call `at` (where gradients were found to stop) stopped them: it, or a caller,
    ran with gradients off (the function a decorator turned them off for, else the caller whose
    `with` block did), it turned them off inside, or it cut the graph."""
    if not isinstance(at, _Call):
        return _cut_at(at, name, CUT, names)
    call = at
    if not call.grad or call.inference:
        while call.parent is not None and not call.decorated and \
                (not calls[call.parent].grad or calls[call.parent].inference):
            call = calls[call.parent]                 # the outermost call that ran without
        parent = calls[call.parent] if call.parent is not None else None
        found = _cut_at(call if call.decorated or parent is None else parent, name, NO_GRAD,
                        names)
        if call.inference and "inference" not in found.construct:
            found.construct = "`torch.inference_mode()`"
        return found
    cut_called = any(builtin in call.used for builtin, _shown in _CONSTRUCTS[CUT])
    if cut_called or not call.off_inside:
        return _cut_at(call, name, CUT, names)
    return _cut_at(call, name, NO_GRAD, names)       # its own `with torch.no_grad():`


def _blame_cut(calls: list[_Call]) -> Cut | None:
    """The first of the learner's calls to return (the innermost) that was given tensors which
    require grad and returned floating tensors that do not."""
    cut = [call for call in calls if call.cut]
    if not cut:
        return None
    innermost = max(cut, key=lambda call: _depth(calls, call))
    return _explain(calls, innermost, "", [])


def _depth(calls: list[_Call], call: _Call) -> int:
    depth = 0
    while call.parent is not None:
        call, depth = calls[call.parent], depth + 1
    return depth


def _blame_missing(calls, leaves, grads, top, top_name) -> Cut:
    """No gradient reaches some leaves: the innermost of the learner's calls that was handed one
    of them, with its construct."""
    missing = [(name, t) for (name, t), g in zip(leaves, grads) if g is None]
    handed = [call for call in calls if any(id(t) in call.inputs for _n, t in missing)]
    at = max(handed, key=lambda call: _depth(calls, call)) if handed else top
    return _explain(calls, at, top_name, [name for name, _t in missing])


def _blame_in_place(calls, top, top_name, exc: Exception) -> Cut:
    """An in-place change autograd refused: the innermost of the learner's functions whose
    source changes a tensor in place (the traceback's, when it raised in the forward)."""
    tb, raised_in = exc.__traceback__, None
    while tb is not None:
        if _is_learners(tb.tb_frame.f_code):
            raised_in = tb.tb_frame.f_code
        tb = tb.tb_next
    if raised_in is not None:
        by_code = [call for call in calls if call.code is raised_in]
        return _cut_at(by_code[-1] if by_code else raised_in, top_name, IN_PLACE, [])
    writers = [call for call in calls if construct(call.code, IN_PLACE, call.used)]
    at = max(writers, key=lambda call: _depth(calls, call)) if writers else top
    return _cut_at(at, top_name, IN_PLACE, [])


# --------------------------------------------------------------------------------------------
# Probes: tiny inputs for the functions the course knows by name


TINY = ModelConfig(vocab_size=23, hidden_size=16, n_heads=4, n_kv_heads=2, ffn_hidden_size=24,
                   n_layers=2, max_seq_len=16)


def _leaf(*shape, scale: float = 1.0, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).requires_grad_(True)


def _model_params(gen: torch.Generator) -> dict:
    from .reference.model import init_model_params

    params = init_model_params(TINY, generator=gen)
    params = {"embed": params["embed"], "layers": params["layers"],
              "final_norm": params["final_norm"] + 0.1 * torch.randn(TINY.hidden_size,
                                                                      generator=gen),
              "lm_head": params["lm_head"]}
    for layer in params["layers"]:
        for name in ("attn_norm", "ffn_norm"):
            layer[name] = layer[name] + 0.1 * torch.randn(TINY.hidden_size, generator=gen)
    leaves = {"embed": params["embed"].detach().clone().requires_grad_(True),
              "final_norm": params["final_norm"].detach().clone().requires_grad_(True),
              "lm_head": params["lm_head"].detach().clone().requires_grad_(True),
              "layers": [{k: t.detach().clone().requires_grad_(True) for k, t in layer.items()}
                         for layer in params["layers"]]}
    return leaves


def _named(params: dict, prefix: str = "params") -> list[tuple[str, torch.Tensor]]:
    out = []
    for key, value in params.items():
        if isinstance(value, torch.Tensor):
            out.append((f"{prefix}['{key}']", value))
        elif isinstance(value, list):
            for i, layer in enumerate(value):
                out += _named(layer, f"{prefix}['{key}'][{i}]")
    return out


def _case(name: str, gen: torch.Generator):
    """(args, kwargs, leaves) for the function `name`."""
    cfg, b, s = TINY, 2, 5
    h, d = cfg.hidden_size, cfg.head_dim
    positions = torch.arange(s)
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    if name == "model_forward":
        params = _model_params(gen)
        return (torch.randint(0, cfg.vocab_size, (b, s), generator=gen), params, cfg), {}, \
            _named(params)
    if name in ("decoder_block", "attention_sublayer"):
        layer = _model_params(gen)["layers"][0]
        x = _leaf(b, s, h, gen=gen)
        used = _named(layer, "layer") if name == "decoder_block" else \
            [(n, t) for n, t in _named(layer, "layer") if re.search("attn_norm|wqkv|wo", n)]
        return (x, layer, cfg, positions), {}, [("x", x)] + used
    if name == "embed":
        table = _leaf(cfg.vocab_size, h, gen=gen)
        return (torch.randint(0, cfg.vocab_size, (b, s), generator=gen), table), {}, \
            [("table", table)]
    if name == "split_qkv":
        width = (cfg.n_heads + 2 * cfg.n_kv_heads) * d
        qkv = _leaf(b, s, width, gen=gen)
        return (qkv, cfg.n_heads, cfg.n_kv_heads, d), {}, [("qkv", qkv)]
    if name == "merge_heads":
        x = _leaf(b, cfg.n_heads, s, d, gen=gen)
        return (x,), {}, [("x", x)]
    if name in ("grouped_query_attention", "attention"):
        kv = cfg.n_kv_heads if name == "grouped_query_attention" else cfg.n_heads
        q, k, v = (_leaf(b, n, s, d, gen=gen) for n in (cfg.n_heads, kv, kv))
        return (q, k, v, mask), {}, [("q", q), ("k", k), ("v", v)]
    if name == "apply_rope":
        x = _leaf(b, cfg.n_heads, s, d, gen=gen)
        return (x, positions), {}, [("x", x)]
    if name in ("silu", "gelu", "relu"):
        x = _leaf(b, s, h, gen=gen)
        return (x,), {}, [("x", x)]
    if name == "swiglu_ffn":
        x, wg, wu, wd = (_leaf(*shape, scale=0.3, gen=gen) for shape in
                         ((b, s, h), (h, cfg.ffn_hidden_size), (h, cfg.ffn_hidden_size),
                          (cfg.ffn_hidden_size, h)))
        return (x, wg, wu, wd), {}, [("x", x), ("w_gate", wg), ("w_up", wu), ("w_down", wd)]
    if name == "rms_norm":
        x, gamma = _leaf(b, s, h, gen=gen), (1 + 0.1 * torch.randn(h, generator=gen))
        gamma.requires_grad_(True)
        return (x, gamma), {}, [("x", x), ("gamma", gamma)]
    raise KeyError(name)


PROBED = ("model_forward", "decoder_block", "attention_sublayer", "embed", "split_qkv",
          "merge_heads", "grouped_query_attention", "attention", "apply_rope", "silu", "gelu",
          "relu", "swiglu_ffn", "rms_norm")


def probe(name: str, fn: Callable) -> Cut | None:
    """`trace` on tiny inputs of the course's for the function called `name` (one of PROBED);
    an exception of `fn` that is not autograd's propagates."""
    args, kwargs, leaves = _case(name, torch.Generator().manual_seed(0))
    return trace(fn, args, leaves, kwargs)




# --------------------------------------------------------------------------------------------
# Borrowing for training: the mistakes, told where a chapter borrows an earlier one's functions
# (checks.borrow), registered under chapter 14's train_step, which trains through them.

BORROWED_NO_GRAD = Mistake("borrowed_without_gradients", N_(
    "{cause}: training cannot learn through it, so the course's reference stands in for it; "
    "take out the torch.no_grad() or torch.inference_mode() in that chapter (turn gradients off "
    "where you call the model to generate, not inside it)"))
BORROWED_CUT = Mistake("borrowed_cuts_gradients", N_(
    "{cause}: its values are right but no gradient flows back through it, so the course's "
    "reference stands in for it; compute with the tensors themselves in that chapter (no "
    ".detach(), .data, torch.tensor(...), .item() or NumPy on the way)"))
BORROWED_IN_PLACE = Mistake("borrowed_changes_in_place", N_(
    "{cause}: the backward pass fails on it, so the course's reference stands in for it; "
    "compute into a new tensor in that chapter (`x = x * s`, not `x *= s` or `x.mul_(s)`)"))
BORROWED_NOT_FINITE = Mistake("borrowed_gradient_not_finite", N_(
    "{cause}: training cannot learn through it, so the course's reference stands in for it; "
    "look in that chapter for a square root or a division at zero, or a -inf that reaches the "
    "backward pass"))
BORROWED = (BORROWED_NO_GRAD, BORROWED_CUT, BORROWED_IN_PLACE, BORROWED_NOT_FINITE)


def borrowed_mistake(cut: Cut) -> Mistake:
    """The mistake told when a borrowed function cannot be trained through."""
    return {NO_GRAD: BORROWED_NO_GRAD, IN_PLACE: BORROWED_IN_PLACE,
            NOT_FINITE: BORROWED_NOT_FINITE, ZERO: BORROWED_NOT_FINITE}.get(cut.cause,
                                                                          BORROWED_CUT)


__all__ = ["BORROWED", "CUT", "Cut", "IN_PLACE", "NOT_FINITE", "NO_GRAD", "PROBED", "TINY", "ZERO",
           "borrowed_mistake", "chapter_of", "construct", "probe", "trace"]
