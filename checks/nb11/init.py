"""The random-initialisation check shared by chapter 11 (init_block_params) and chapter 12
(init_model_params): one set of rules, bands and mistakes for "norm scales at one, every weight
matrix drawn from N(0, 0.02^2) with the given generator, every tensor its own".

A mistake declared here is named by the exercise that failed ("11.init_block_params.std_one",
"12.init_model_params.std_one"): the keys are shared, the ids are the chapter's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..engine import Check
from ..i18n import N_, _
from ..mistakes import Mistake
from ..reference.block import INIT_STD

UNINITIALISED = Mistake("uninitialised_memory", N_(
    "torch.empty leaves memory uninitialised: fill it (normal_) or use torch.randn"))
CONSTANT = Mistake("constant_weights", N_(
    "draw the weight matrices at random: torch.randn(..., generator=generator) * 0.02"))
REPEATED = Mistake("one_draw_repeated", N_(
    "draw the whole matrix at once, one random number per entry (expand() repeats one draw)"))
STD_ONE = Mistake("std_one", N_("std 1: multiply torch.randn(...) by 0.02"))
FAN_IN = Mistake("fan_in_scale", N_(
    "scaled by 1 / sqrt(fan_in); this course draws every matrix with std 0.02 (the default "
    "initializer_range of Hugging Face's LlamaConfig)"))
UNIFORM = Mistake("uniform_draw", N_(
    "uniform in [-0.02, 0.02] has std 0.0115: draw from a normal with std 0.02"))
WRONG_STD = Mistake("wrong_std", N_("draw from a normal distribution with mean 0 and std 0.02"))
NONZERO_MEAN = Mistake("nonzero_mean", N_(
    "draw from a normal with mean 0 (torch.rand is uniform on [0, 1))"))
NORM_ZEROS = Mistake("norm_at_zero", N_(
    "initialised to zeros: a zero scale wipes out the sublayer's input"))
SAME_DRAW = Mistake("same_draw_twice", N_(
    "draw each matrix separately: the same draw used twice (or one tensor under two names) makes "
    "the two projections identical"))
SHARED = Mistake("one_tensor_two_names", N_(
    "each parameter needs a tensor of its own: one tensor under two names (`b = a`, or one "
    "torch.ones(...) used for both) changes with the other as soon as either is trained; create "
    "each with its own torch.ones(...) or torch.randn(...)"))
GENERATOR_IGNORED = Mistake("generator_ignored", N_(
    "draw every random number from the `generator` argument: torch.randn(..., "
    "generator=generator)"))
FIXED_SEED = Mistake("fixed_seed_inside", N_(
    "the weights must come from the `generator` argument; a fixed seed (torch.manual_seed) inside "
    "the function makes them constant"))
NONE_NOT_GLOBAL = Mistake("none_not_global_generator", N_(
    "with generator=None draw from torch's global generator (torch.randn(..., generator=None) "
    "does)"))
NONE_FRESH = Mistake("new_generator_when_none", N_(
    "with generator=None draw from torch's global generator, which moves on after every draw; a "
    "new torch.Generator() (or a fixed seed) starts from the same state every time"))


def expect_ones(c: Check, t: torch.Tensor, where: str, label: str, hint: Mistake) -> None:
    """A norm's scale: all ones (`hint` names what the chapter says otherwise)."""
    if not bool((t.detach() == 1).all()):
        c.fail(_("{name} should be all ones ({case}).").format(name=where, case=label),
               NORM_ZEROS if bool((t.detach() == 0).all()) else hint)


