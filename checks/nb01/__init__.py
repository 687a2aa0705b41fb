"""Checks for chapter 01: notation (the symbol table as code)."""

from __future__ import annotations

import dataclasses

import torch

from .. import reference as ref
from ..config import LLAMA2_7B, ModelConfig
from ..engine import Check, LearnerError
from ..i18n import N_, _
from ..mistakes import Mistake

TENSOR_NAMES = ("token_ids", "hidden", "q", "k", "v", "scores", "attn_weights", "attn_out",
                "ffn_mid", "logits", "kv_cache_layer")

# --------------------------------------------------------------------------------------------
# The mistakes this chapter's checks name

FLOAT = Mistake("float_division", N_("returned a float: use integer division `//`"))
DIVIDED_BY_N_KV = Mistake("divided_by_n_kv_heads", N_("divided by N_kv instead of N_h"))
RETURNED_H = Mistake("returned_hidden_size",
                     N_("returned H, the whole hidden size, not one head's share"))
IGNORED_HEAD_DIM = Mistake("ignored_explicit_head_dim", N_(
    "recomputed hidden_size // n_heads although the config sets head_dim explicitly; return "
    "cfg.head_dim"))

GROUP_INVERTED = Mistake("divided_wrong_way_round",
                         N_("divided the wrong way round: G = N_h / N_kv"))
GROUP_IS_N_KV = Mistake("returned_n_kv_heads",
                        N_("returned N_kv: G counts query heads per KV head"))
GROUP_IS_N_H = Mistake("returned_n_heads", N_("returned N_h: G counts query heads per KV head"))
GROUP_DIFFERENCE = Mistake("subtracted_head_counts", N_(
    "subtracted the head counts: G = N_h / N_kv is how many query heads share one KV head"))

# validate_config: one mistake per rule that a learner's function lets through
ACCEPTS_INDIVISIBLE_HEADS = Mistake("accepts_indivisible_heads", N_(
    "hidden_size must be divisible by n_heads: raise ValueError when hidden_size % n_heads != 0"))
ACCEPTS_INDIVISIBLE_KV_HEADS = Mistake("accepts_indivisible_kv_heads", N_(
    "n_heads must be divisible by n_kv_heads (each KV head serves a whole group of query "
    "heads): raise ValueError when n_heads % n_kv_heads != 0"))
KV_HEADS_COMPARED = Mistake("compares_kv_heads_instead_of_divisibility", N_(
    "checked only n_kv_heads <= n_heads: 6 query heads cannot share 4 KV heads in equal "
    "groups; the rule is n_heads % n_kv_heads == 0"))
KV_DIVIDES_HIDDEN = Mistake("divides_hidden_size_by_kv_heads", N_(
    "checked hidden_size % n_kv_heads: the groups are made of query heads, so the rule is "
    "n_heads % n_kv_heads == 0"))
ACCEPTS_ODD_ROTARY = Mistake("accepts_odd_rotary_dim", N_(
    "rotary_dim must be even: RoPE rotates features in pairs"))
ACCEPTS_LONG_ROTARY = Mistake("accepts_rotary_dim_over_head_dim", N_(
    "rotary_dim must be at most head_dim: RoPE rotates features of one head"))
ACCEPTS_NONPOSITIVE = Mistake("accepts_nonpositive_size", N_(
    "every size must be positive: check each of them (vocab_size, hidden_size, n_heads, "
    "n_kv_heads, head_dim, ffn_hidden_size, n_layers, rotary_dim, max_seq_len) with `<= 0`"))
ACCEPTS_ZERO = Mistake("accepts_zero_size", N_(
    "a size of 0 is not positive either: test `<= 0`, not `< 0`"))
DIVIDES_BEFORE_CHECKING = Mistake("divides_before_checking_positive", N_(
    "check that sizes are positive before dividing by them"),
    raises=[("ZeroDivisionError", None)])
ASSERTS = Mistake("asserts_instead_of_raising", N_(
    "used `assert`: raise ValueError(...) naming the broken rule (assertions can be switched "
    "off, and the caller expects ValueError)"), raises=[("AssertionError", None)])
OTHER_EXCEPTION = Mistake("raises_other_exception", N_(
    "raise ValueError for a broken config, not another exception"))
NAMES_NO_FIELD = Mistake("error_names_no_field", N_(
    "name the broken rule in the error message by its field names, e.g. "
    "ValueError(\"hidden_size must be divisible by n_heads\")"))
