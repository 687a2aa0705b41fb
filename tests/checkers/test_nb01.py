"""Chapter 01 checkers: the catalogue of wrong implementations (held to the contract by
test_contract.py), and the chapter's own tests."""

import dataclasses

from checks import nb01
from checks import reference as ref

from ..support.catalogue import Exercise, Wrong

def _validate_without(rule):
    """validate_config that skips one rule (to test that each rule is enforced)."""
    def validate(cfg):
        if rule != "positive":
            for name in ("vocab_size", "hidden_size", "n_heads", "n_kv_heads", "head_dim",
                         "ffn_hidden_size", "n_layers", "rotary_dim", "max_seq_len"):
                if getattr(cfg, name) <= 0:
                    raise ValueError(f"{name} must be positive")
        if rule != "heads" and cfg.n_heads and cfg.hidden_size % cfg.n_heads:
            raise ValueError("hidden_size must be divisible by n_heads")
        if rule != "kv" and cfg.n_kv_heads and cfg.n_heads % cfg.n_kv_heads:
            raise ValueError("n_heads must be divisible by n_kv_heads")
        if rule != "rotary" and (cfg.rotary_dim % 2 or cfg.rotary_dim > cfg.head_dim):
            raise ValueError("rotary_dim must be even and at most head_dim")
    return validate


def _validate_with(*, kv=None, positive=("vocab_size", "hidden_size", "n_heads", "n_kv_heads",
                   "head_dim", "ffn_hidden_size", "n_layers", "rotary_dim", "max_seq_len"),
                   nonpositive=lambda v: v <= 0, rotary_max=lambda r, d: r > d,
                   divide_first=False, error=ValueError, extra=None):
    """A learner-style validate_config with one rule written differently."""
    def validate(cfg):
        def sizes():
            for name in positive:
                if nonpositive(getattr(cfg, name)):
                    raise error(f"{name} must be positive")
        if not divide_first:
            sizes()
        if cfg.hidden_size % cfg.n_heads:
            raise error("hidden_size must be divisible by n_heads")
        if (kv or (lambda c: c.n_heads % c.n_kv_heads))(cfg):
            raise error("n_heads must be divisible by n_kv_heads")
        if cfg.rotary_dim % 2 or rotary_max(cfg.rotary_dim, cfg.head_dim):
            raise error("rotary_dim must be even and at most head_dim")
        if divide_first:
            sizes()
        if extra:
            extra(cfg)
    return validate


def _validate_asserting(cfg):
    assert cfg.hidden_size % cfg.n_heads == 0, "hidden_size must be divisible by n_heads"
    ref.validate_config(cfg)


def _head_dim_must_divide(cfg):
    if cfg.head_dim * cfg.n_heads != cfg.hidden_size:
        raise ValueError("head_dim must be hidden_size // n_heads")


