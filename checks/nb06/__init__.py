"""Checks for chapter 06: grouped-query and multi-query attention, and the KV-cache size.

`grouped_query_attention` must not materialise the repeated keys and values. A torch-function
mode watches every torch call the learner's function makes (see `_NoRepeatedKV`): copying
functions (`repeat_interleave`, `repeat`, `tile`, `cat`, `stack` ...) applied to K or V are
rejected outright; and since the random sizes are distinct primes, the element count of any tensor
factors into the sizes it spans, so a tensor whose element count is a multiple of G * S_k * D (or
G * S_k * D_v) holds some KV head's keys (or values) once per query head of its group: a repeated
K (or V), however it was made (expand + reshape, indexing, a preallocated buffer, one group at a
time or all at once). It is caught when it is created or when an expanded view of that size is
fed to a computation. `torch.matmul` broadcasting a [B, N_kv, 1, D, S_k] view of K against
[B, N_kv, G, S_q, D] queries copies K internally; that is recognised from the operands' shapes.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from .. import reference as ref
from ..engine import Check, CheckFailure, ForbiddenCall, builds_on, tolerance
from ..i18n import N_, _
from ..mistakes import Mistake, fix_first

# --------------------------------------------------------------------------------------------
# Exercise 1: kv_head_index


def _integral(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


ROUND_ROBIN = Mistake("round_robin_groups", N_(
    "used h % N_kv (round-robin groups); the course's groups are consecutive: query heads "
    "0..G-1 share KV head 0, so h reads KV head h // G"))
DIVIDED_BY_N_KV = Mistake("divided_by_n_kv_heads", N_(
    "used h // N_kv: divide by the group size G = N_h / N_kv, not by the number of KV heads"))
QUERY_HEAD_ITSELF = Mistake("returned_the_query_head", N_(
    "returned the query head itself, as if N_kv were N_h (that is MHA); with fewer KV heads "
    "G = N_h / N_kv query heads share one"))
DIVIDED_BY_N_H = Mistake("divided_by_n_heads", N_(
    "divided by N_h, which sends every head to KV head 0 (that is MQA); divide by "
    "G = N_h / N_kv"))
FROM_ONE = Mistake("counted_heads_from_1", N_(
    "counted heads from 1 as the article's table does; the course counts from 0"))
ROUNDED = Mistake("rounded_to_nearest", N_("rounded h / G to the nearest integer; use floor "
                                           "division h // G"))
ROUNDED_UP = Mistake("rounded_up", N_("rounded h / G up (ceil); query heads 0..G-1 share KV head "
                                      "0, so use floor division h // G"))
FLOAT_INDEX = Mistake("float_division", N_("use integer (floor) division `//`"))
TENSOR_INDEX = Mistake("returned_a_tensor", N_(
    "returned a tensor: an index is a Python int (`h // (n_heads // n_kv_heads)` on ints is "
    "one; `int(...)` turns a 0-dim tensor into one)"))
GROUP_UPSIDE_DOWN = Mistake("group_size_inverted", N_(
    "computed the group size as n_kv_heads // n_heads, which is 0 when N_kv < N_h: "
    "G = n_heads // n_kv_heads, the number of query heads per KV head"),
    raises=[("ZeroDivisionError", None)])


def _kv_index_mixups(n_heads: int, n_kv: int) -> dict:
    """Head maps (one KV head per query head) that the common mistakes produce."""
    g = n_heads // n_kv
    heads = range(n_heads)
    return {
        ROUND_ROBIN: [h % n_kv for h in heads],
        DIVIDED_BY_N_KV: [h // n_kv for h in heads],
        QUERY_HEAD_ITSELF: list(heads),
        DIVIDED_BY_N_H: [h // n_heads for h in heads],
        FROM_ONE: [h // g + 1 for h in heads],
        ROUNDED: [round(h / g) for h in heads],
        ROUNDED_UP: [-(-h // g) for h in heads],
    }


def check_kv_head_index(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("kv_head_index", f, seed=seed, errors=[GROUP_UPSIDE_DOWN]) as c:
        cases = [(32, 8), (32, 32), (32, 1)]  # LLaMA-2-7B shapes as GQA, MHA, MQA
        for _n in range(6 if thorough else 2):
            n_kv, g = c.sizes(2, 2, 6)
            cases.append((n_kv * g, n_kv))
        for n_heads, n_kv in cases:
            got = []
            for h in range(n_heads):
                value = c.call(h, n_heads, n_kv)
                if not _integral(value):
                    c.fail(_("{call} returned {kind} {value}; it should return a Python int.")
                           .format(call=f"kv_head_index({h}, n_heads={n_heads}, "
                                        f"n_kv_heads={n_kv})",
                                   kind=type(value).__name__, value=repr(value)),
                           FLOAT_INDEX if isinstance(value, float) else
                           TENSOR_INDEX if isinstance(value, torch.Tensor) else None)
                got.append(int(value))
            want = [ref.kv_head_index(h, n_heads, n_kv) for h in range(n_heads)]
            if got != want:
                h = next(i for i in range(n_heads) if got[i] != want[i])
                g, j = n_heads // n_kv, want[h]
                c.fail(_("{call} returned {got}, expected {want}: with G = {g}, query heads "
                         "{first}..{last} share KV head {want}.").format(
                    call=f"kv_head_index({h}, n_heads={n_heads}, n_kv_heads={n_kv})",
                    got=got[h], want=j, g=g, first=j * g, last=j * g + g - 1),
                       c.diagnose(got, _kv_index_mixups(n_heads, n_kv), 0.0, 0.0))
        c.headline(_("consecutive groups for GQA, MHA (N_kv = N_h) and MQA (N_kv = 1)"))


# --------------------------------------------------------------------------------------------
# Exercise 2: repeat_kv


TILED = Mistake("tiled_instead_of_interleaved", N_(
    "repeated the whole block of heads (tiling, like `x.repeat(1, n_rep, 1, 1)` or "
    "`torch.cat([x] * n_rep, dim=1)`): head h then reads KV head h % N_kv; use "
    "repeat-interleave order, where each KV head's copies sit next to each other"))
SEQUENCE_AXIS = Mistake("repeated_sequence_axis", N_(
    "repeated along the sequence axis (dim 2); repeat the heads axis, dim 1"))
FEATURE_AXIS = Mistake("repeated_feature_axis", N_(
    "repeated along the feature axis (dim 3); repeat the heads axis, dim 1"))
BATCH_AXIS = Mistake("repeated_batch_axis", N_(
    "repeated along the batch axis (dim 0); repeat the heads axis, dim 1"))
NO_DIM = Mistake("repeat_interleave_without_dim", N_(
    "`repeat_interleave` without `dim=` flattens the tensor first; pass dim=1"))
UNCHANGED = Mistake("returned_x_unchanged", N_(
    "returned x unchanged; each KV head must appear n_rep times"))
REPEAT_AXIS_KEPT = Mistake("kept_the_repeat_axis", N_(
    "kept the copies on an axis of their own ([B, N_kv, n_rep, S, D]): merge them into the "
    "heads axis, "
    "`.reshape(B, N_kv * n_rep, S, D)`"))
VIEW_OF_EXPANDED = Mistake("viewed_an_expanded_tensor", N_(
    "`.view` cannot merge the axes of an expanded tensor (its copies share memory): use "
    "`.reshape(B, N_kv * n_rep, S, D)`, which copies where it must"),
    raises=[("RuntimeError", r"view size is not compatible|use \.reshape")])
REPEAT_DTYPE = Mistake("changed_the_dtype", N_(
    "return x's dtype: repeating copies values, it never needs another dtype"))
REPEAT_IN_PLACE = Mistake("changed_x_in_place", N_(
    "modified its input x in place; return a new tensor instead."))


def check_repeat_kv(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("repeat_kv", f, seed=seed, errors=[VIEW_OF_EXPANDED],
               in_place=REPEAT_IN_PLACE) as c:
        c.headline(_("repeat-interleave head order (head h is KV head h // n_rep)"))
        c.headline(_("N_kv = 1, n_rep = 1 and float64 inputs"))
        cases = []
        for _n in range(4 if thorough else 2):
            b, n_kv, s, d, n_rep = c.sizes(5, 2, 9)
            cases.append((b, n_kv, s, d, n_rep, torch.float32))
        b, s, d, n_rep = c.sizes(4, 2, 9)
        cases.append((b, 1, s, d, n_rep, torch.float32))  # MQA: one KV head
        b, n_kv, s, d = c.sizes(4, 2, 9)
        cases.append((b, n_kv, s, d, 1, torch.float32))  # MHA: nothing to repeat
        b, n_kv, s, d, n_rep = c.sizes(5, 2, 9)
        cases.append((b, n_kv, s, d, n_rep, torch.float64))  # dtype is kept
        n_kv, s, d, n_rep = c.sizes(4, 2, 9)
        cases.append((1, n_kv, s, d, n_rep, torch.float32))  # a batch of one
        for b, n_kv, s, d, n_rep, dtype in cases:
            x = c.randn(b, n_kv, s, d, dtype=dtype)
            got = c.call(x, n_rep)
            what = _("repeat_kv(x of {shape}, n_rep={n_rep})").format(
                shape=f"[B={b}, N_kv={n_kv}, S={s}, D={d}]", n_rep=n_rep)
            if isinstance(got, torch.Tensor) and got.shape == (b, n_kv * n_rep, s, d) \
                    and got.dtype != dtype:
                c.fail(_("{what} has dtype {got}, expected {want}.").format(
                    what=what, got=got.dtype, want=dtype), REPEAT_DTYPE)
            try:
                c.expect_tensor(got, ref.repeat_kv(x, n_rep), what=what,
                                dims=("B", "N_kv*n_rep", "S", "D"), wrong=_repeat_mixups(x, n_rep))
            except CheckFailure as failure:
                raise failure.with_hint(failure.hint or _head_order(got, x, n_rep)) from None


HEAD_ORDER = Mistake("heads_in_another_order", N_(
    "every KV head is there n_rep times, in another order: your output heads hold KV heads "
    "{order}; in repeat-interleave order head h is KV head h // n_rep: {want}"))


def _head_order(got, x: torch.Tensor, n_rep: int) -> Mistake | None:
    """HEAD_ORDER when each output head is a copy of some KV head, in a wrong order."""
    if not isinstance(got, torch.Tensor) or got.shape != (x.shape[0], x.shape[1] * n_rep,
                                                           *x.shape[2:]):
        return None
    order = []
    for h in range(got.shape[1]):
        j = next((j for j in range(x.shape[1]) if torch.equal(got[:, h].to(x.dtype), x[:, j])),
                 None)
        if j is None:
            return None
        order.append(j)
    want = [h // n_rep for h in range(got.shape[1])]
    if sorted(order) != want:
        return None
    return HEAD_ORDER.with_text(_(HEAD_ORDER).format(order=order, want=want))


def _repeat_mixups(x: torch.Tensor, n_rep: int) -> dict:
    b, n_kv, s, d = x.shape
    return {
        TILED: lambda: x.repeat(1, n_rep, 1, 1),
        SEQUENCE_AXIS: lambda: x.repeat_interleave(n_rep, dim=2),
        FEATURE_AXIS: lambda: x.repeat_interleave(n_rep, dim=3),
        BATCH_AXIS: lambda: x.repeat_interleave(n_rep, dim=0),
        BATCH_AXIS.with_text(_("{mistake} (tiled: `x.repeat(n_rep, 1, 1, 1)`)").format(
            mistake=_(BATCH_AXIS))): lambda: x.repeat(n_rep, 1, 1, 1),
        NO_DIM: lambda: x.repeat_interleave(n_rep),
        UNCHANGED: lambda: x,
        REPEAT_AXIS_KEPT: lambda: x[:, :, None].expand(b, n_kv, n_rep, s, d),
    }


# --------------------------------------------------------------------------------------------
# Exercise 3: grouped_query_attention, and the guard against materialising repeated K/V

# Functions that copy their inputs into a bigger tensor: never applied to K or V here.
_COPYING = frozenset({"repeat_interleave", "repeat", "tile", "cat", "concat", "concatenate",
                      "stack", "hstack", "vstack", "dstack", "column_stack", "index_select",
                      "gather", "take", "take_along_dim", "broadcast_tensors"})
# Metadata reads (including properties such as `.shape`, seen as `__get__`): never a copy.
_METADATA = frozenset({"__get__", "__len__", "size", "dim", "ndimension", "stride", "numel",
                       "nelement", "is_contiguous", "data_ptr", "storage_offset",
                       "untyped_storage", "element_size", "is_floating_point", "is_complex",
                       "__repr__", "__str__", "__format__", "type", "get_device"})
# Functions that return a view of (or may return) their input: an expanded view passed to them
# costs nothing by itself; if they copy, the copy is caught as their result.
_VIEWS = frozenset({"view", "view_as", "expand", "expand_as", "broadcast_to", "unsqueeze",
                    "squeeze", "transpose", "swapaxes", "swapdims", "permute", "movedim",
                    "moveaxis", "t", "narrow", "select", "unflatten", "__getitem__", "unbind",
                    "split", "chunk", "tensor_split", "as_strided", "diagonal", "detach",
                    "alias", "reshape", "reshape_as", "flatten", "contiguous", "unfold", "to",
                    "type_as", "float", "double", "half", "bfloat16", "clone"})
_MATMULS = frozenset({"matmul", "__matmul__", "__rmatmul__"})
_FOLD_HINT = N_("fold the G query heads of a group into the rows of one matrix: "
                 "q.reshape(B, N_kv, G * S_q, D) @ k.transpose(-2, -1) gives "
                 "[B, N_kv, G * S_q, S_k] scores without copying K; do the same for the weights "
                 "times V")
# How the repeated K/V was materialised (each told with "Instead, {fold}" after it).
COPIED_KV = Mistake("copied_kv_per_query_head", _FOLD_HINT)
FED_EXPANDED_KV = Mistake("computed_on_expanded_kv", N_(
    "an expanded view of K or V costs nothing until an operation such as this one reads it; "
    "then it is copied or processed once per query head. Instead, {fold}"))
INDEXED_KV = Mistake("indexed_kv_heads", N_(
    "indexing with a list or tensor of head indices (k[:, idx]) copies the selected heads; "
    "slices and single indices (k[:, j]) are views."))
EXPANDED_CONTIGUOUS = Mistake("made_expanded_kv_contiguous", N_(
    "expand() alone is free, but making the expanded K/V contiguous (reshape, contiguous, "
    "clone) copies it; that is what repeat_kv does."))
FILLED_KV = Mistake("filled_a_repeated_kv_tensor", N_(
    "a tensor with one K (or V) per query head is a copy, however it is filled."))
BROADCAST_MATMUL = Mistake("broadcast_kv_in_matmul", N_(
    "torch.matmul implements broadcast batch dimensions by expanding the operand and copying it "
    "into one big batch, so a [B, N_kv, 1, S_k, D] view of K against [B, N_kv, G, S_q, D] "
    "queries copies K once per query head. Instead, {fold}"))


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage (e.g. meta) have nothing to compare
        return -1


class _Watch:
    """What the guard needs to know about one call: K, V and the element counts to watch."""

    def __init__(self):
        self.exercise = "grouped_query_attention"
        self.kv: list[torch.Tensor] = []
        # G * S_k * D and G * S_k * D_v: with distinct prime sizes, a tensor whose element
        # count is a multiple of one of them holds a KV head's keys (or values) once for each of
        # the G query heads that share it; no honest intermediate spans G, S_k and D at once.
        self.divisors: tuple[int, ...] = ()
        self.sizes_text = ""

    def repeated(self, n: int) -> bool:
        return n > 0 and any(n % d == 0 for d in self.divisors)


class _NoRepeatedKV(TorchFunctionMode):
    """Fail as soon as the learner's code copies K or V out to every query head.

    A torch-function mode sees each torch call the learner's code makes (not the calls inside
    torch), so three things are checked per call: copying functions applied to K or V; a tensor
    of repeated-K/V size passed to a computation (an expanded view gets copied there) or created
    by it; and `torch.matmul` broadcasting a K/V operand over the group axis, which it does by
    expanding and copying.
    """

    def __init__(self, watch: _Watch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _METADATA:
            return func(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        if name in _COPYING and self._touches_kv(inputs):
            raise ForbiddenCall(
                self.watch.exercise,
                _("calls `{name}` on the keys or values: that materialises the repeated K/V, "
                  "which grouped-query attention exists to avoid.").format(name=name),
                hint=COPIED_KV)
        if self.watch.divisors:
            if name not in _VIEWS:
                for t in inputs:
                    if self.watch.repeated(t.numel()):
                        self._fail(_("a tensor of shape {shape} goes into `{name}`").format(
                                       shape=list(t.shape), name=name), FED_EXPANDED_KV.with_text(
                                   _(FED_EXPANDED_KV).format(fold=_(_FOLD_HINT))))
            if name in _MATMULS and len(inputs) >= 2:
                self._check_matmul(name, inputs[0], inputs[1])
        out = func(*args, **kwargs)
        if self.watch.divisors:
            storages = {_storage(t) for t in inputs}
            for t in _tensors(out):
                if self.watch.repeated(t.numel()) and _storage(t) not in storages:
                    how = (INDEXED_KV if name == "__getitem__" else
                           EXPANDED_CONTIGUOUS if name in _VIEWS else FILLED_KV)
                    self._fail(_("`{name}` built a tensor of shape {shape}").format(
                                   name=name, shape=list(t.shape)), how.with_text(
                               _("{hint} Instead, {fold}").format(hint=_(how),
                                                                  fold=_(_FOLD_HINT))))
        return out

    def _touches_kv(self, inputs) -> bool:
        storages = {_storage(t) for t in self.watch.kv}
        shapes = {tuple(t.shape) for t in self.watch.kv}
        return any(_storage(t) in storages or tuple(t.shape) in shapes for t in inputs)

    def _check_matmul(self, name, a, b):
        """torch.matmul expands both operands to the common batch shape, then reshapes them into
        one batched GEMM: an operand with fewer batch entries than that shape gets copied."""
        if a.dim() < 3 and b.dim() < 3:
            return
        try:
            batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except RuntimeError:
            return  # the call itself will report the mismatch
        for x in (a, b):
            if x.dim() >= 3 and math.prod(x.shape[:-2]) < math.prod(batch):
                expanded = [*batch, *x.shape[-2:]]
                if self.watch.repeated(math.prod(expanded)):
                    self._fail(_("`{name}` broadcasts an operand of shape {shape} to "
                                 "{expanded}").format(name=name, shape=list(x.shape),
                                                      expanded=expanded),
                               BROADCAST_MATMUL.with_text(
                                   _(BROADCAST_MATMUL).format(fold=_(_FOLD_HINT))))

    def _fail(self, what: str, hint: Mistake):
        raise CheckFailure(self.watch.exercise,
                           _("materialises the repeated K/V: {what}, which holds a KV head's "
                             "keys (or values) once for each of the G query heads sharing it "
                             "({sizes}). The G query heads of a group must share their KV head "
                             "without copying it.").format(what=what,
                                                           sizes=self.watch.sizes_text),
                           hint=hint)


def _watched(f, watch: _Watch):
    """`f`, run under the guard."""

    def grouped_query_attention(*args, **kwargs):
        kv = list(args[1:3]) + [kwargs[n] for n in ("k", "v") if n in kwargs]
        watch.kv = [t for t in kv if isinstance(t, torch.Tensor)]
        with _NoRepeatedKV(watch):
            return f(*args, **kwargs)

    grouped_query_attention.__wrapped__ = f  # its signature names the inputs in messages
    return grouped_query_attention


CALLS_SDPA = Mistake("calls_scaled_dot_product_attention", N_(
    "write the grouping yourself; the demo after the exercise compares your function with "
    "F.scaled_dot_product_attention(..., enable_gqa=True)"))
_FORBID_SDPA = {"scaled_dot_product_attention": CALLS_SDPA}


def _prime_sizes(c: Check, *, n_kv: int | None = None, s_q: int | None = None,
                 kv_more: bool = False):
    """(B, N_kv, G, S_q, S_k, D, D_v): distinct primes (N_kv or S_q may be pinned to 1).

    With `kv_more`, N_kv > G, so that "h // N_kv" is still a valid head index and its output can
    be recognised.
    """
    small = [2, 3, 5]
    order = torch.randperm(3, generator=c.gen).tolist()
    b, g, nk = (small[i] for i in order)
    if kv_more and g > nk:
        g, nk = nk, g
    if n_kv is not None:
        nk = n_kv
    big = [7, 11, 13, 17, 19]
    order = torch.randperm(5, generator=c.gen).tolist()
    sq, sk, d, dv = (big[i] for i in order[:4])
    if s_q is not None:
        sq = s_q
    return b, nk, g, sq, sk, d, dv


def _gqa64(q, k, v, mask=None, *, kv_index=None, scale=None, softmax_dim=-1, mask_mode="bool",
           masked_rows="zero", after=1.0):
    """Attention with an explicit head map, in float64: expected values for known mistakes."""
    n_h, n_kv, d = q.shape[1], k.shape[1], q.shape[-1]
    if kv_index is None:
        kv_index = [h // (n_h // n_kv) for h in range(n_h)]
    if max(kv_index) >= n_kv or min(kv_index) < 0:
        raise ValueError("head map out of range")
    idx = torch.tensor(kv_index)
    q64, k64, v64 = q.double(), k.double()[:, idx], v.double()[:, idx]
    scale = 1 / math.sqrt(d) if scale is None else scale
    scores = q64 @ k64.transpose(-2, -1) * scale
    if mask is not None and mask_mode != "ignore":
        allowed = mask.bool().expand(scores.shape)
        if mask_mode == "inverted":
            allowed = ~allowed
        if mask_mode == "added":
            scores = scores + mask.double()
            allowed = torch.ones_like(allowed)
    else:
        allowed = torch.ones(scores.shape, dtype=torch.bool)
    if mask_mode == "after":  # softmax over every key, then the blocked weights zeroed
        weights = torch.softmax(scores, dim=softmax_dim) * mask.bool().expand(scores.shape)
    else:
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=softmax_dim)
    weights = weights.nan_to_num(0.0) * after
    out = weights @ v64
    empty = ~allowed.any(-1, keepdim=True)
    if masked_rows == "nan":
        out = out.masked_fill(empty, float("nan"))
    elif masked_rows == "mean":
        out = torch.where(empty, v64.mean(-2, keepdim=True), out)

    return out.to(q.dtype)


GQA_ROUND_ROBIN = Mistake("round_robin_groups", N_(
    "query head h read KV head h % N_kv (round-robin groups, as from `repeat` instead of "
    "`repeat_interleave`, or from viewing q as [B, G, N_kv, S_q, D]); the groups are "
    "consecutive: q must be viewed as [B, N_kv, G, S_q, D]"))
GQA_DIVIDED_BY_N_KV = Mistake("divided_by_n_kv_heads", N_(
    "query head h read KV head h // N_kv; divide by the group size G = N_h / N_kv"))
NO_SCALE = Mistake("missing_scale", N_("forgot the 1/sqrt(D_h) scale"))
SCALE_BY_D = Mistake("scaled_by_d", N_("scaled by 1/D_h instead of 1/sqrt(D_h)"))
SCALE_BY_H = Mistake("scaled_by_sqrt_h", N_(
    "scaled by 1/sqrt(H) = 1/sqrt(N_h * D_h), the width of all query heads together, instead of "
    "1/sqrt(D_h), one head's width (the last dimension of q)"))
SCALE_INT = Mistake("scale_rounded_to_int", N_(
    "scaled by 1/int(sqrt(D_h)): the square root was rounded to an integer (`int(math.sqrt(d))`, "
    "`math.isqrt`, `d ** 0.5 // 1`); divide by the exact `math.sqrt(d)`"))
SCALE_BY_D_V = Mistake("scaled_by_value_width", N_(
    "scaled by 1/sqrt(D_v), the width of v; the scale comes from the queries and keys: D_h is "
    "the last dimension of q (and k)"))
SCALED_WEIGHTS = Mistake("scaled_after_softmax", N_(
    "divided the weights by sqrt(D_h) after the softmax; the scale divides the scores, before "
    "the softmax (then every row of weights sums to 1)"))
SOFTMAX_QUERIES = Mistake("softmax_over_queries", N_(
    "softmax over the query axis; it runs over the keys (last axis)"))
IGNORED_MASK = Mistake("ignored_the_mask", N_("ignored the mask"))
MASK_INVERTED = Mistake("mask_inverted", N_("mask inverted: True means 'may attend'"))
MASK_ADDED = Mistake("added_the_boolean_mask", N_(
    "added the boolean mask to the scores; blocked positions need -inf (masked_fill), not +0/+1"))
MASK_AFTER = Mistake("masked_after_softmax", N_(
    "zeroed the blocked weights after the softmax, so the allowed ones no longer sum to 1: fill "
    "the blocked scores with -inf before the softmax"))
NAN_ROWS = Mistake("fully_masked_rows_nan", N_(
    "fully masked query rows came out as NaN; they must give zeros (softmax of a row of -inf is "
    "NaN: zero those rows, as chapter 04's masked_softmax does)"))
MEAN_ROWS = Mistake("fully_masked_rows_mean_of_v", N_(
    "fully masked query rows came out as the mean of V: filling blocked scores with a large "
    "finite negative number gives such rows uniform weights; they must give zeros"))
SQUEEZED = Mistake("squeezed_size_one_axes", N_(
    "squeezed the axes of size 1 away (`.squeeze()`): a batch of one, a decode step (S_q = 1) "
    "and MQA (N_kv = 1) keep their axes; the output is always [B, N_h, S_q, D_v]"))
UNSTABLE = Mistake("unstable_softmax", N_(
    "softmax overflowed: exp of a large score is inf. Subtract each row's maximum score before "
    "exponentiating (or use chapter 04's masked_softmax)"))
RETURNED_TUPLE = Mistake("returned_out_and_weights", N_(
    "chapter 04's attention returns (out, weights); this function returns out alone"))
GQA_DTYPE = Mistake("changed_the_dtype", N_(
    "return q's dtype: compute in float32 only when the inputs are float32 (float64 inputs give "
    "a float64 output)"))
MASK_ON_FOLDED = Mistake("mask_on_folded_scores", N_(
    "applied the mask to the folded [B, N_kv, G * S_q, S_k] scores, whose rows are G query "
    "heads' S_q rows each: view the scores back as [B, N_h, S_q, S_k] before masking (the mask "
    "broadcasts against that shape)"))


def _mask_on_folded(g: int, s_q: int) -> Mistake:
    """MASK_ON_FOLDED, recognised from the broadcast error of a [.., S_q, S_k] mask against
    [.., G * S_q, S_k] scores (distinct primes: no other mistake gives these two sizes)."""
    sizes = rf"\({g * s_q}\) must match the size of tensor b \({s_q}\)|" \
            rf"\({s_q}\) must match the size of tensor b \({g * s_q}\)"
    return Mistake(MASK_ON_FOLDED.key, MASK_ON_FOLDED, raises=[("RuntimeError", sizes)])


GQA_IN_PLACE = Mistake("changed_inputs_in_place", N_(
    "scale or mask new tensors (`q = q / math.sqrt(d)`, `masked_fill`) instead of writing into "
    "q, k or v (`q /= ...`, `masked_fill_`): the caller still needs them, and in a model they "
    "are the KV cache"))


def _gqa_mixups(q, k, v, mask) -> dict:
    n_h, n_kv = q.shape[1], k.shape[1]
    d, d_v = q.shape[-1], v.shape[-1]
    wrong = {
        GQA_ROUND_ROBIN: lambda: _gqa64(q, k, v, mask, kv_index=[h % n_kv for h in range(n_h)]),
        GQA_DIVIDED_BY_N_KV:
            lambda: _gqa64(q, k, v, mask, kv_index=[h // n_kv for h in range(n_h)]),
        NO_SCALE: lambda: _gqa64(q, k, v, mask, scale=1.0),
        SCALE_BY_D: lambda: _gqa64(q, k, v, mask, scale=1 / d),
        # N_h is a product of small primes and D_h a larger prime (or, for MHA, another size),
        # so N_h * D_h is never D_h or D_h squared: this scale is told apart from the others.
        SCALE_BY_H: lambda: _gqa64(q, k, v, mask, scale=1 / math.sqrt(n_h * d)),
        SCALE_INT: lambda: _gqa64(q, k, v, mask, scale=1 / math.isqrt(d)),
        SCALE_BY_D_V: lambda: _gqa64(q, k, v, mask, scale=1 / math.sqrt(d_v)),
        SCALED_WEIGHTS: lambda: _gqa64(q, k, v, mask, scale=1.0, after=1 / math.sqrt(d)),
        SOFTMAX_QUERIES: lambda: _gqa64(q, k, v, mask, softmax_dim=-2),
        SQUEEZED: lambda: _gqa64(q, k, v, mask).squeeze(),
    }
    if mask is not None:
        wrong.update({
            IGNORED_MASK: lambda: _gqa64(q, k, v, mask, mask_mode="ignore"),
            MASK_INVERTED: lambda: _gqa64(q, k, v, mask, mask_mode="inverted"),
            MASK_ADDED: lambda: _gqa64(q, k, v, mask, mask_mode="added"),
            MASK_AFTER: lambda: _gqa64(q, k, v, mask, mask_mode="after"),
            NAN_ROWS: lambda: _gqa64(q, k, v, mask, masked_rows="nan"),
            MEAN_ROWS: lambda: _gqa64(q, k, v, mask, masked_rows="mean"),
        })
    return wrong


def _run_gqa(c: Check, watch: _Watch, sizes, *, mask_kind=None, dtype=torch.float32,
             q_scale=1.0, detect=True, label="GQA"):
    b, n_kv, g, s_q, s_k, d, d_v = sizes
    n_h = n_kv * g
    q = c.randn(b, n_h, s_q, d, dtype=dtype, scale=q_scale)
    k = c.randn(b, n_kv, s_k, d, dtype=dtype)
    v = c.randn(b, n_kv, s_k, d_v, dtype=dtype)
    if mask_kind == "causal":
        mask = ref.causal_mask(s_q, s_k)
    elif mask_kind == "padding":
        keep = torch.ones(b, s_k, dtype=torch.bool)
        for i in range(b):  # right padding of a different length per sequence
            keep[i, s_k - c.randint(0, s_k // 2 + 1):] = False
        mask = ref.padding_mask(keep)
    elif mask_kind == "per_head":
        mask = torch.rand(b, n_h, s_q, s_k, generator=c.gen) < 0.6
        mask[:, :, :, c.randint(0, s_k)] = True
        mask[0, c.randint(0, n_h), c.randint(0, s_q)] = False  # a fully masked row
        mask[b - 1, n_h - 1, s_q - 1] = False
    else:
        mask = None
    g_ok = detect and g > 1
    watch.divisors = tuple({g * s_k * d, g * s_k * d_v}) if g_ok else ()
    watch.sizes_text = (f"B={b}, N_h={n_h}, N_kv={n_kv}, G={g}, S_q={s_q}, S_k={s_k}, D={d}, "
                        f"D_v={d_v}")
    args = (q, k, v) if mask is None else (q, k, v, mask)
    c.errors = (_mask_on_folded(g, s_q),) if mask is not None and g > 1 else ()
    got = c.call(*args)
    watch.divisors = ()
    if isinstance(got, tuple):
        c.fail(_("returned a tuple of {count} items; return only the output tensor "
                 "[B, N_h, S_q, D_v].").format(count=len(got)), RETURNED_TUPLE)
    shown = _("no mask") if mask is None else _(_MASK_KINDS[mask_kind]).format(
        shape=list(mask.shape))
    want = ref.grouped_query_attention(q, k, v, mask)
    atol = _large_score_atol(q, k, v) if q_scale > 1 else None
    if q_scale > 1:
        _expect_stable(c, got, want, q, k, mask, atol)
    what = _("output for {case} ({sizes}; {dtype}; {mask})").format(
        case=_(label), sizes=watch.sizes_text, dtype=dtype, mask=shown)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
        c.fail(_("{what} has dtype {got}, expected {want}.").format(
            what=what, got=got.dtype, want=want.dtype), GQA_DTYPE)
    try:
        c.expect_tensor(got, want, what=what, dims=("B", "N_h", "S_q", "D_v"),
                        wrong=_gqa_mixups(q, k, v, mask), atol=atol)
    except CheckFailure as failure:
        if failure.hint is not None or not isinstance(got, torch.Tensor) \
                or got.shape != want.shape:
            raise
        raise failure.with_hint(_gqa_property(got, want, mask, atol)) from None


FULLY_MASKED_WRONG = Mistake("fully_masked_rows_not_zero", N_(
    "only the fully masked query rows are wrong: a query that may attend to no key gets all-zero "
    "weights, so its output row is zeros"))
SOME_HEADS_WRONG = Mistake("some_query_heads_wrong", N_(
    "the output is right for query heads {right} and wrong for {wrong}: check which KV head each "
    "query head reads (h // G) and how the mask's head axis lines up with the query heads"))


def _gqa_property(got, want, mask, atol) -> Mistake | None:
    """When no known mistake reproduces the output: which rows or heads are wrong, if only some
    are (fully masked rows, some query heads)."""
    atol_, rtol = tolerance(want.dtype)
    diff = (got.detach().double() - want.double()).abs()
    bad = (~(diff <= (atol or atol_) + rtol * want.double().abs())).any(-1)  # [B, N_h, S_q]
    if mask is not None:
        empty = ~mask.bool().expand(*bad.shape, mask.shape[-1]).any(-1)
        if empty.any() and not (bad & ~empty).any():
            return FULLY_MASKED_WRONG
    heads = bad.any(-1).any(0)
    if heads.any() and not heads.all():
        right = [h for h in range(len(heads)) if not heads[h]]
        wrong = [h for h in range(len(heads)) if heads[h]]
        return SOME_HEADS_WRONG.with_text(_(SOME_HEADS_WRONG).format(right=right, wrong=wrong))
    return None


_MASK_KINDS = {"causal": N_("causal mask {shape}"), "padding": N_("padding mask {shape}"),
               "per_head": N_("per_head mask {shape}")}


def _large_score_atol(q, k, v) -> float:
    """Scores of a few hundred carry a rounding error of about |score| * eps, and a correct
    softmax passes it on to the output scaled by |v|: a different (correct) order of the float32
    sums lands ~1e-4 away. Overflow gives inf or NaN, and the other mistakes are off by O(1)."""
    biggest = _scores64(q, k).abs().amax().item()
    return tolerance(q.dtype)[0] + 4 * torch.finfo(q.dtype).eps * biggest * v.abs().amax().item()


def _scores64(q, k) -> torch.Tensor:
    """The scaled scores Q Kᵀ / sqrt(D) of every query head in float64, [B, N_h, S_q, S_k]."""
    g = q.shape[1] // k.shape[1]
    scores = q.double() @ k.double().repeat_interleave(g, 1).transpose(-2, -1)
    return scores / math.sqrt(q.shape[-1])


def _expect_stable(c: Check, got, want, q, k, mask, atol: float) -> None:
    """With large scores, inf, NaN or zeros exactly on the rows whose exp() overflows (or
    underflows to all zeros) mean a softmax that does not subtract the row maximum."""
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype):
        return
    scores = _scores64(q, k)
    allowed = (torch.ones_like(scores, dtype=torch.bool) if mask is None
               else mask.bool().expand(scores.shape))
    live = scores.masked_fill(~allowed, float("-inf"))
    info = torch.finfo(q.dtype)
    # The sum of the exponentials overflows (log-sum-exp beyond the largest float), or every
    # one of them underflows to zero; a margin covers rounding near both edges.
    overflow = torch.logsumexp(live, -1) > math.log(info.max) - 0.5
    underflow = live.amax(-1) < math.log(info.smallest_normal * info.eps) + 0.5
    risky = (overflow | underflow) & allowed.any(-1)
    rtol = tolerance(want.dtype)[1]
    diff = (got.double() - want.double()).abs()
    row_ok = ((diff <= atol + rtol * want.double().abs()) & ~got.isnan()).all(-1)
    # What an overflowed softmax leaves behind: inf or NaN, or a row of zeros.
    broken = ~got.isfinite().all(-1) | (got == 0).all(-1)
    if (risky.any() and not row_ok[risky].all() and row_ok[~risky].all()
            and broken[risky & ~row_ok].all()):
        c.fail(_("wrong values (inf, NaN or zeros) exactly on the {count} query rows whose "
                 "scores are large enough to overflow exp() (or to underflow it to all zeros); "
                 "every other row is right.").format(count=int((~row_ok).sum())),
               UNSTABLE)


def check_grouped_query_attention(f, *, seed: int | None = None, thorough: bool = False) -> None:
    # A GQA that looks its KV heads up with the learner's kv_head_index cannot pass before that
    # does: a broken one it calls is named ("fix kv_head_index first").
    with builds_on("grouped_query_attention", {"kv_head_index": check_kv_head_index}), \
            Check("grouped_query_attention", f, seed=seed, forbid=_FORBID_SDPA,
                  in_place=GQA_IN_PLACE) as c:
        watch = _Watch()
        c.fn = _watched(f, watch)
        # Shown in the pass summary (a failure below stops the check before it is displayed).
        for prop in (_("GQA, MQA (N_kv = 1) and MHA (N_kv = N_h), with S_q != S_k"),
                     _("bottom-right causal, padding and per-head masks; fully masked rows "
                       "give 0"),
                     _("repeated K/V never materialised")):
            c.headline(prop)
        _run_gqa(c, watch, _prime_sizes(c, kv_more=True))
        _run_gqa(c, watch, _prime_sizes(c, kv_more=True), mask_kind="causal")
        _run_gqa(c, watch, _prime_sizes(c, n_kv=1), mask_kind="causal", label="MQA (N_kv = 1)")
        b, n_kv, s_q, s_k, d = c.sizes(5, 2, 9)
        s = max(s_q, s_k)
        _run_gqa(c, watch, (b, n_kv, 1, s, s, d, d), mask_kind="causal",
                 label="MHA (N_kv = N_h)")
        _run_gqa(c, watch, _prime_sizes(c, s_q=1), mask_kind="causal",
                 label=N_("a decode step (S_q = 1)"))
        _run_gqa(c, watch, (1, *_prime_sizes(c, s_q=1)[1:]), mask_kind="causal",
                 label=N_("a decode step of a batch of one (B = 1, S_q = 1)"))
        sizes = list(_prime_sizes(c))
        # S_q > S_k: the leading rows see nothing
        sizes[3], sizes[4] = max(sizes[3:5]), min(sizes[3:5])
        _run_gqa(c, watch, tuple(sizes), mask_kind="causal",
                 label=N_("S_q > S_k, whose first rows are fully masked"))
        _run_gqa(c, watch, _prime_sizes(c), mask_kind="per_head",
                 label=N_("a per-head mask with fully masked rows"))
        _run_gqa(c, watch, _prime_sizes(c), mask_kind="padding", label=N_("a padding mask"))
        _run_gqa(c, watch, _prime_sizes(c), q_scale=60.0, mask_kind="causal",
                 label=N_("large scores (up to a few hundred)"))
        _run_gqa(c, watch, _prime_sizes(c), mask_kind="causal", dtype=torch.float64)
        for _n in range(4 if thorough else 0):
            _run_gqa(c, watch, _prime_sizes(c), mask_kind=c.choice([None, "causal", "per_head"]))
            _run_gqa(c, watch, _prime_sizes(c, n_kv=1), mask_kind="causal", label="MQA")


# --------------------------------------------------------------------------------------------
# Exercise 4: kv_cache_bytes


NO_FACTOR_2 = Mistake("forgot_k_and_v", N_("forgot the factor 2: the cache holds both K and V"))
BITS = Mistake("counted_bits", N_("counted bits, not bytes (multiplied by 8)"))
GIB = Mistake("returned_gib", N_("returned GiB; return the exact number of bytes as an int"))
MIB = Mistake("returned_mib", N_("returned MiB; return the exact number of bytes as an int"))
GB = Mistake("returned_gb", N_("returned GB (divided by 10**9); return the exact number of bytes "
                               "as an int"))
CACHE_FLOAT = Mistake("returned_a_float", N_(
    "returned a float; the byte count is an exact int (avoid `/` and float factors)"))
NO_LAYERS = Mistake("left_out_layers", N_(
    "left out the number of layers L: every layer keeps its own K and V"))
NO_BATCH = Mistake("left_out_batch", N_(
    "left out the batch size B: every sequence keeps its own cache"))
NO_SEQ_LEN = Mistake("left_out_seq_len", N_(
    "left out the sequence length S: the cache keeps K and V for every token"))
ELEMENTS = Mistake("counted_elements", N_(
    "counted elements, not bytes: multiply by bytes_per_elem (1 for int8, 2 for fp16, 4 for "
    "fp32)"))
FP16_BYTES = Mistake("hard_coded_fp16", N_("hard-coded 2 bytes per element (fp16); use "
                                           "bytes_per_elem"))
BYTES_TWICE = Mistake("bytes_per_elem_twice", N_("multiplied by bytes_per_elem twice"))


def check_kv_cache_bytes(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("kv_cache_bytes", f, seed=seed) as c:
        c.headline(_("2 L B S N_kv D_h s, exact"))
        c.headline(_("the article's LLaMA-2-7B numbers: MHA, GQA 1/4, MQA 1/32"))
        cases = []
        # 1 byte first (fp8/int8), then 4 (fp32): 2-byte slips then differ from a missing 2.
        # Distinct odd sizes: leaving out any one factor gives its own number.
        for nbytes in [1, 4] + [c.choice([1, 4]) for _n in range(4 if thorough else 0)]:
            n_layers, batch, n_kv, head_dim = (2 * n + 1 for n in c.sizes(4, 1, 20))
            cases.append((n_layers, batch, 2 * c.randint(25, 2500) + 1, n_kv, head_dim, nbytes))
        # The article's LLaMA-2-7B shapes in fp16 at 4096 tokens: MHA, GQA (N_kv = 8), MQA.
        cases += [(32, 1, 4096, 32, 128, 2), (32, 1, 4096, 8, 128, 2), (32, 1, 4096, 1, 128, 2)]
        for args in cases:
            want = ref.kv_cache_bytes(*args)
            got = c.call(*args)
            try:
                c.expect_equal(got, want,
                               what="kv_cache_bytes(n_layers={}, batch={}, seq_len={}, "
                                    "n_kv_heads={}, head_dim={}, bytes_per_elem={})".format(*args),
                               wrong=_cache_mixups(args, want))
            except CheckFailure as failure:
                raise failure.with_hint(failure.hint or _cache_factor(got, want)) from None


OFF_BY_A_FACTOR = Mistake("off_by_a_factor", N_(
    "your count is {ratio} times the right one, 2 * L * B * S * N_kv * D_h * bytes_per_elem: "
    "check each factor (one left out, counted twice, or off by one)"))


def _cache_factor(got, want: int) -> Mistake | None:
    if not isinstance(got, numbers.Real) or isinstance(got, bool) or not 0 < got != want:
        return None
    ratio = got / want
    shown = f"{ratio:.4g}" if ratio >= 1 else f"1/{1 / ratio:.4g}"
    return OFF_BY_A_FACTOR.with_text(_(OFF_BY_A_FACTOR).format(ratio=shown))


def _cache_mixups(args, want: int) -> dict:
    n_layers, batch, seq_len, n_kv, head_dim, nbytes = args
    return {
        NO_FACTOR_2: want // 2,
        BITS: want * 8,
        GIB: want / 2**30,
        MIB: want / 2**20,
        GB: want / 10**9,
        CACHE_FLOAT: float(want),
        NO_LAYERS: want // n_layers,
        NO_BATCH: want // batch,
        NO_SEQ_LEN: want // seq_len,
        FP16_BYTES: want // nbytes * 2 if nbytes != 2 else None,
        ELEMENTS: want // nbytes if nbytes != 1 else None,
        BYTES_TWICE: want * nbytes if nbytes != 1 else None,
    }


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "06.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "kv_head_index": (
        FROM_ONE, DIVIDED_BY_N_H, DIVIDED_BY_N_KV, FLOAT_INDEX, GROUP_UPSIDE_DOWN, TENSOR_INDEX,
        QUERY_HEAD_ITSELF, ROUND_ROBIN, ROUNDED, ROUNDED_UP),
    "repeat_kv": (
        REPEAT_DTYPE, REPEAT_IN_PLACE, HEAD_ORDER, REPEAT_AXIS_KEPT, NO_DIM, BATCH_AXIS,
        FEATURE_AXIS, SEQUENCE_AXIS, UNCHANGED, TILED, VIEW_OF_EXPANDED),
    "grouped_query_attention": (
        BROADCAST_MATMUL, CALLS_SDPA, GQA_IN_PLACE, GQA_DTYPE, COPIED_KV, GQA_DIVIDED_BY_N_KV,
        FILLED_KV, fix_first('kv_head_index'), MEAN_ROWS, NAN_ROWS, FULLY_MASKED_WRONG,
        IGNORED_MASK, INDEXED_KV, EXPANDED_CONTIGUOUS, MASK_ON_FOLDED, MASK_AFTER, NO_SCALE,
        RETURNED_TUPLE, GQA_ROUND_ROBIN, SCALE_INT, SCALED_WEIGHTS, SCALE_BY_H, SCALE_BY_D_V,
        SOFTMAX_QUERIES, SOME_HEADS_WRONG, SQUEEZED, UNSTABLE, SCALE_BY_D, MASK_INVERTED,
        MASK_ADDED, FED_EXPANDED_KV),
    "kv_cache_bytes": (
        BITS, ELEMENTS, NO_FACTOR_2, FP16_BYTES, NO_BATCH, NO_LAYERS, NO_SEQ_LEN, OFF_BY_A_FACTOR,
        CACHE_FLOAT, GB, GIB, MIB, BYTES_TWICE),
}
