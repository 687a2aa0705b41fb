"""Chapter 11 checkers: the reference passes at every seed; each known mistake is diagnosed."""

import math
import types

import pytest
import torch

from checks import nb11
from checks import reference as ref
from checks.engine import ForbiddenCall

from ..support.catalogue import Wrong, exercises, failure_text


def _copy(fn):
    """The reference function under a new code object: the checks reject calls to the course's
    own block functions (by code object), so the tests pass a copy of them as the correct answer."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


REFERENCE = {
    nb11.check_init_block_params: _copy(ref.init_block_params),
    nb11.check_attention_sublayer: _copy(ref.attention_sublayer),
    nb11.check_decoder_block: _copy(ref.decoder_block),
    nb11.check_block_param_count: _copy(ref.block_param_count),
}


@pytest.mark.parametrize("checker,name", [
    (nb11.check_init_block_params, "init_block_params"),
    (nb11.check_attention_sublayer, "attention_sublayer"),
    (nb11.check_decoder_block, "decoder_block"),
    (nb11.check_block_param_count, "block_param_count"),
])
def test_the_courses_own_answer_is_rejected(checker, name):
    """Calling checks.reference's finished block (directly, or from inside a wrapper) is not an
    answer; the earlier chapters' pieces remain allowed (every correct answer here uses them)."""
    fn = getattr(ref, name)

    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    for candidate in (fn, wrapper):
        with pytest.raises(ForbiddenCall) as info:
            checker(candidate, seed=0)
        assert "course's own" in str(info.value)


def test_decoder_block_may_not_hide_the_reference_in_its_attention():
    def decoder_block(x, layer, cfg, positions):
        return ref.decoder_block(x, layer, cfg, positions)
    with pytest.raises(ForbiddenCall):
        nb11.check_attention_sublayer(
            lambda x, layer, cfg, positions: decoder_block(x, layer, cfg, positions) - x, seed=0)


def test_guard_leaves_no_profiler_behind():
    import sys
    before = sys.getprofile()
    with pytest.raises(ForbiddenCall):
        nb11.check_decoder_block(ref.decoder_block, seed=0)
    nb11.check_decoder_block(REFERENCE[nb11.check_decoder_block], seed=0)
    assert sys.getprofile() is before


# ---- init_block_params ------------------------------------------------------------------------

_SHAPES = ref.block.block_shapes


def _init_with(draw=None, norms=torch.ones, shapes=_SHAPES, skip_generator=False,
               ignore_dtype=False, same_gate_up=False, same_norms=False):
    """A learner-style init_block_params with one thing changed."""
    def init_block_params(cfg, generator=None, dtype=torch.float32):
        gen = None if skip_generator else generator
        out = {}
        for name, shape in shapes(cfg).items():
            dt = torch.float32 if ignore_dtype else dtype
            if len(shape) == 1:
                out[name] = norms(shape, dtype=dt)
            elif draw is not None:
                out[name] = draw(shape, gen, dt)
            else:
                out[name] = torch.randn(shape, generator=gen, dtype=dt) * 0.02
        if same_norms:
            out["ffn_norm"] = out["attn_norm"]
        if same_gate_up:
            out["w_up"] = out["w_gate"]
        return out
    return init_block_params


def _transposed(cfg):
    return {k: v[::-1] for k, v in _SHAPES(cfg).items()}


def _wqkv_3h(cfg):
    shapes = dict(_SHAPES(cfg))
    shapes["wqkv"] = (cfg.hidden_size, 3 * cfg.hidden_size)
    return shapes


def _wo_hh(cfg):
    shapes = dict(_SHAPES(cfg))
    shapes["wo"] = (cfg.hidden_size, cfg.hidden_size)
    return shapes


def _separate_qkv(cfg, generator=None, dtype=torch.float32):
    h, d = cfg.hidden_size, cfg.head_dim
    out = _init_with()(cfg, generator, dtype)
    del out["wqkv"]
    for name, n in (("wq", cfg.n_heads), ("wk", cfg.n_kv_heads), ("wv", cfg.n_kv_heads)):
        out[name] = torch.randn(h, n * d, generator=generator, dtype=dtype) * 0.02
    return out