def validate_rules_first(cfg):
    """Correct too: the divisibility rules first (guarded against zero), then the sizes in
    reverse order, so that a config breaking two things names the other field."""
    if cfg.n_heads > 0 and cfg.hidden_size % cfg.n_heads:
        raise ValueError("hidden_size must be divisible by n_heads")
    if cfg.n_kv_heads > 0 and cfg.n_heads % cfg.n_kv_heads:
        raise ValueError("n_heads must be divisible by n_kv_heads")
    if cfg.rotary_dim % 2:
        raise ValueError("rotary_dim must be even")
    if cfg.rotary_dim > cfg.head_dim:
        raise ValueError("rotary_dim must be at most head_dim")
    for name in ("max_seq_len", "rotary_dim", "n_layers", "ffn_hidden_size", "head_dim",
                 "n_kv_heads", "n_heads", "hidden_size", "vocab_size"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive")


def _tensor_shape_with(name, wrong_shape):
    def tensor_shape(n, cfg, b, s):
        return wrong_shape(cfg, b, s) if n == name else ref.tensor_shape(n, cfg, b, s)
    return tensor_shape


WRONG = {
    nb01.check_head_dim: [
        Wrong("float division", lambda cfg: cfg.hidden_size / cfg.n_heads,
              '01.head_dim.float_division'),
        Wrong("divides by N_kv", lambda cfg: cfg.hidden_size // cfg.n_kv_heads,
              '01.head_dim.divided_by_n_kv_heads'),
        Wrong("recomputes H / N_h", lambda cfg: cfg.hidden_size // cfg.n_heads,
              '01.head_dim.ignored_explicit_head_dim'),
        Wrong("returns H", lambda cfg: cfg.hidden_size, '01.head_dim.returned_hidden_size'),
    ],
    nb01.check_kv_group_size: [
        Wrong("inverted", lambda cfg: cfg.n_kv_heads // cfg.n_heads,
              '01.kv_group_size.divided_wrong_way_round'),
        Wrong("float", lambda cfg: cfg.n_heads / cfg.n_kv_heads, '01.kv_group_size.float_division'),
        Wrong("returns N_kv", lambda cfg: cfg.n_kv_heads, '01.kv_group_size.returned_n_kv_heads'),
        Wrong("returns N_h", lambda cfg: cfg.n_heads, '01.kv_group_size.returned_n_heads'),
        Wrong("difference", lambda cfg: cfg.n_heads - cfg.n_kv_heads,
              '01.kv_group_size.subtracted_head_counts'),
    ],
    nb01.check_validate_config: [
        Wrong("never raises", lambda cfg: None, '01.validate_config.accepts_indivisible_heads'),
        Wrong("no positivity check", _validate_without("positive"),
              '01.validate_config.accepts_nonpositive_size'),
        Wrong("no head divisibility", _validate_without("heads"),
              '01.validate_config.accepts_indivisible_heads'),
        Wrong("no kv divisibility", _validate_without("kv"),
              '01.validate_config.accepts_indivisible_kv_heads'),
        Wrong("no rotary rule", _validate_without("rotary"),
              '01.validate_config.accepts_odd_rotary_dim'),
        Wrong("vague message", lambda cfg: ref.validate_config(cfg) if cfg.n_heads > 0 and
              cfg.hidden_size % cfg.n_heads == 0 else (_ for _ in ()).throw(ValueError("bad")),
              '01.validate_config.error_names_no_field'),
        Wrong("wrong exception type", lambda cfg: (_ for _ in ()).throw(TypeError("bad"))
              if cfg.vocab_size <= 0 else ref.validate_config(cfg),
              '01.validate_config.raises_other_exception'),
        Wrong("asserts", _validate_asserting, '01.validate_config.asserts_instead_of_raising'),
        Wrong("n_kv_heads <= n_heads", _validate_with(kv=lambda c: c.n_kv_heads > c.n_heads),
              '01.validate_config.compares_kv_heads_instead_of_divisibility'),
        Wrong("hidden_size % n_kv_heads", _validate_with(kv=lambda c: c.hidden_size % c.n_kv_heads),
              '01.validate_config.divides_hidden_size_by_kv_heads'),
        Wrong("positivity of some sizes", _validate_with(
            positive=("vocab_size", "n_heads", "ffn_hidden_size", "n_layers", "max_seq_len")),
            '01.validate_config.accepts_nonpositive_size'),
        Wrong("positivity without rotary_dim", _validate_with(
            positive=("vocab_size", "hidden_size", "n_heads", "n_kv_heads", "head_dim",
                      "ffn_hidden_size", "n_layers", "max_seq_len")),
            '01.validate_config.accepts_nonpositive_size'),
        Wrong("< 0 instead of <= 0", _validate_with(nonpositive=lambda v: v < 0),
              '01.validate_config.accepts_zero_size'),
        Wrong("divides before checking sizes", _validate_with(divide_first=True),
              '01.validate_config.divides_before_checking_positive'),
        Wrong("rotary_dim < head_dim", _validate_with(rotary_max=lambda r, d: r >= d),
              '01.validate_config.rejects_rotary_dim_equal_head_dim'),
        Wrong("rotary only even", _validate_with(rotary_max=lambda r, d: False),
              '01.validate_config.accepts_rotary_dim_over_head_dim'),
        Wrong("rotary_dim must be head_dim", _validate_with(rotary_max=lambda r, d: r != d),
              '01.validate_config.rejects_partial_rotary'),
        Wrong("requires fewer KV heads", _validate_with(
            kv=lambda c: c.n_heads % c.n_kv_heads or c.n_kv_heads == c.n_heads),
              '01.validate_config.rejects_valid_config'),
        Wrong("head_dim tied to H", _validate_with(extra=_head_dim_must_divide),
              '01.validate_config.rejects_explicit_head_dim'),
        Wrong("rejects GQA", lambda cfg: (_ for _ in ()).throw(ValueError("n_kv_heads"))
              if cfg.n_kv_heads != cfg.n_heads else ref.validate_config(cfg),
              '01.validate_config.rejects_grouped_kv_heads'),
    ],
    nb01.check_tensor_shape: [
        Wrong("K with N_h heads", _tensor_shape_with(
            "k", lambda c, b, s: (b, c.n_heads, s, c.head_dim)), '01.tensor_shape.kv_with_n_heads'),
        Wrong("Q tokens-first", _tensor_shape_with(
            "q", lambda c, b, s: (b, s, c.n_heads, c.head_dim)),
              '01.tensor_shape.tokens_first_per_head'),
        Wrong("hidden with |V|", _tensor_shape_with(
            "hidden", lambda c, b, s: (b, c.vocab_size, c.hidden_size)),
              '01.tensor_shape.hidden_with_vocab'),
        Wrong("logits with H", _tensor_shape_with(
            "logits", lambda c, b, s: (b, s, c.hidden_size)),
              '01.tensor_shape.logits_with_hidden_size'),
        Wrong("ffn_mid with H", _tensor_shape_with(
            "ffn_mid", lambda c, b, s: (b, s, c.hidden_size)),
              '01.tensor_shape.ffn_mid_with_hidden_size'),
        Wrong("cache without the 2", _tensor_shape_with(
            "kv_cache_layer", lambda c, b, s: (b, c.n_kv_heads, s, c.head_dim)),
              '01.tensor_shape.cache_without_k_and_v'),
        Wrong("Q with N_kv heads", _tensor_shape_with(
            "q", lambda c, b, s: (b, c.n_kv_heads, s, c.head_dim)),
              '01.tensor_shape.q_with_n_kv_heads'),
        Wrong("scores without heads", _tensor_shape_with("scores", lambda c, b, s: (b, s, s)),
              '01.tensor_shape.scores_without_heads'),
        Wrong("weights without heads", _tensor_shape_with(
            "attn_weights", lambda c, b, s: (b, s, s)), '01.tensor_shape.weights_without_heads'),
        Wrong("attn_out heads-first", _tensor_shape_with(
            "attn_out", lambda c, b, s: (b, c.n_heads, s, c.head_dim)),
              '01.tensor_shape.attn_out_not_concatenated'),
        Wrong("cache with N_h", _tensor_shape_with(
            "kv_cache_layer", lambda c, b, s: (2, b, c.n_heads, s, c.head_dim)),
              '01.tensor_shape.cache_with_n_heads'),
        Wrong("scores per KV head", _tensor_shape_with(
            "scores", lambda c, b, s: (b, c.n_kv_heads, s, s)),
              '01.tensor_shape.scores_per_kv_head'),
        Wrong("logits of the last position", _tensor_shape_with(
            "logits", lambda c, b, s: (b, c.vocab_size)),
            '01.tensor_shape.logits_last_position_only'),
        Wrong("token_ids without B", _tensor_shape_with("token_ids", lambda c, b, s: (s,)),
              '01.tensor_shape.dropped_batch_axis'),
        Wrong("unknown name raises ValueError", lambda n, cfg, b, s: ref.tensor_shape(n, cfg, b, s)
              if n in nb01.TENSOR_NAMES else (_ for _ in ()).throw(ValueError(n)),
              '01.tensor_shape.unknown_name_other_exception'),
        Wrong("unknown name returns None", lambda n, cfg, b, s: ref.tensor_shape(n, cfg, b, s)
              if n in nb01.TENSOR_NAMES else None, '01.tensor_shape.unknown_name_returns'),
        # configs that set head_dim themselves (N_h * D_h != H)
        Wrong("attn_out as [B, S, H]", _tensor_shape_with(
            "attn_out", lambda c, b, s: (b, s, c.hidden_size)),
              '01.tensor_shape.attn_out_as_hidden_size'),
        Wrong("Q with D_h = H // N_h", _tensor_shape_with(
            "q", lambda c, b, s: (b, c.n_heads, s, c.hidden_size // c.n_heads)),
            '01.tensor_shape.recomputed_head_dim'),
        Wrong("cache with D_h = H // N_h", _tensor_shape_with(
            "kv_cache_layer", lambda c, b, s: (2, b, c.n_kv_heads, s, c.hidden_size // c.n_heads)),
            '01.tensor_shape.recomputed_head_dim'),
    ],
}

EXERCISES = [
    Exercise(nb01.check_head_dim, {"reference": ref.head_dim}, WRONG[nb01.check_head_dim]),
    Exercise(nb01.check_kv_group_size, {"reference": ref.kv_group_size},
             WRONG[nb01.check_kv_group_size]),
    Exercise(nb01.check_validate_config, {"reference": ref.validate_config,
                                          "rules_first": validate_rules_first},
             WRONG[nb01.check_validate_config]),
    Exercise(nb01.check_tensor_shape, {"reference": ref.tensor_shape},
             WRONG[nb01.check_tensor_shape]),
]


def test_config_defaults_match_llama2_7b():
    cfg = ref.validate_config(nb01.LLAMA2_7B)
    assert cfg is None
    assert dataclasses.replace(nb01.LLAMA2_7B, n_heads=16).head_dim == 128  # replace keeps it