def expect_random_matrix(c: Check, t: torch.Tensor, where: str, label: str) -> None:
    """A weight matrix drawn from N(0, 0.02^2): finite, not constant, no repeated row or column,
    its standard deviation within seven standard errors (about std / sqrt(2n), and never under
    15%) of 0.02 and its mean within seven of 0: a correct draw of >= 500 entries never fails."""
    t = t.detach().double()
    if not bool(t.isfinite().all()):
        c.fail(_("{name} holds NaN or inf ({case}).").format(name=where, case=label),
               UNINITIALISED)
    mean, std, n = float(t.mean()), float(t.std()), t.numel()
    if std == 0:
        c.fail(_("every entry of {name} is {value} ({case}).").format(
            name=where, value=f"{float(t.flatten()[0]):g}", case=label), CONSTANT)
    rows_equal = t.shape[0] > 1 and bool((t[0] == t[1]).all())
    cols_equal = t.shape[1] > 1 and bool((t[:, 0] == t[:, 1]).all())
    if rows_equal or cols_equal:
        repeats = (_("{name} repeats the same row ({case}).") if rows_equal else
                   _("{name} repeats the same column ({case})."))
        c.fail(repeats.format(name=where, case=label), REPEATED)
    band = max(0.15, 7 / math.sqrt(2 * n))
    if not ((1 - band) * INIT_STD <= std <= (1 + band) * INIT_STD):
        if 0.75 <= std <= 1.25:
            hint = STD_ONE
        elif abs(std * math.sqrt(t.shape[0]) - 1) < 0.25:
            hint = FAN_IN
        elif abs(std - INIT_STD / math.sqrt(3)) < 0.15 * INIT_STD:
            hint = UNIFORM
        else:
            hint = WRONG_STD
        c.fail(_("{name} has standard deviation {std}, expected about {want} ({case}).").format(
            name=where, std=f"{std:.4g}", want=INIT_STD, case=label), hint)
    if abs(mean) > 7 * INIT_STD / math.sqrt(n):
        c.fail(_("{name} has mean {mean}, expected about 0 ({case}).").format(
            name=where, mean=f"{mean:.4g}", case=label), NONZERO_MEAN)


def expect_own_tensors(c: Check, tensors: list[tuple[str, torch.Tensor]], label: str) -> None:
    """No tensor is another one under a second name (the same memory)."""
    seen: dict[tuple, str] = {}
    for where, t in tensors:
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if t.numel() and key in seen:
            c.fail(_("{a} and {b} are one tensor under two names ({case}).").format(
                a=seen[key], b=where, case=label), SHARED)
        seen.setdefault(key, where)


def expect_generator_use(c: Check, cfg, label: str, *, layout: Callable, values: Callable,
                         tensors: Callable, randoms: Callable, local: bool,
                         blame: Callable[[list[str]], Mistake | None] = lambda names: None) -> None:
    """The same seed gives the same weights, another seed other weights; `layout(p, label)` and
    `values(p, label)` check one result, `tensors(p)` lists (name, tensor) of every tensor,
    `randoms(p)` of the random ones; `blame(names)` may name the mistake behind differing
    tensors."""
    s = c.randint(0, 2**31 - 1)
    got = c.call(cfg, generator=torch.Generator().manual_seed(s))
    layout(got, label)
    values(got, label)
    again = c.call(cfg, generator=torch.Generator().manual_seed(s))
    layout(again, label)
    differ = [w for (w, a), (_w, b) in zip(tensors(got), tensors(again)) if not torch.equal(a, b)]
    if differ:
        names = ", ".join(differ[:3]) + (" ..." if len(differ) > 3 else "")
        c.fail(_("two generators seeded alike ({seeded}) gave different {names} ({case}).")
               .format(seeded=f"torch.Generator().manual_seed({s})", names=names, case=label),
               blame(differ) or GENERATOR_IGNORED)
    other = c.call(cfg, generator=torch.Generator().manual_seed(s + 1))
    layout(other, label)
    same = [w for (w, a), (_w, b) in zip(randoms(got), randoms(other)) if torch.equal(a, b)]
    if same:
        c.fail(_("generators with different seeds gave the same {names} ({case}).").format(
            names=", ".join(same[:3]), case=label), FIXED_SEED)


def expect_global_generator(c: Check, cfg, label: str, *, layout: Callable, values: Callable,
                            tensors: Callable, randoms: Callable, local: bool) -> None:
    """generator=None draws from torch's global generator: two calls in a row differ, and (when
    the function runs in this process, whose global generator the check can seed) two calls
    after the same torch.manual_seed agree."""
    first, second = c.call(cfg), c.call(cfg)
    for p in (first, second):
        layout(p, label)
    values(first, label)
    same = [w for (w, a), (_w, b) in zip(randoms(first), randoms(second)) if torch.equal(a, b)]
    if same:
        c.fail(_("with generator=None, two calls in a row gave the same {names}.").format(
            names=", ".join(same[:3])), NONE_FRESH)
    if not local:
        return
    state = torch.get_rng_state()
    try:
        s = c.randint(0, 2**31 - 1)
        torch.manual_seed(s)
        first = c.call(cfg)
        torch.manual_seed(s)
        second = c.call(cfg)
    finally:
        torch.set_rng_state(state)
    layout(second, label)
    differ = [w for (w, a), (_w, b) in zip(tensors(first), tensors(second))
              if not torch.equal(a, b)]
    if differ:
        c.fail(_("with generator=None, two calls after the same torch.manual_seed gave "
                 "different {names}.").format(names=", ".join(differ[:3])), NONE_NOT_GLOBAL)
