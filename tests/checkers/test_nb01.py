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


def _tensor_shape_with(name, wrong_shape):
    def tensor_shape(n, cfg, b, s):
        return wrong_shape(cfg, b, s) if n == name else ref.tensor_shape(n, cfg, b, s)
    return tensor_shape


WRONG = {
    nb01.check_head_dim: [
        Wrong("float division", lambda cfg: cfg.hidden_size / cfg.n_heads, "integer division"),
        Wrong("divides by N_kv", lambda cfg: cfg.hidden_size // cfg.n_kv_heads, "N_kv"),
        Wrong("recomputes H / N_h", lambda cfg: cfg.hidden_size // cfg.n_heads,
              "sets head_dim explicitly"),
        Wrong("returns H", lambda cfg: cfg.hidden_size, "whole hidden size"),
    ],
    nb01.check_kv_group_size: [
        Wrong("inverted", lambda cfg: cfg.n_kv_heads // cfg.n_heads, "wrong way round"),
        Wrong("float", lambda cfg: cfg.n_heads / cfg.n_kv_heads, "integer division"),
        Wrong("returns N_kv", lambda cfg: cfg.n_kv_heads, "returned N_kv"),
        Wrong("returns N_h", lambda cfg: cfg.n_heads, "returned N_h"),
    ],
    nb01.check_validate_config: [
        Wrong("never raises", lambda cfg: None, "accepted a broken config"),
        Wrong("no positivity check", _validate_without("positive"), "positive"),
        Wrong("no head divisibility", _validate_without("heads"), "divisible by n_heads"),
        Wrong("no kv divisibility", _validate_without("kv"), "divisible by n_kv_heads"),
        Wrong("no rotary rule", _validate_without("rotary"), "rotary_dim"),
        Wrong("vague message", lambda cfg: ref.validate_config(cfg) if cfg.n_heads > 0 and
              cfg.hidden_size % cfg.n_heads == 0 else (_ for _ in ()).throw(ValueError("bad")),
              "should name the broken rule"),
        Wrong("wrong exception type", lambda cfg: (_ for _ in ()).throw(AssertionError("bad"))
              if cfg.vocab_size <= 0 else ref.validate_config(cfg), "should raise ValueError"),
        Wrong("rejects GQA", lambda cfg: (_ for _ in ()).throw(ValueError("n_kv_heads"))
              if cfg.n_kv_heads != cfg.n_heads else ref.validate_config(cfg),
              "rejected a valid config"),
    ],
    nb01.check_tensor_shape: [
        Wrong("K with N_h heads", _tensor_shape_with(
            "k", lambda c, b, s: (b, c.n_heads, s, c.head_dim)), "N_kv heads"),
        Wrong("Q tokens-first", _tensor_shape_with(
            "q", lambda c, b, s: (b, s, c.n_heads, c.head_dim)), "heads-first"),
        Wrong("hidden with |V|", _tensor_shape_with(
            "hidden", lambda c, b, s: (b, c.vocab_size, c.hidden_size)), "[B, |V|, H]"),
        Wrong("logits with H", _tensor_shape_with(
            "logits", lambda c, b, s: (b, s, c.hidden_size)), "vocabulary"),
        Wrong("ffn_mid with H", _tensor_shape_with(
            "ffn_mid", lambda c, b, s: (b, s, c.hidden_size)), "H_ff"),
        Wrong("cache without the 2", _tensor_shape_with(
            "kv_cache_layer", lambda c, b, s: (b, c.n_kv_heads, s, c.head_dim)), "leading 2"),
        Wrong("unknown name returns None", lambda n, cfg, b, s: ref.tensor_shape(n, cfg, b, s)
              if n in nb01.TENSOR_NAMES else None, "keyerror"),
        # configs that set head_dim themselves (N_h * D_h != H)
        Wrong("attn_out as [B, S, H]", _tensor_shape_with(
            "attn_out", lambda c, b, s: (b, s, c.hidden_size)), "N_h * D_h wide"),
        Wrong("Q with D_h = H // N_h", _tensor_shape_with(
            "q", lambda c, b, s: (b, c.n_heads, s, c.hidden_size // c.n_heads)),
            "recomputed the head width as H // N_h"),
        Wrong("cache with D_h = H // N_h", _tensor_shape_with(
            "kv_cache_layer", lambda c, b, s: (2, b, c.n_kv_heads, s, c.hidden_size // c.n_heads)),
            "read cfg.head_dim"),
    ],
}

EXERCISES = [
    Exercise(nb01.check_head_dim, {"reference": ref.head_dim}, WRONG[nb01.check_head_dim]),
    Exercise(nb01.check_kv_group_size, {"reference": ref.kv_group_size},
             WRONG[nb01.check_kv_group_size]),
    Exercise(nb01.check_validate_config, {"reference": ref.validate_config},
             WRONG[nb01.check_validate_config]),
    Exercise(nb01.check_tensor_shape, {"reference": ref.tensor_shape},
             WRONG[nb01.check_tensor_shape]),
]


def test_config_defaults_match_llama2_7b():
    cfg = ref.validate_config(nb01.LLAMA2_7B)
    assert cfg is None
    assert dataclasses.replace(nb01.LLAMA2_7B, n_heads=16).head_dim == 128  # replace keeps it
