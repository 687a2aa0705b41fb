"""Checks for chapter 01: notation (the symbol table as code)."""

from __future__ import annotations

import dataclasses

import torch

from . import reference as ref
from .config import LLAMA2_7B, ModelConfig
from .engine import Check, LearnerError
from .i18n import N_, _

TENSOR_NAMES = ("token_ids", "hidden", "q", "k", "v", "scores", "attn_weights", "attn_out",
                "ffn_mid", "logits", "kv_cache_layer")


def _random_config(c: Check, *, decoupled_head_dim: bool = False) -> ModelConfig:
    """A valid config whose sizes are all different, so swapped symbols give wrong answers."""
    n_kv = c.choice([1, 2, 3])
    n_heads = n_kv * c.choice([2, 4])
    head_dim = 2 * c.randint(3, 9)
    hidden = n_heads * head_dim
    explicit = head_dim + 2 * c.randint(1, 4) if decoupled_head_dim else None
    return ModelConfig(vocab_size=c.randint(500, 1000), hidden_size=hidden, n_heads=n_heads,
                       n_kv_heads=n_kv, head_dim=explicit, ffn_hidden_size=c.randint(100, 200),
                       n_layers=c.randint(2, 6), max_seq_len=c.randint(300, 400))


def check_head_dim(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("head_dim", f, seed=seed) as c:
        c.expect_equal(c.call(LLAMA2_7B), 128, what="head_dim(LLAMA2_7B)",
                       wrong=_symbol_mixups(dataclasses.replace(LLAMA2_7B, n_kv_heads=8), 128))
        for _n in range(8 if thorough else 3):
            cfg = _random_config(c)
            c.expect_equal(c.call(cfg), ref.head_dim(cfg),
                           what=_("head_dim for {config}").format(config=_short(cfg)),
                           wrong=_symbol_mixups(cfg, ref.head_dim(cfg)))
        cfg = _random_config(c, decoupled_head_dim=True)
        c.expect_equal(c.call(cfg), ref.head_dim(cfg),
                       what=_("head_dim for a config that sets head_dim={head_dim} itself")
                       .format(head_dim=cfg.head_dim),
                       wrong={_("recomputed hidden_size // n_heads although the config sets "
                                "head_dim explicitly; return cfg.head_dim"):
                              cfg.hidden_size // cfg.n_heads})


def check_kv_group_size(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("kv_group_size", f, seed=seed) as c:
        # Distinct N_h and N_kv first, so that each confusion gives a different wrong answer.
        cases = [dataclasses.replace(LLAMA2_7B, n_kv_heads=8), LLAMA2_7B,
                 dataclasses.replace(LLAMA2_7B, n_kv_heads=1)]
        cases += [_random_config(c) for _n in range(6 if thorough else 2)]
        for cfg in cases:
            want = ref.kv_group_size(cfg)
            c.expect_equal(c.call(cfg), want,
                           what=_("kv_group_size for N_h={n_heads}, N_kv={n_kv_heads}").format(
                               n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads),
                           wrong={_("divided the wrong way round: G = N_h / N_kv"):
                                  cfg.n_kv_heads // cfg.n_heads,
                                  _(FLOAT): float(want),
                                  _("returned N_kv: G counts query heads per KV head"):
                                  cfg.n_kv_heads,
                                  _("returned N_h: G counts query heads per KV head"):
                                  cfg.n_heads})


# (field changes, fields the error message must name, what the rule is)
def _broken_configs(good: ModelConfig, c: Check):
    yield (dict(hidden_size=good.hidden_size + 1, head_dim=good.head_dim),
           ("hidden_size", "n_heads"), _("hidden_size divisible by n_heads"))
    yield (dict(n_kv_heads=good.n_heads + 1), ("n_heads", "n_kv_heads"),
           _("n_heads divisible by n_kv_heads"))
    odd = good.head_dim - 1
    yield dict(rotary_dim=odd), ("rotary_dim",), _("rotary_dim even")
    yield dict(rotary_dim=good.head_dim + 2), ("rotary_dim", "head_dim"), "rotary_dim <= head_dim"
    for name in ("vocab_size", "ffn_hidden_size", "n_layers", "max_seq_len"):
        yield {name: c.choice([0, -4])}, (name,), _("{name} positive").format(name=name)
    yield dict(n_heads=0, head_dim=8, rotary_dim=8), ("n_heads",), \
        _("{name} positive").format(name="n_heads")


def check_validate_config(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("validate_config", f, seed=seed) as c:
        valid = [LLAMA2_7B, dataclasses.replace(LLAMA2_7B, n_kv_heads=8),
                 dataclasses.replace(LLAMA2_7B, n_kv_heads=1),
                 dataclasses.replace(LLAMA2_7B, rotary_dim=64)]
        valid += [_random_config(c) for _n in range(4 if thorough else 2)]
        for cfg in valid:
            try:
                c.call(cfg)
            except LearnerError as err:
                c.fail(_("rejected a valid config ({config}, rotary_dim={rotary_dim}): {error}")
                       .format(config=_short(cfg), rotary_dim=cfg.rotary_dim, error=err.summary()))
        c.note(_("valid configs accepted"))
        good = _random_config(c)
        for changes, fields, rule in _broken_configs(good, c):
            _expect_value_error(c, dataclasses.replace(good, **changes), fields, rule, changes)
        c.note(_("each broken rule raises ValueError naming it"))


def _expect_value_error(c: Check, cfg: ModelConfig, fields, rule: str, changes: dict) -> None:
    shown = ", ".join(f"{k}={v}" for k, v in changes.items())
    try:
        c.call(cfg)
    except LearnerError as err:
        # err.message is the engine's English ("raised ValueError: ..."), whatever the language
        first = err.message.splitlines()[0]
        if not first.startswith("raised ValueError"):
            hint = (_("check that sizes are positive before dividing by them")
                    if "ZeroDivisionError" in first else None)
            c.fail(_("a config with {changes} should raise ValueError ({rule}), but it {error}")
                   .format(changes=shown, rule=rule, error=err.summary()), hint)
        text = first.lower()
        if not any(name in text for name in fields):
            c.fail(_("for a config with {changes} the ValueError should name the broken rule "
                     "({rule}) by its field name ({fields}); the message was: {text}").format(
                changes=shown, rule=rule, fields=_(" or ").join(fields),
                text=repr(first.removeprefix("raised ValueError: "))))
        return
    c.fail(_("accepted a broken config ({changes}); it should raise ValueError ({rule}).").format(
        changes=shown, rule=rule))


def check_tensor_shape(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("tensor_shape", f, seed=seed) as c:
        b, s = c.sizes(2, 2, 9)
        configs = [_random_config(c) for _n in range(3 if thorough else 1)]
        configs.append(dataclasses.replace(LLAMA2_7B, n_kv_heads=8))
        # head_dim set explicitly, so N_h * D_h != H: attn_out and the per-head shapes must
        # read cfg.head_dim instead of assuming H / N_h
        configs += [_random_config(c, decoupled_head_dim=True)
                    for _n in range(2 if thorough else 1)]
        for cfg in configs:
            for name in TENSOR_NAMES:
                want = ref.tensor_shape(name, cfg, b, s)
                got = c.call(name, cfg, b, s)
                if isinstance(got, (list, torch.Size)):
                    got = tuple(got)  # a list or torch.Size of the right sizes is fine too
                c.expect_equal(got, want, what=_("tensor_shape({name}) with B={b}, S={s}, "
                                                 "{config}").format(name=repr(name), b=b, s=s,
                                                                    config=_short(cfg)),
                               wrong=_shape_mixups(name, cfg, b, s))
        try:
            c.call("not_a_tensor", configs[0], b, s)
        except LearnerError as err:
            if "KeyError" not in err.message.splitlines()[0]:
                c.fail(_("an unknown name should raise KeyError, but it {error}").format(
                    error=err.summary()))
        else:
            c.fail(_("an unknown name ('not_a_tensor') should raise KeyError, not return a "
                     "shape."))
        c.note(_("unknown names raise KeyError"))


# Messages kept in constants: marked with N_ here, translated with _() where they are used.
ATTN_OUT_IS_H = N_("attn_out is the heads' outputs side by side, N_h * D_h wide; that equals H "
                   "only when D_h = H / N_h, and this config sets head_dim itself: use "
                   "cfg.n_heads * cfg.head_dim")
RECOMPUTED_D_H = N_("recomputed the head width as H // N_h although the config sets head_dim "
                    "itself; read cfg.head_dim")
FLOAT = N_("returned a float: use integer division `//`")


def _short(cfg: ModelConfig) -> str:
    return (f"H={cfg.hidden_size}, N_h={cfg.n_heads}, N_kv={cfg.n_kv_heads}, D_h={cfg.head_dim}")


def _symbol_mixups(cfg: ModelConfig, want: int) -> dict:
    return {_(FLOAT): float(want),
            _("divided by N_kv instead of N_h"): cfg.hidden_size // cfg.n_kv_heads,
            _("returned H, the whole hidden size, not one head's share"): cfg.hidden_size}


def _shape_mixups(name: str, cfg: ModelConfig, b: int, s: int) -> dict:
    """Shapes that the common confusions produce for tensor `name`."""
    nh, nkv, d, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_size
    heads_first = _("per-head tensors are heads-first [B, N, S, D_h]")
    kv_heads = _("K and V have N_kv heads, not N_h")
    mixups = {
        "k": {kv_heads: (b, nh, s, d), heads_first: (b, s, nkv, d)},
        "v": {kv_heads: (b, nh, s, d), heads_first: (b, s, nkv, d)},
        "q": {_("Q has N_h heads, not N_kv"): (b, nkv, s, d), heads_first: (b, s, nh, d)},
        "hidden": {_("hidden states are [B, S, H], not [B, |V|, H]"): (b, cfg.vocab_size, h)},
        "scores": {_("scores exist per query head: [B, N_h, S, S]"): (b, s, s)},
        "attn_weights": {_("weights exist per query head: [B, N_h, S, S]"): (b, s, s)},
        "attn_out": {_("attn_out is the heads concatenated back: [B, S, N_h * D_h]"):
                     (b, nh, s, d), _(ATTN_OUT_IS_H): (b, s, h)},
        "ffn_mid": {_("the FFN's middle width is H_ff, not H"): (b, s, h)},
        "logits": {_("logits have one score per vocabulary entry: [B, S, |V|]"): (b, s, h)},
        "kv_cache_layer": {_("the cache keeps N_kv heads, not N_h"): (2, b, nh, s, d),
                           _("K and V are both cached: leading 2"): (b, nkv, s, d)},
    }
    found = mixups.get(name, {})
    if d != h // nh:  # only then is a recomputed head width visible
        recomputed = _shape_with_head_dim(name, cfg, b, s, h // nh)
        if recomputed is not None:
            found[_(RECOMPUTED_D_H)] = recomputed
    return found


def _shape_with_head_dim(name: str, cfg: ModelConfig, b: int, s: int, d: int):
    """The per-head shapes computed with head width `d` (None for other tensors)."""
    nh, nkv = cfg.n_heads, cfg.n_kv_heads
    return {"q": (b, nh, s, d), "k": (b, nkv, s, d), "v": (b, nkv, s, d),
            "attn_out": (b, s, nh * d), "kv_cache_layer": (2, b, nkv, s, d)}.get(name)