REJECTS_GQA = Mistake("rejects_grouped_kv_heads", N_(
    "rejected n_kv_heads != n_heads: grouped-query (N_kv < N_h) and multi-query (N_kv = 1) "
    "configs are valid whenever n_heads % n_kv_heads == 0"))
REJECTS_PARTIAL_ROTARY = Mistake("rejects_partial_rotary", N_(
    "rejected rotary_dim < head_dim: rotating only the first rotary_dim features of each head "
    "is valid (rotary_dim even and at most head_dim)"))
REJECTS_EXPLICIT_HEAD_DIM = Mistake("rejects_explicit_head_dim", N_(
    "rejected a config whose head_dim is not hidden_size // n_heads: a config may set head_dim "
    "itself; no rule ties it to hidden_size"))
REJECTS_FULL_ROTARY = Mistake("rejects_rotary_dim_equal_head_dim", N_(
    "rejected rotary_dim == head_dim (every feature rotates, the default): the rule is "
    "rotary_dim <= head_dim, not <"))
REJECTS_VALID = Mistake("rejects_valid_config", N_(
    "rejected a config that breaks none of the rules: raise only for the four rules"))

# tensor_shape
HEADS_FIRST = Mistake("tokens_first_per_head", N_(
    "per-head tensors are heads-first [B, N, S, D_h]"))
KV_HEADS = Mistake("kv_with_n_heads", N_("K and V have N_kv heads, not N_h"))
Q_HEADS = Mistake("q_with_n_kv_heads", N_("Q has N_h heads, not N_kv"))
HIDDEN_V = Mistake("hidden_with_vocab", N_("hidden states are [B, S, H], not [B, |V|, H]"))
HIDDEN_NO_BATCH = Mistake("dropped_batch_axis", N_(
    "dropped the batch axis: token_ids is [B, S] and hidden [B, S, H]"))
SCORES_PER_HEAD = Mistake("scores_without_heads", N_(
    "scores exist per query head: [B, N_h, S, S]"))
SCORES_PER_KV_HEAD = Mistake("scores_per_kv_head", N_(
    "scores and weights exist per query head (N_h), not per KV head: [B, N_h, S, S]"))
WEIGHTS_PER_HEAD = Mistake("weights_without_heads", N_(
    "weights exist per query head: [B, N_h, S, S]"))
ATTN_OUT_HEADS = Mistake("attn_out_not_concatenated", N_(
    "attn_out is the heads concatenated back: [B, S, N_h * D_h]"))
ATTN_OUT_IS_H = Mistake("attn_out_as_hidden_size", N_(
    "attn_out is the heads' outputs side by side, N_h * D_h wide; that equals H only when D_h "
    "= H / N_h, and this config sets head_dim itself: use cfg.n_heads * cfg.head_dim"))
FFN_MID_H = Mistake("ffn_mid_with_hidden_size", N_("the FFN's middle width is H_ff, not H"))
LOGITS_H = Mistake("logits_with_hidden_size", N_(
    "logits have one score per vocabulary entry: [B, S, |V|]"))
LOGITS_LAST = Mistake("logits_last_position_only", N_(
    "logits exist for every position, [B, S, |V|], not only for the last one"))
CACHE_N_H = Mistake("cache_with_n_heads", N_("the cache keeps N_kv heads, not N_h"))
CACHE_NO_2 = Mistake("cache_without_k_and_v", N_("K and V are both cached: leading 2"))
RECOMPUTED_D_H = Mistake("recomputed_head_dim", N_(
    "recomputed the head width as H // N_h although the config sets head_dim itself; read "
    "cfg.head_dim"))
UNKNOWN_RETURNS = Mistake("unknown_name_returns", N_(
    "look the name up in a dict of shapes (`shapes[name]`), so that an unknown name raises "
    "KeyError instead of returning something"))
UNKNOWN_OTHER_ERROR = Mistake("unknown_name_other_exception", N_(
    "an unknown name is a missing key: raise KeyError (or let `shapes[name]` raise it)"))


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
                       wrong={IGNORED_HEAD_DIM: cfg.hidden_size // cfg.n_heads})


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
                           wrong={GROUP_INVERTED: cfg.n_kv_heads // cfg.n_heads,
                                  FLOAT: float(want),
                                  GROUP_IS_N_KV: cfg.n_kv_heads,
                                  GROUP_IS_N_H: cfg.n_heads,
                                  GROUP_DIFFERENCE: cfg.n_heads - cfg.n_kv_heads})