def _fixed_seed(cfg, generator=None, dtype=torch.float32):
    return _init_with()(cfg, torch.Generator().manual_seed(0), dtype)


def _fresh_generator_when_none(cfg, generator=None, dtype=torch.float32):
    return _init_with()(cfg, generator if generator is not None else torch.Generator(), dtype)


def _unseeded_generator_when_none(cfg, generator=None, dtype=torch.float32):
    """generator=None: a new Generator seeded from the OS (`.seed()`), not torch's global one."""
    if generator is None:
        generator = torch.Generator()
        generator.seed()
    return _init_with()(cfg, generator, dtype)


def _only_when_decoupled(width):
    """A scale width that is right (D_h) while H = N_h * D_h, and `width(cfg)` otherwise."""
    return lambda cfg: (cfg.head_dim if cfg.hidden_size == cfg.n_heads * cfg.head_dim
                        else width(cfg))


def _renamed(names):
    """The layout under other names."""
    def init_block_params(cfg, generator=None, dtype=torch.float32):
        return {names.get(k, k): v for k, v in _init_with()(cfg, generator, dtype).items()}
    return init_block_params


def _head_width_from_h(cfg):
    """D_h taken as H // N_h in every shape."""
    shapes = dict(_SHAPES(cfg))
    h, n_h, n_kv = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads
    shapes["wqkv"] = (h, (n_h + 2 * n_kv) * (h // n_h))
    shapes["wo"] = (n_h * (h // n_h), h)
    return shapes


def _fan_in(shape, gen, dt):
    return torch.randn(shape, generator=gen, dtype=dt) / math.sqrt(shape[0])


def _uniform(shape, gen, dt):
    return (torch.rand(shape, generator=gen, dtype=dt) * 2 - 1) * 0.02


def _expanded_row(shape, gen, dt):
    return (torch.randn(1, shape[1], generator=gen, dtype=dt) * 0.02).expand(shape).clone()


# ---- attention_sublayer -----------------------------------------------------------------------

def _sublayer(*, rope_v=False, rope_k=True, arange=False, causal=True, tile=False,
              residual=False, norm=True, base=True, rotary_dim=True, eps=True, merge=True,
              interleaved=True, swap_kv=False, rope_q=True, wo=True, norm_name="attn_norm",
              scale=None):
    """A learner-style attention_sublayer from the reference pieces, with one thing changed."""
    def attention_sublayer(x, layer, cfg, positions):
        b, s, _ = x.shape
        n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        h = ref.rms_norm(x, layer[norm_name], cfg.norm_eps if eps else 1e-5) if norm else x
        q, k, v = ref.split_qkv(h @ layer["wqkv"], n_h, n_kv, d)
        if swap_kv:
            k, v = v, k
        pos = torch.arange(s) if arange else positions
        kw = {"base": cfg.rope_base if base else 10000.0, "interleaved": interleaved,
              "rotary_dim": cfg.rotary_dim if rotary_dim else None}
        if rope_q:
            q = ref.apply_rope(q, pos, **kw)
        if scale is not None:   # the scores divided by sqrt(scale(cfg)) instead of sqrt(D_h)
            q = q * math.sqrt(d / scale(cfg))
        if rope_k:
            k = ref.apply_rope(k, pos, **kw)
        if rope_v:
            v = ref.apply_rope(v, pos, **kw)
        if tile:
            k, v = k.repeat(1, n_h // n_kv, 1, 1), v.repeat(1, n_h // n_kv, 1, 1)
        out = ref.grouped_query_attention(q, k, v, ref.causal_mask(s) if causal else None)
        merged = ref.merge_heads(out) if merge else out.reshape(b, s, n_h * d)
        o = merged @ layer["wo"] if wo else merged
        return x + o if residual else o
    return attention_sublayer


def _sublayer_with_own_gqa(x, layer, cfg, positions):
    """Correct, but with the grouping written by hand as in chapter 06 (a different code path)."""
    b, s, _ = x.shape
    n_h, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    h = ref.rms_norm(x, layer["attn_norm"], cfg.norm_eps)
    q, k, v = ref.split_qkv(h @ layer["wqkv"], n_h, n_kv, d)
    kw = {"base": cfg.rope_base, "rotary_dim": cfg.rotary_dim}
    q, k = ref.apply_rope(q, positions, **kw), ref.apply_rope(k, positions, **kw)
    g = n_h // n_kv
    qg = q.reshape(b, n_kv, g * s, d)
    scores = (qg @ k.transpose(-2, -1) / math.sqrt(d)).view(b, n_kv, g, s, s)
    scores = scores.masked_fill(~ref.causal_mask(s), float("-inf"))
    weights = torch.softmax(scores, dim=-1).view(b, n_kv, g * s, s)
    out = (weights @ v).view(b, n_h, s, d)
    return ref.merge_heads(out) @ layer["wo"]


# ---- decoder_block ----------------------------------------------------------------------------

def _ffn(t, layer, swap=False):
    gate, up = (layer["w_up"], layer["w_gate"]) if swap else (layer["w_gate"], layer["w_up"])
    return ref.swiglu_ffn(t, gate, up, layer["w_down"])


def _block(structure, attention=ref.attention_sublayer):
    """A learner-style decoder_block with one structural change, or a wrong attention inside."""
    def decoder_block(x, layer, cfg, positions):
        eps = cfg.norm_eps

        def att(t):
            return attention(t, layer, cfg, positions)

        def norm(t, name="ffn_norm"):
            return ref.rms_norm(t, layer[name], eps)

        if structure == "post":
            no_norm = _sublayer(norm=False)
            u = norm(x + no_norm(x, layer, cfg, positions), "attn_norm")
            return norm(u + _ffn(u, layer))
        if structure == "post_too":
            u = norm(x + att(x), "attn_norm")
            return norm(u + _ffn(norm(u), layer))
        if structure == "parallel":
            return x + att(x) + _ffn(norm(x), layer)
        if structure == "in_place":
            x += att(x)
            x += _ffn(norm(x), layer)
            return x
        u = att(x) if structure in ("no_attn_res", "no_res") else x + att(x)
        if structure == "ffn_no_norm":
            return u + _ffn(u, layer)
        if structure == "no_ffn":
            return u
        mid = _ffn(norm(u, "attn_norm" if structure == "attn_norm_in_ffn" else "ffn_norm"), layer,
                   swap=structure == "swap")
        if structure in ("no_ffn_res", "no_res"):
            return mid
        if structure == "from_x":
            return x + mid
        return u + mid
    return decoder_block


# ---- block_param_count ------------------------------------------------------------------------

def _count(attention="ok", ffn_mats=3, norms=2, as_float=False, embed=False, wo="ok"):
    def block_param_count(cfg):
        h, d, n_h, n_kv = cfg.hidden_size, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        if attention == "4h2":
            att = 4 * h * h
        elif attention == "width_h":
            att = h * (h + 2 * n_kv * d) + h * h
        elif attention == "kv_n_h":
            att = h * 3 * n_h * d + n_h * d * h
        else:
            att = h * (n_h + 2 * n_kv) * d + {"ok": n_h * d * h, "hh": h * h, "none": 0}[wo]
        total = att + ffn_mats * h * cfg.ffn_hidden_size + norms * h
        total += cfg.vocab_size * h if embed else 0
        return total / 1 if as_float else total
    return block_param_count


WRONG = {
    nb11.check_init_block_params: [
        Wrong("std 1 (torch.randn unscaled)", _init_with(
            draw=lambda shape, g, dt: torch.randn(shape, generator=g, dtype=dt)),
                  "11.init_block_params.std_one"),
        Wrong("1/sqrt(fan_in)", _init_with(draw=_fan_in), "11.init_block_params.fan_in_scale"),
        Wrong("uniform in [-0.02, 0.02]", _init_with(draw=_uniform),
              "11.init_block_params.uniform_draw"),
        Wrong("zeros", _init_with(draw=lambda shape, g, dt: torch.zeros(shape, dtype=dt)),
              "11.init_block_params.constant_weights"),
        Wrong("one row expanded", _init_with(draw=_expanded_row),
              "11.init_block_params.one_draw_repeated"),
        Wrong("[out, in] weights", _init_with(shapes=_transposed),
              "11.init_block_params.transposed_weights"),
        Wrong("wqkv with 3H columns under GQA", _init_with(shapes=_wqkv_3h),
              "11.init_block_params.kv_with_n_h_heads"),
        Wrong("wo [H, H] with D_h != H/N_h", _init_with(shapes=_wo_hh),
              "11.init_block_params.wo_as_h_by_h"),
        Wrong("norms at zero", _init_with(norms=torch.zeros), "11.init_block_params.norm_at_zero"),
        Wrong("norms random", _init_with(norms=lambda shape, dtype: torch.rand(shape, dtype=dtype)),
              "11.init_block_params.norm_not_one"),
        Wrong("generator ignored", _init_with(skip_generator=True),
              "11.init_block_params.generator_ignored"),
        Wrong("dtype ignored", _init_with(ignore_dtype=True), "11.init_block_params.dtype_ignored"),
        Wrong("w_up is w_gate", _init_with(same_gate_up=True),
              "11.init_block_params.same_draw_twice"),
        Wrong("one tensor for both norms", _init_with(same_norms=True),
              "11.init_block_params.one_tensor_two_names"),
        Wrong("norms of torch.rand", _init_with(norms=torch.rand),
              "11.init_block_params.norm_not_one"),
        Wrong("separate wq, wk, wv", _separate_qkv, "11.init_block_params.separate_q_k_v"),
        Wrong("fixed seed inside", _fixed_seed, "11.init_block_params.fixed_seed_inside"),
        Wrong("new Generator() when None", _fresh_generator_when_none,
              "11.init_block_params.new_generator_when_none"),
        Wrong("Generator().seed() when None", _unseeded_generator_when_none,
              "11.init_block_params.none_not_global_generator"),
        Wrong("norms named norm1, norm2", _renamed({"attn_norm": "norm1", "ffn_norm": "norm2"}),
              "11.init_block_params.norm_names"),
        Wrong("FFN named w1, w2, w3", _renamed({"w_gate": "w1", "w_down": "w2", "w_up": "w3"}),
              "11.init_block_params.other_names"),
        Wrong("D_h = H // N_h", _init_with(shapes=_head_width_from_h),
              "11.init_block_params.head_width_from_h"),
        Wrong("norms [1, H]", _init_with(norms=lambda shape, dtype: torch.ones(1, *shape,
                                                                                dtype=dtype)),
              "11.init_block_params.norm_not_a_vector"),
        Wrong("divided by 0.02", _init_with(
            draw=lambda shape, g, dt: torch.randn(shape, generator=g, dtype=dt) / 0.02),
              "11.init_block_params.wrong_std"),
        Wrong("torch.normal(0.02, 0.02)", _init_with(
            draw=lambda shape, g, dt: torch.normal(0.02, 0.02, shape, generator=g, dtype=dt)),
              "11.init_block_params.nonzero_mean"),
        # torch.empty's memory holds whatever was there; NaN here, so that every run sees it
        Wrong("torch.empty never filled (NaN)", _init_with(
            draw=lambda shape, g, dt: torch.full(shape, float("nan"), dtype=dt)),
              "11.init_block_params.uninitialised_memory"),
    ],
    nb11.check_attention_sublayer: [
        Wrong("RoPE on V too", _sublayer(rope_v=True), "11.attention_sublayer.rope_on_v"),
        Wrong("positions from arange", _sublayer(arange=True),
              "11.attention_sublayer.positions_ignored"),
        Wrong("no causal mask", _sublayer(causal=False), "11.attention_sublayer.no_causal_mask"),
        Wrong("K/V tiled (repeat)", _sublayer(tile=True), "11.attention_sublayer.kv_heads_tiled"),
        Wrong("RoPE on Q only", _sublayer(rope_k=False), "11.attention_sublayer.rope_on_q_only"),
        Wrong("residual included", _sublayer(residual=True),
              "11.attention_sublayer.residual_in_sublayer"),
        Wrong("no RMSNorm", _sublayer(norm=False), "11.attention_sublayer.no_attn_norm"),
        Wrong("rope_base ignored", _sublayer(base=False),
              "11.attention_sublayer.rope_base_ignored"),
        Wrong("rotary_dim ignored", _sublayer(rotary_dim=False),
              "11.attention_sublayer.rotary_dim_ignored"),
        Wrong("norm_eps ignored", _sublayer(eps=False), "11.attention_sublayer.norm_eps_ignored"),
        Wrong("merge without transpose", _sublayer(merge=False),
              "11.attention_sublayer.merged_without_transpose"),
        Wrong("half pairing", _sublayer(interleaved=False), "11.attention_sublayer.half_pairing"),
        Wrong("K and V swapped", _sublayer(swap_kv=True), "11.attention_sublayer.k_and_v_swapped"),
        Wrong("RoPE on K only", _sublayer(rope_q=False), "11.attention_sublayer.rope_on_k_only"),
        Wrong("no RoPE", _sublayer(rope_q=False, rope_k=False), "11.attention_sublayer.no_rope"),
        Wrong("no W_O", _sublayer(wo=False), "11.attention_sublayer.no_output_projection"),
        Wrong("ffn_norm in attention", _sublayer(norm_name="ffn_norm"),
              "11.attention_sublayer.ffn_norm_in_attention"),
        Wrong("scaled by sqrt(H // N_h)",
              _sublayer(scale=lambda cfg: cfg.hidden_size // cfg.n_heads),
              "11.attention_sublayer.scaled_by_sqrt_h_over_n_h"),
        Wrong("scaled by sqrt(H)", _sublayer(scale=lambda cfg: cfg.hidden_size),
              "11.attention_sublayer.scaled_by_sqrt_h"),
        Wrong("scaled by sqrt(N_h * D_h)", _sublayer(scale=lambda cfg: cfg.n_heads * cfg.head_dim),
              "11.attention_sublayer.scaled_by_sqrt_h"),
        # right while H = N_h * D_h (the first case), so that a config with D_h != H / N_h decides
        Wrong("scaled by sqrt(N_h * D_h) only when D_h != H / N_h", _sublayer(
            scale=_only_when_decoupled(lambda cfg: cfg.n_heads * cfg.head_dim)),
              "11.attention_sublayer.scaled_by_sqrt_heads_width"),
    ],
    nb11.check_decoder_block: [
        Wrong("no attention residual", _block("no_attn_res"),
              "11.decoder_block.no_attention_residual"),
        Wrong("no FFN residual", _block("no_ffn_res"), "11.decoder_block.no_ffn_residual"),
        Wrong("no residuals", _block("no_res"), "11.decoder_block.no_residuals"),
        Wrong("post-norm", _block("post"), "11.decoder_block.post_norm"),
        Wrong("post-norm on top of pre-norm", _block("post_too"),
              "11.decoder_block.post_norm_on_top"),
        Wrong("parallel attention and FFN", _block("parallel"),
              "11.decoder_block.ffn_parallel_to_attention"),
        Wrong("second residual adds X", _block("from_x"),
              "11.decoder_block.second_residual_adds_x"),
        Wrong("no FFN norm", _block("ffn_no_norm"), "11.decoder_block.no_ffn_norm"),
        Wrong("attn_norm reused for the FFN", _block("attn_norm_in_ffn"),
              "11.decoder_block.attn_norm_in_ffn"),
        Wrong("gate and up swapped", _block("swap"), "11.decoder_block.gate_and_up_swapped"),
        Wrong("residual added in place", _block("in_place"),
              "11.decoder_block.residual_added_in_place"),
        Wrong("attention with RoPE on V", _block("pre", _sublayer(rope_v=True)),
              "11.decoder_block.rope_on_v"),
        Wrong("attention with arange positions", _block("pre", _sublayer(arange=True)),
              "11.decoder_block.positions_ignored"),
        Wrong("non-causal attention", _block("pre", _sublayer(causal=False)),
              "11.decoder_block.no_causal_mask"),
        Wrong("attention with tiled K/V", _block("pre", _sublayer(tile=True)),
              "11.decoder_block.kv_heads_tiled"),
        Wrong("attention with its own residual", _block("pre", _sublayer(residual=True)),
              "11.decoder_block.residual_in_sublayer"),
        Wrong("no FFN", _block("no_ffn"), "11.decoder_block.no_ffn"),
        Wrong("attention without its norm", _block("pre", _sublayer(norm=False)),
              "11.decoder_block.no_attn_norm"),
        Wrong("attention scaled by sqrt(H // N_h)",
              _block("pre", _sublayer(scale=lambda cfg: cfg.hidden_size // cfg.n_heads)),
              "11.decoder_block.scaled_by_sqrt_h_over_n_h"),
        Wrong("attention scaled by sqrt(H)",
              _block("pre", _sublayer(scale=lambda cfg: cfg.hidden_size)),
              "11.decoder_block.scaled_by_sqrt_h"),
        Wrong("attention scaled by sqrt(N_h * D_h) only when D_h != H / N_h", _block(
            "pre", _sublayer(scale=_only_when_decoupled(lambda cfg: cfg.n_heads * cfg.head_dim))),
              "11.decoder_block.scaled_by_sqrt_heads_width"),
    ],
    nb11.check_block_param_count: [
        Wrong("norms left out", _count(norms=0), "11.block_param_count.norms_left_out"),
        Wrong("one norm", _count(norms=1), "11.block_param_count.one_norm_counted"),
        Wrong("LayerNorm gamma and beta", _count(norms=4),
              "11.block_param_count.layernorm_gamma_and_beta"),
        Wrong("4 H^2 attention", _count(attention="4h2"),
              "11.block_param_count.four_h_by_h_attention"),
        Wrong("H as the heads' width", _count(attention="width_h"),
              "11.block_param_count.h_as_heads_width"),
        Wrong("two FFN matrices", _count(ffn_mats=2), "11.block_param_count.two_ffn_matrices"),
        Wrong("float", _count(as_float=True), "11.block_param_count.returned_float"),
        Wrong("embedding included", _count(embed=True), "11.block_param_count.embedding_included"),
        Wrong("W_O as H x H", _count(wo="hh"), "11.block_param_count.wo_as_h_by_h"),
        Wrong("W_O left out", _count(wo="none"), "11.block_param_count.wo_left_out"),
        Wrong("W_K and W_V with N_h heads", _count(attention="kv_n_h"),
              "11.block_param_count.kv_with_n_h_heads"),
    ],
}


# The correct answers: the reference (a copy), and the catalogue's own builders with nothing
# changed (each diagnosis above comes from the one change a wrong one makes)
CORRECT = {
    nb11.check_init_block_params: {"reference": REFERENCE[nb11.check_init_block_params],
                                   "learner_style": _init_with()},
    nb11.check_attention_sublayer: {"reference": REFERENCE[nb11.check_attention_sublayer],
                                    "learner_style": _sublayer(),
                                    # its own grouped attention, no SDPA
                                    "hand_written_grouping": _sublayer_with_own_gqa},
    nb11.check_decoder_block: {"reference": REFERENCE[nb11.check_decoder_block],
                               "learner_style": _block("pre", _sublayer())},
    nb11.check_block_param_count: {"reference": REFERENCE[nb11.check_block_param_count],
                                   "learner_style": _count()},
}
EXERCISES = exercises(CORRECT, WRONG)


def test_reference_block_param_count_closed_form():
    from checks import LLAMA2_7B
    import dataclasses
    assert ref.block_param_count(LLAMA2_7B) == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert ref.block_param_count(LLAMA2_7B) == 202_383_360
    gqa = dataclasses.replace(LLAMA2_7B, n_kv_heads=8)
    assert ref.block_param_count(gqa) == 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 11008 + 8192


def test_reference_block_is_causal_and_position_relative():
    """Invariants of the reference itself: later tokens never change earlier outputs, and
    shifting every position by the same amount changes nothing (RoPE is relative)."""
    from checks import ModelConfig
    cfg = ModelConfig(vocab_size=10, hidden_size=24, n_heads=6, n_kv_heads=2, ffn_hidden_size=40)
    gen = torch.Generator().manual_seed(0)
    layer = {k: v * 20 if k not in nb11.NORMS else v
             for k, v in ref.init_block_params(cfg, generator=gen).items()}
    x = torch.randn(2, 7, 24, generator=gen)
    pos = torch.arange(7)
    out = ref.decoder_block(x, layer, cfg, pos)
    y = x.clone()
    y[:, 4:] = torch.randn(2, 3, 24, generator=gen)
    torch.testing.assert_close(ref.decoder_block(y, layer, cfg, pos)[:, :4], out[:, :4])
    torch.testing.assert_close(ref.decoder_block(x, layer, cfg, pos + 100), out,
                               atol=1e-5, rtol=1e-4)


def test_chapter_11_reads_in_chinese(monkeypatch):
    from checks.environment import LANG_ENV
    from checks.engine import CheckFailure
    monkeypatch.setenv(LANG_ENV, "zh")
    text = failure_text(nb11.check_decoder_block, _block("pre", _sublayer(arange=True)))
    assert "可能的错误：在注意力子层中：忽略了 `positions`" in text, text
    assert "likely mistake" not in text and "ignored" not in text
    with pytest.raises(CheckFailure) as info:
        nb11.check_init_block_params(_init_with(norms=torch.zeros), seed=0)
    assert "应全为 1" in str(info.value) and "初始化成了 0" in str(info.value), str(info.value)
    with pytest.raises(CheckFailure) as info:
        nb11.check_block_param_count(_count(embed=True), seed=0)
    assert "加上了 Embedding 表" in str(info.value), str(info.value)


# ------------------------------------------------------------------------------------------------
# Knock-on failures in the self-check (issue 33): decoder_block and block_param_count built, as
# the notebook builds them, on the learner's own attention_sublayer and init_block_params name a
# broken one "fix it first", never its mistake a second time.

_LEARNER_BLOCK = '''
def attention_sublayer(x, layer, cfg, positions):
    return _attention(x, layer, cfg, positions)

def decoder_block(x, layer, cfg, positions):
    u = x + attention_sublayer(x, layer, cfg, positions)
    h = _rms_norm(u, layer["ffn_norm"], cfg.norm_eps)
    return u + _swiglu_ffn(h, layer["w_gate"], layer["w_up"], layer["w_down"])

def init_block_params(cfg, generator=None, dtype=torch.float32):
    return _init(cfg, generator, dtype)

def block_param_count(cfg):
    with torch.device("meta"):
        return sum(t.numel() for t in init_block_params(cfg).values())
'''


def _learner_block(attention=None, init=None) -> dict:
    from ..support.cells import learner_cell
    return learner_cell(_LEARNER_BLOCK, _attention=attention or _sublayer(),
                        _init=init or _init_with(), _rms_norm=ref.rms_norm,
                        _swiglu_ffn=ref.swiglu_ffn)


def _mistake_of(checker, fn) -> str | None:
    import contextlib
    import io

    from checks.engine import CheckFailure
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            checker(fn, seed=0)
    except CheckFailure as failure:
        return failure.mistake
    return None


def test_the_learners_own_block_and_count_pass_when_right():
    ns = _learner_block()
    assert _mistake_of(nb11.check_decoder_block, ns["decoder_block"]) is None
    assert _mistake_of(nb11.check_block_param_count, ns["block_param_count"]) is None


def test_a_catalogued_wrong_attention_sublayer_is_named_fix_it_first():
    named = 0
    for wrong in WRONG[nb11.check_attention_sublayer]:
        mistake = _mistake_of(nb11.check_decoder_block,
                              _learner_block(attention=wrong.fn)["decoder_block"])
        assert mistake in (None, "11.decoder_block.fix_attention_sublayer_first"), \
            (wrong.name, mistake)
        named += mistake is not None
    assert named >= len(WRONG[nb11.check_attention_sublayer]) - 3


def test_a_wrong_init_block_params_is_named_fix_it_first_by_block_param_count():
    ns = _learner_block(init=_init_with(shapes=_wqkv_3h))
    assert _mistake_of(nb11.check_block_param_count, ns["block_param_count"]) == \
        "11.block_param_count.fix_init_block_params_first"
