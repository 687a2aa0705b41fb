"""What a learner who did all 66 exercises still tripped over (issue 21), each fixed and tested:

1. chapter 13's demonstration that the last query alone gives the last row of full attention
   printed False for a GQA that passes its check (float32 rounding, allclose's atol=1e-8);
2. a broken helper sent a later check astray: chapter 04 blamed a helper `attention` did not call,
   and chapters 05, 11 and 13 said nothing of a broken earlier exercise the later one calls;
3. an error raised inside the learner's code named its line but not the function it is in;
4. scores divided by sqrt(H) (the model width) instead of sqrt(D_h) were not named in chapters
   11 and 13 (chapters 04 and 05 named them already: kept here as a guard);
5. the README did not say that a failing check stops Run All, nor how to go on past it.

The learner's functions are written as a notebook cell is: source code run in a namespace of its
own (its functions are module-level there, as in a notebook), not functions of this file.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
import torch

from checks import nb04, nb05, nb06, nb11, nb13
from checks.nb13.mistakes import NO_OFFSET
from checks import reference as ref
from checks.config import ModelConfig
from checks.environment import LANG_ENV
from checks.engine import CheckFailure, NotStarted

from ..support.catalogue import assert_passes
from ..support.cells import learner_cell as learner

REPO = Path(__file__).resolve().parents[2]
CHAPTER_13 = "13_generation_kv_cache"




def failure_of(checker, fn, seed: int = 0) -> CheckFailure:
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(CheckFailure) as info:
        checker(fn, seed=seed)
    return info.value


# --------------------------------------------------------------------------------------------
# 1. Chapter 13: the last query alone equals the last row of full attention (up to float32)


def _demo_cell(release: Path) -> str:
    cells = json.loads(release.read_text(encoding="utf-8"))["cells"]
    return "".join(next(c for c in cells if c.get("id") == "13-005")["source"])


def _gqa_rounding_apart():
    """A GQA that passes its check, whose one-query call differs from the last row of a
    six-query call by float32 rounding only (a few units in the last place), as another order of
    the same sums gives: what the learner's did (1.8e-7)."""
    def gqa(q, k, v, mask=None):
        b, n_h, s_q, d = q.shape
        n_kv = k.shape[1]
        grouped = q.reshape(b, n_kv, n_h // n_kv * s_q, d)        # no copies of K or V
        scores = (grouped @ k.transpose(-2, -1)).view(b, n_h, s_q, -1) / math.sqrt(d)
        weights = ref.masked_softmax(scores, mask)
        out = (weights.reshape(b, n_kv, -1, k.shape[-2]) @ v).view(b, n_h, s_q, -1)
        if s_q == 1 and out.dtype == torch.float32:   # rounded the other way: +-2 ulp
            out = out + 2.5e-7 * out.abs().clamp_min(1.0) * torch.sign(out)
        return out
    return gqa


def _run_demo(source: str, gqa) -> str:
    tiny = ModelConfig(vocab_size=50, hidden_size=32, n_heads=4, n_kv_heads=2,
                       ffn_hidden_size=64, n_layers=2)
    params = ref.init_model_params(tiny, generator=torch.Generator().manual_seed(0))
    naive = torch.randint(0, 50, (1, 9), generator=torch.Generator().manual_seed(1))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        learner(source, model_forward=ref.model_forward, params=params, tiny=tiny, naive=naive,
                P=8, grouped_query_attention=gqa, causal_mask=ref.causal_mask)
    return out.getvalue()


def test_the_gqa_of_the_demonstration_passes_its_check_and_is_float32_rounding_apart():
    gqa = _gqa_rounding_apart()
    assert_passes(nb06.check_grouped_query_attention, gqa, 0)
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 8, 6, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    last, full = gqa(q[:, :, -1:], k, v, ref.causal_mask(1, 6)), gqa(q, k, v, ref.causal_mask(6))
    difference = float((last - full[:, :, -1:]).abs().max())
    assert 1e-7 < difference < 2e-6
    assert not torch.allclose(last, full[:, :, -1:])  # what the cell used to print


@pytest.mark.parametrize("release, says", [
    (REPO / "solutions" / CHAPTER_13 / f"{CHAPTER_13}.ipynb",
     "last query alone == last row of full attention: True (largest difference "),
    (REPO / "notebooks" / CHAPTER_13 / f"{CHAPTER_13}.ipynb",
     "last query alone == last row of full attention: True (largest difference "),
    (REPO / "notebooks-zh" / CHAPTER_13 / f"{CHAPTER_13}.ipynb",
     "只用最后一个 Query == 完整注意力的最后一行： True （最大差值 "),
], ids=["solutions", "notebooks", "notebooks-zh"])
def test_last_query_demonstration_says_true_for_float32_rounding(release, says):
    if not release.is_file():
        pytest.skip(f"{release.relative_to(REPO)} is not generated")
    printed = _run_demo(_demo_cell(release), _gqa_rounding_apart())
    assert says in printed, printed
    last_line = printed.splitlines()[-1]
    difference = float(re.search(r"(?:difference|差值) ([0-9.e+-]+)", last_line)[1])
    assert 1e-7 < difference < 2e-6


def test_last_query_demonstration_still_says_false_for_a_real_difference():
    def off_by_much(q, k, v, mask=None):
        out = ref.grouped_query_attention(q, k, v, mask)
        return out + 1e-3 if q.shape[-2] == 1 else out
    cell = REPO / "solutions" / CHAPTER_13 / f"{CHAPTER_13}.ipynb"
    printed = _run_demo(_demo_cell(cell), off_by_much)
    assert "full attention: False (largest difference 1.0e-03)" in printed, printed


# --------------------------------------------------------------------------------------------
# 2. A broken helper blamed only when it was called; "fix X first" where exercises build on
#    earlier ones


_CH04_HELPERS = """
def attention_scores(q, k):                       # broken: unscaled
    return q @ k.transpose(-2, -1)

def masked_softmax(scores, mask=None):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = (scores - top).exp()
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp_min(1e-30), torch.zeros_like(e))
"""


def _check_attention_with_helpers(ns):
    def checker(f, seed):
        nb04.check_attention(f, seed=seed, attention_scores=ns["attention_scores"],
                             masked_softmax=ns["masked_softmax"])
    return checker


def test_chapter_04_does_not_blame_a_helper_attention_does_not_call():
    ns = learner(_CH04_HELPERS + """
def attention(q, k, v, mask=None):                # own scores inline; transposed weights
    weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
    return weights.transpose(-2, -1) @ v, weights
""")
    failure = failure_of(_check_attention_with_helpers(ns), ns["attention"])
    assert failure.mistake == "04.attention.transposed_weights_times_v"


def test_chapter_04_blames_a_broken_helper_attention_calls():
    ns = learner(_CH04_HELPERS + """
def attention(q, k, v, mask=None):
    weights = masked_softmax(attention_scores(q, k), mask)
    return weights @ v, weights
""")
    failure = failure_of(_check_attention_with_helpers(ns), ns["attention"])
    assert failure.mistake == "04.attention.fix_attention_scores_first"
    assert str(nb04.NO_SCALE) in str(failure.hint)  # the helper's own mistake, told


_CH05 = """
def split_heads(x, n_heads):                      # broken: no transpose
    b, s, w = x.shape
    return x.reshape(b, n_heads, s, w // n_heads)

def merge_heads(x):
    b, n, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, n * d)

def split_qkv(qkv, n_heads, n_kv_heads, head_dim):
    a, b = n_heads * head_dim, n_kv_heads * head_dim
    return (split_heads(qkv[..., :a], n_heads), split_heads(qkv[..., a:a + b], n_kv_heads),
            split_heads(qkv[..., a + b:], n_kv_heads))

def multi_head_attention(x, w_qkv, w_o, n_heads, mask=None):
    q, k, v = split_qkv(x @ w_qkv, n_heads, n_heads, x.shape[-1] // n_heads)
    out, _ = attention(q, k, v, mask)
    return merge_heads(out) @ w_o.T                # and W_O transposed
"""


@pytest.mark.parametrize("exercise", ["split_qkv", "multi_head_attention"])
def test_chapter_05_says_fix_split_heads_first(exercise):
    ns = learner(_CH05, attention=ref.attention)
    failure = failure_of(getattr(nb05, f"check_{exercise}"), ns[exercise])
    assert failure.mistake == f"05.{exercise}.fix_split_heads_first"


_CH11_PIECES = dict(rms_norm=ref.rms_norm, split_qkv=ref.split_qkv, merge_heads=ref.merge_heads,
                    apply_rope=ref.apply_rope, causal_mask=ref.causal_mask,
                    grouped_query_attention=ref.grouped_query_attention,
                    masked_softmax=ref.masked_softmax, swiglu_ffn=ref.swiglu_ffn)

_CH11_SUBLAYER_NO_ROPE_ON_K = """
def attention_sublayer(x, layer, cfg, positions):
    h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
    q, k, v = split_qkv(h @ layer["wqkv"], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
    q = apply_rope(q, positions, base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    out = grouped_query_attention(q, k, v, causal_mask(x.shape[1]))
    return merge_heads(out) @ layer["wo"]
"""

_CH11_BLOCK_FFN_ON_X = """
def decoder_block(x, layer, cfg, positions):
    u = x + attention_sublayer(x, layer, cfg, positions)
    ffn_in = rms_norm(x, layer["ffn_norm"], cfg.norm_eps)       # X instead of U
    return u + swiglu_ffn(ffn_in, layer["w_gate"], layer["w_up"], layer["w_down"])
"""


def test_chapter_11_says_fix_attention_sublayer_first():
    ns = learner(_CH11_SUBLAYER_NO_ROPE_ON_K + _CH11_BLOCK_FFN_ON_X, **_CH11_PIECES)
    text = str(failure_of(nb11.check_decoder_block, ns["decoder_block"]))
    assert "your attention_sublayer does not pass its own check (rotated Q but not K" in text
    assert "decoder_block is built on it, so fix attention_sublayer first" in text


def test_chapter_11_keeps_its_own_diagnosis_when_the_sublayer_is_right():
    ns = learner(_CH11_BLOCK_FFN_ON_X, attention_sublayer=ref.attention_sublayer, **_CH11_PIECES)
    text = str(failure_of(nb11.check_decoder_block, ns["decoder_block"]))
    assert "ran the FFN on X in parallel with attention" in text
    assert "first" not in text.split("likely mistake:")[1].split("\n")[0]


def test_chapter_11_names_an_earlier_exercise_that_is_not_started():
    ns = learner("""
def attention_sublayer(x, layer, cfg, positions):
    raise NotImplementedError()
""" + _CH11_BLOCK_FFN_ON_X, **_CH11_PIECES)
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(NotStarted) as info:
        nb11.check_decoder_block(ns["decoder_block"], seed=0)
    assert "calls attention_sublayer, which is not started yet: write attention_sublayer " \
           "first" in str(info.value)


_CH13_PIECES = dict(rms_norm=ref.rms_norm, split_qkv=ref.split_qkv, merge_heads=ref.merge_heads,
                    apply_rope=ref.apply_rope, causal_mask=ref.causal_mask, embed=ref.embed,
                    grouped_query_attention=ref.grouped_query_attention,
                    masked_softmax=ref.masked_softmax, swiglu_ffn=ref.swiglu_ffn,
                    model_forward=ref.model_forward, sample_next_token=ref.sample_next_token,
                    KVCache=ref.KVCache)


def _forward_with_cache(positions: str, scores: str) -> str:
    return f"""
def forward_with_cache(token_ids, params, cfg, cache, start_pos):
    T = token_ids.shape[1]
    positions = {positions}
    mask = causal_mask(T, start_pos + T)
    rope = dict(base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    x = embed(token_ids, params["embed"])
    group = cfg.n_heads // cfg.n_kv_heads
    for i, layer in enumerate(params["layers"]):
        h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        q, k, v = split_qkv(h @ layer["wqkv"], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
        q, k = apply_rope(q, positions, **rope), apply_rope(k, positions, **rope)
        k_all, v_all = cache.update(i, k, v, start_pos)
        k_all, v_all = k_all.repeat_interleave(group, 1), v_all.repeat_interleave(group, 1)
        weights = masked_softmax(q @ k_all.transpose(-2, -1) / {scores}, mask)
        x = x + merge_heads(weights @ v_all) @ layer["wo"]
        ffn_in = rms_norm(x, layer["ffn_norm"], cfg.norm_eps)
        x = x + swiglu_ffn(ffn_in, layer["w_gate"], layer["w_up"], layer["w_down"])
    return rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"]
"""


_CH13_GENERATE_ONE_TOO_FAR = """
def generate(params, cfg, prompt_ids, max_new_tokens, *, use_cache=True, temperature=0.0,
             generator=None):
    b, p = prompt_ids.shape
    tokens = torch.empty(b, p + max_new_tokens, dtype=torch.long)
    tokens[:, :p] = prompt_ids
    with torch.no_grad():
        cache = KVCache(cfg, b, p + max_new_tokens + 1, dtype=params["embed"].dtype)
        for t in range(max_new_tokens):
            pos = p + t
            if not use_cache:
                logits = model_forward(tokens[:, :pos], params, cfg)
            elif t == 0:
                logits = forward_with_cache(prompt_ids, params, cfg, cache, 0)
            else:                                      # decoded one position too far
                logits = forward_with_cache(tokens[:, pos - 1:pos], params, cfg, cache, pos)
            tokens[:, pos] = sample_next_token(logits[:, -1], temperature=temperature,
                                               generator=generator)
    return tokens
"""


def test_chapter_13_says_fix_forward_with_cache_first():
    ns = learner(_forward_with_cache("torch.arange(T)", "math.sqrt(cfg.head_dim)")
                 + _CH13_GENERATE_ONE_TOO_FAR, **_CH13_PIECES)
    failure = failure_of(nb13.check_generate, ns["generate"])
    assert failure.mistake == "13.generate.fix_forward_with_cache_first", str(failure)
    assert str(NO_OFFSET) in str(failure)     # the helper's own problem, named


def test_chapter_13_keeps_its_own_diagnosis_when_forward_with_cache_is_right():
    ns = learner(_forward_with_cache("torch.arange(start_pos, start_pos + T)",
                                     "math.sqrt(cfg.head_dim)")
                 + _CH13_GENERATE_ONE_TOO_FAR, **_CH13_PIECES)
    failure = failure_of(nb13.check_generate, ns["generate"])
    assert failure.mistake == "13.generate.start_pos_one_too_far", str(failure)


# --------------------------------------------------------------------------------------------
# 3. An error inside the learner's code names the function its line is in


def test_an_error_names_the_function_it_was_raised_in():
    ns = learner("""
def split_heads(x, n_heads):
    b, s, w = x.shape
    return x.reshape(b, s, n_heads, -1, 7)      # line 4 of the cell

def split_qkv(qkv, n_heads, n_kv_heads, head_dim):
    a, b = n_heads * head_dim, n_kv_heads * head_dim
    return (split_heads(qkv[..., :a], n_heads), split_heads(qkv[..., a:a + b], n_kv_heads),
            split_heads(qkv[..., a + b:], n_kv_heads))
""")
    for checker, fn in ((nb05.check_split_heads, ns["split_heads"]),
                        (nb05.check_split_qkv, ns["split_qkv"])):
        text = str(failure_of(checker, fn))
        assert "raised RuntimeError" in text
        assert "in split_heads, line 4: return x.reshape(b, s, n_heads, -1, 7)" in text, text


def test_in_chinese_an_error_names_its_function_and_fix_first_names_the_helper(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "zh")
    ns = learner("""
def split_heads(x, n_heads):
    b, s, w = x.shape
    return x.reshape(b, s, n_heads, -1, 7)
""")
    err = failure_of(nb05.check_split_heads, ns["split_heads"])
    assert "位于第 4 行（在 split_heads 中）：return x.reshape(b, s, n_heads, -1, 7)" in str(err)
    assert "in split_heads, line 4: " in err.message          # checkers read the English
    ns = learner(_CH05, attention=ref.attention)
    text = str(failure_of(nb05.check_multi_head_attention, ns["multi_head_attention"]))
    assert "multi_head_attention 建立在它之上，所以请先修好 split_heads" in text


def test_an_error_at_a_lambda_keeps_the_line_alone():
    text = str(failure_of(nb05.check_split_heads, lambda x, n: x.reshape(-1, 7, 3, 5)))
    assert re.search(r"\n  at line \d+: ", text), text


# --------------------------------------------------------------------------------------------
# 4. Scores divided by sqrt(H) instead of sqrt(D_h)


def _sublayer_scaled_by(width: str) -> str:
    return f"""
def attention_sublayer(x, layer, cfg, positions):
    h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
    q, k, v = split_qkv(h @ layer["wqkv"], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
    q = apply_rope(q, positions, base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    k = apply_rope(k, positions, base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
    group = cfg.n_heads // cfg.n_kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt({width})
    out = masked_softmax(scores, causal_mask(x.shape[1])) @ v
    return merge_heads(out) @ layer["wo"]
"""


# Right while H = N_h * D_h (the first case), so that the case with D_h != H / N_h decides.
_ONLY_WHEN_DECOUPLED = "cfg.head_dim if cfg.hidden_size == cfg.n_heads * cfg.head_dim else {}"


@pytest.mark.parametrize("width, named", [
    ("cfg.hidden_size", "scaled the scores by 1/sqrt(H) = 1/sqrt(N_h * D_h)"),
    (_ONLY_WHEN_DECOUPLED.format("cfg.hidden_size"), "scaled the scores by 1/sqrt(H), the model "
                                                     "width (cfg.hidden_size)"),
    (_ONLY_WHEN_DECOUPLED.format("cfg.n_heads * cfg.head_dim"),
     "scaled the scores by 1/sqrt(N_h * D_h), the width of all heads together"),
], ids=["H", "H, D_h != H / N_h", "N_h * D_h, D_h != H / N_h"])
@pytest.mark.parametrize("seed", [0, 1])
def test_chapter_11_names_the_scale_by_sqrt_h(width, named, seed):
    ns = learner(_sublayer_scaled_by(width), **_CH11_PIECES)
    assert named in str(failure_of(nb11.check_attention_sublayer, ns["attention_sublayer"],
                                   seed))


def test_chapter_11_scores_by_hand_with_sqrt_d_h_pass():
    ns = learner(_sublayer_scaled_by("cfg.head_dim"), **_CH11_PIECES)
    assert_passes(nb11.check_attention_sublayer, ns["attention_sublayer"], 0)


def test_chapter_11_names_the_scale_through_the_block():
    ns = learner(_sublayer_scaled_by("cfg.hidden_size") + """
def decoder_block(x, layer, cfg, positions):
    u = x + attention_sublayer(x, layer, cfg, positions)
    ffn_in = rms_norm(u, layer["ffn_norm"], cfg.norm_eps)
    return u + swiglu_ffn(ffn_in, layer["w_gate"], layer["w_up"], layer["w_down"])
""", **_CH11_PIECES)
    text = str(failure_of(nb11.check_decoder_block, ns["decoder_block"]))
    assert "scaled the scores by 1/sqrt(H)" in text


@pytest.mark.parametrize("seed", [0, 1])
def test_chapter_13_names_the_scale_by_sqrt_h(seed):
    ns = learner(_forward_with_cache("torch.arange(start_pos, start_pos + T)",
                                     "math.sqrt(cfg.hidden_size)"), **_CH13_PIECES)
    failure = failure_of(nb13.check_forward_with_cache, ns["forward_with_cache"], seed)
    assert failure.mistake == "13.forward_with_cache.scaled_by_sqrt_h", str(failure)


def test_chapter_13_scores_by_hand_with_sqrt_d_h_pass():
    ns = learner(_forward_with_cache("torch.arange(start_pos, start_pos + T)",
                                     "math.sqrt(cfg.head_dim)"), **_CH13_PIECES)
    assert_passes(nb13.check_forward_with_cache, ns["forward_with_cache"], 0)


def test_chapters_04_and_05_name_the_scale_by_sqrt_h():
    ns = learner("""
def attention_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-3] * q.shape[-1]) if q.dim() == 4 \\
        else q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])

def multi_head_attention(x, w_qkv, w_o, n_heads, mask=None):
    h = x.shape[-1]
    q, k, v = split_qkv(x @ w_qkv, n_heads, n_heads, h // n_heads)
    weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(h), mask)
    return merge_heads(weights @ v) @ w_o
""", split_qkv=ref.split_qkv, merge_heads=ref.merge_heads, masked_softmax=ref.masked_softmax)
    assert failure_of(nb04.check_attention_scores, ns["attention_scores"]).mistake == \
        "04.attention_scores.scaled_by_sqrt_h"
    assert failure_of(nb05.check_multi_head_attention, ns["multi_head_attention"]).mistake == \
        "05.multi_head_attention.scaled_by_sqrt_h"


# --------------------------------------------------------------------------------------------
# 5. The learner's guide: a failing check stops Run All, and how to go on


def test_the_guide_says_a_failing_check_stops_run_all_and_how_to_go_on():
    guide = (REPO / "docs" / "learner" / "guide.md").read_text(encoding="utf-8")
    text = " ".join(guide.split())
    assert "does not stop \"Run All Cells\"" in text            # the not-started line
    assert "a failing check (a red **✗**) does stop \"run all cells\"" in text.lower()
    assert "Run Selected Cell and All Below" in text             # JupyterLab's Run menu
    assert "one by one" in text


def test_library_functions_named_like_an_exercise_are_not_the_learners():
    """`F.silu` and `F.rms_norm` are Python functions named like chapters 09's and 10's
    exercises: calling them is no call of the learner's own `silu`/`rms_norm`."""
    import torch.nn.functional as F

    from checks.engine import CallRecord

    record = CallRecord(["silu", "rms_norm"], {})
    x = torch.randn(3, 4)

    def learner_swiglu(x):
        return F.silu(x) * F.rms_norm(x, (4,))

    with record.watching():
        learner_swiglu(x)
    assert record.seen == {}

    cell = {"torch": torch}              # the learner's own silu, defined in a notebook cell
    exec(compile("def silu(x):\n    return x * torch.sigmoid(x)\n\n"
                 "def swiglu(x):\n    return silu(x)\n", "<cell>", "exec"), cell)
    with record.watching():
        cell["swiglu"](x)
    assert record.seen == {"silu": cell["silu"]}