# --------------------------------------------------------------------------------------------
# validate_config

# 6 query heads, D_h = 8: with 4 KV heads there are fewer KV heads than query heads and H = 48 is
# divisible by 4, yet the groups are not whole; with D_h = 5 (H = 30) only hidden_size % 4 != 0.
_SIX_HEADS = ModelConfig(vocab_size=700, hidden_size=48, n_heads=6, n_kv_heads=2,
                         ffn_hidden_size=150, n_layers=3, max_seq_len=320)
_SIX_OVER_FOUR = (dataclasses.replace(_SIX_HEADS, n_kv_heads=4),
                  dataclasses.replace(_SIX_HEADS, hidden_size=30, n_kv_heads=4, head_dim=5,
                                      rotary_dim=4))


def _broken_configs(good: ModelConfig):
    """(config, what it changes, fields the error message must name, the rule, the mistake of a
    function that accepts it). Each config breaks one rule only; sizes are made negative where
    every division and comparison goes through, so that a missing positivity check shows
    without an error, then 0."""
    def changed(**changes):
        return (dataclasses.replace(good, **changes),
                ", ".join(f"{k}={v}" for k, v in changes.items()))

    yield (*changed(hidden_size=good.hidden_size + 1, head_dim=good.head_dim),
           ("hidden_size", "n_heads"), _("hidden_size divisible by n_heads"),
           ACCEPTS_INDIVISIBLE_HEADS)
    yield (*changed(rotary_dim=good.head_dim - 1), ("rotary_dim",), _("rotary_dim even"),
           ACCEPTS_ODD_ROTARY)
    yield (*changed(rotary_dim=good.head_dim + 2), ("rotary_dim", "head_dim"),
           "rotary_dim <= head_dim", ACCEPTS_LONG_ROTARY)
    h, n, kv, d = good.hidden_size, good.n_heads, good.n_kv_heads, good.head_dim
    negative = {"vocab_size": dict(vocab_size=-good.vocab_size),
                "hidden_size": dict(hidden_size=-h),
                "n_heads": dict(n_heads=-n, n_kv_heads=-kv),
                "n_kv_heads": dict(n_kv_heads=-kv),
                "head_dim": dict(head_dim=-d, rotary_dim=-d),
                "ffn_hidden_size": dict(ffn_hidden_size=-good.ffn_hidden_size),
                "n_layers": dict(n_layers=-2),
                "rotary_dim": dict(rotary_dim=-2),
                "max_seq_len": dict(max_seq_len=-good.max_seq_len)}
    zero = {"vocab_size": dict(vocab_size=0), "hidden_size": dict(hidden_size=0),
            "head_dim": dict(head_dim=0, rotary_dim=0), "ffn_hidden_size": dict(ffn_hidden_size=0),
            "n_layers": dict(n_layers=0), "rotary_dim": dict(rotary_dim=0),
            "max_seq_len": dict(max_seq_len=0),
            "n_heads": dict(n_heads=0, head_dim=8, rotary_dim=8), "n_kv_heads": dict(n_kv_heads=0)}
    for table, mistake in ((negative, ACCEPTS_NONPOSITIVE), (zero, ACCEPTS_ZERO)):
        for name, changes in table.items():
            # a head_dim <= 0 makes rotary_dim (at most head_dim) non-positive too, and n_kv_heads
            # goes negative with n_heads (so that n_heads % n_kv_heads == 0)
            fields = {"head_dim": ("head_dim", "rotary_dim"),
                      "n_heads": ("n_heads", "n_kv_heads")}.get(name, (name,))
            yield (*changed(**changes), fields, _("{name} positive").format(name=name),
                   mistake)


def check_validate_config(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("validate_config", f, seed=seed, errors=[DIVIDES_BEFORE_CHECKING, ASSERTS]) as c:
        valid = [(LLAMA2_7B, REJECTS_VALID),
                 (dataclasses.replace(LLAMA2_7B, n_kv_heads=8), REJECTS_GQA),
                 (dataclasses.replace(LLAMA2_7B, n_kv_heads=1), REJECTS_GQA),
                 (dataclasses.replace(LLAMA2_7B, rotary_dim=64), REJECTS_PARTIAL_ROTARY),
                 (dataclasses.replace(_SIX_HEADS, head_dim=12), REJECTS_EXPLICIT_HEAD_DIM)]
        valid += [(_random_config(c), REJECTS_VALID) for _n in range(4 if thorough else 2)]
        for cfg, mistake in valid:
            try:
                c.call(cfg)
            except LearnerError as err:
                if mistake is REJECTS_VALID and cfg.rotary_dim == cfg.head_dim and _accepts(
                        c, dataclasses.replace(cfg, rotary_dim=cfg.head_dim - 2)):
                    mistake = REJECTS_FULL_ROTARY
                c.fail(_("rejected a valid config ({config}, rotary_dim={rotary_dim}): {error}")
                       .format(config=_short(cfg), rotary_dim=cfg.rotary_dim, error=err.summary()),
                       mistake)
        c.headline(_("valid configs accepted"))
        good = _random_config(c)
        for cfg, shown, fields, rule, mistake in _broken_configs(good):
            if _expect_value_error(c, cfg, shown, fields, rule):
                _accepted(c, shown, rule, mistake)
        # n_heads % n_kv_heads: which rule a function that lets a broken config through checks
        kv_rule = _("n_heads divisible by n_kv_heads")
        more = dataclasses.replace(good, n_kv_heads=good.n_heads + 1)
        shown = f"n_heads={good.n_heads}, n_kv_heads={good.n_heads + 1}"
        six, thirty = (_expect_value_error(c, cfg, "n_heads=6, n_kv_heads=4",
                                           ("n_heads", "n_kv_heads"), kv_rule)
                       for cfg in _SIX_OVER_FOUR)
        over = _expect_value_error(c, more, shown, ("n_heads", "n_kv_heads"), kv_rule)
        if six and not thirty:  # hidden_size % n_kv_heads, whatever it says of `more`
            _accepted(c, "n_heads=6, n_kv_heads=4", kv_rule, KV_DIVIDES_HIDDEN)
        if six and thirty and not over:
            _accepted(c, "n_heads=6, n_kv_heads=4", kv_rule, KV_HEADS_COMPARED)
        if six or thirty or over:
            _accepted(c, shown if over else "n_heads=6, n_kv_heads=4", kv_rule,
                      ACCEPTS_INDIVISIBLE_KV_HEADS)
        c.headline(_("each broken rule raises ValueError naming it"))


def _accepts(c: Check, cfg: ModelConfig) -> bool:
    try:
        c.call(cfg)
    except LearnerError:
        return False
    return True


def _accepted(c: Check, shown: str, rule: str, mistake: Mistake) -> None:
    c.fail(_("accepted a broken config ({changes}); it should raise ValueError ({rule}).").format(
        changes=shown, rule=rule), mistake)


def _expect_value_error(c: Check, cfg: ModelConfig, shown: str, fields, rule: str) -> bool:
    """Whether the learner's function accepted `cfg`; it fails here when it raised anything
    but a ValueError that names one of `fields`."""
    try:
        c.call(cfg)
    except LearnerError as err:
        if err.error != "ValueError":
            c.fail(_("a config with {changes} should raise ValueError ({rule}), but it {error}")
                   .format(changes=shown, rule=rule, error=err.summary()),
                   err.hint or OTHER_EXCEPTION)
        # the learner's own text (err.error_text), whatever language the learner reads
        if not any(name in err.error_text.lower() for name in fields):
            c.fail(_("for a config with {changes} the ValueError should name the broken rule "
                     "({rule}) by its field name ({fields}); the message was: {text}").format(
                changes=shown, rule=rule, fields=_(" or ").join(fields),
                text=repr(err.error_text)), NAMES_NO_FIELD)
        return False
    return True


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
        c.headline(_("the shape of every tensor name"))
        c.headline(_("configs that set head_dim themselves"))
        try:
            c.call("not_a_tensor", configs[0], b, s)
        except LearnerError as err:
            if err.error != "KeyError":
                c.fail(_("an unknown name should raise KeyError, but it {error}").format(
                    error=err.summary()), UNKNOWN_OTHER_ERROR)
        else:
            c.fail(_("an unknown name ('not_a_tensor') should raise KeyError, not return a "
                     "shape."), UNKNOWN_RETURNS)
        c.headline(_("unknown names raise KeyError"))


def _short(cfg: ModelConfig) -> str:
    return (f"H={cfg.hidden_size}, N_h={cfg.n_heads}, N_kv={cfg.n_kv_heads}, D_h={cfg.head_dim}")


def _symbol_mixups(cfg: ModelConfig, want: int) -> dict:
    return {FLOAT: float(want), DIVIDED_BY_N_KV: cfg.hidden_size // cfg.n_kv_heads,
            RETURNED_H: cfg.hidden_size}


def _shape_mixups(name: str, cfg: ModelConfig, b: int, s: int) -> dict:
    """Shapes that the common confusions produce for tensor `name`."""
    nh, nkv, d, h, v = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_size, cfg.vocab_size
    mixups = {
        "k": {KV_HEADS: (b, nh, s, d), HEADS_FIRST: (b, s, nkv, d)},
        "v": {KV_HEADS: (b, nh, s, d), HEADS_FIRST: (b, s, nkv, d)},
        "q": {Q_HEADS: (b, nkv, s, d), HEADS_FIRST: (b, s, nh, d)},
        "hidden": {HIDDEN_V: (b, v, h), HIDDEN_NO_BATCH: (s, h)},
        "scores": {SCORES_PER_HEAD: (b, s, s), SCORES_PER_KV_HEAD: (b, nkv, s, s)},
        "attn_weights": {WEIGHTS_PER_HEAD: (b, s, s), SCORES_PER_KV_HEAD: (b, nkv, s, s)},
        "attn_out": {ATTN_OUT_HEADS: (b, nh, s, d), ATTN_OUT_IS_H: (b, s, h)},
        "ffn_mid": {FFN_MID_H: (b, s, h)},
        "logits": {LOGITS_H: (b, s, h), LOGITS_LAST: (b, v)},
        "kv_cache_layer": {CACHE_N_H: (2, b, nh, s, d), CACHE_NO_2: (b, nkv, s, d)},
        "token_ids": {HIDDEN_NO_BATCH: (s,)},
    }
    found = dict(mixups.get(name, {}))
    if d != h // nh:  # only then is a recomputed head width visible
        recomputed = _shape_with_head_dim(name, cfg, b, s, h // nh)
        if recomputed is not None:
            found[RECOMPUTED_D_H] = recomputed
    return found


def _shape_with_head_dim(name: str, cfg: ModelConfig, b: int, s: int, d: int):
    """The per-head shapes computed with head width `d` (None for other tensors)."""
    nh, nkv = cfg.n_heads, cfg.n_kv_heads
    return {"q": (b, nh, s, d), "k": (b, nkv, s, d), "v": (b, nkv, s, d),
            "attn_out": (b, s, nh * d), "kv_cache_layer": (2, b, nkv, s, d)}.get(name)


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "01.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "head_dim": (
        DIVIDED_BY_N_KV, FLOAT, IGNORED_HEAD_DIM, RETURNED_H),
    "kv_group_size": (
        GROUP_INVERTED, FLOAT, GROUP_IS_N_H, GROUP_IS_N_KV, GROUP_DIFFERENCE),
    "validate_config": (
        ACCEPTS_INDIVISIBLE_HEADS, ACCEPTS_INDIVISIBLE_KV_HEADS, ACCEPTS_NONPOSITIVE,
        ACCEPTS_ODD_ROTARY, ACCEPTS_LONG_ROTARY, ACCEPTS_ZERO, ASSERTS, KV_HEADS_COMPARED,
        DIVIDES_BEFORE_CHECKING, KV_DIVIDES_HIDDEN, NAMES_NO_FIELD, OTHER_EXCEPTION,
        REJECTS_EXPLICIT_HEAD_DIM, REJECTS_GQA, REJECTS_PARTIAL_ROTARY, REJECTS_FULL_ROTARY,
        REJECTS_VALID),
    "tensor_shape": (
        ATTN_OUT_IS_H, ATTN_OUT_HEADS, CACHE_N_H, CACHE_NO_2, HIDDEN_NO_BATCH, FFN_MID_H,
        HIDDEN_V, KV_HEADS, LOGITS_LAST, LOGITS_H, Q_HEADS, RECOMPUTED_D_H, SCORES_PER_KV_HEAD,
        SCORES_PER_HEAD, HEADS_FIRST, UNKNOWN_OTHER_ERROR, UNKNOWN_RETURNS, WEIGHTS_PER_HEAD),
}
