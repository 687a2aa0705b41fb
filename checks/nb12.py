"""Checks for chapter 12: the whole model, its logits, the next-token loss, the parameter count and
sampling the next token.

Conventions (course-spec section 2): params = {embed [|V|, H], layers: a list of L block dicts,
final_norm [H], lm_head [H, |V|]} with an untied LM head; model_forward(token_ids [B, S]) is
embedding -> L decoder blocks -> final RMSNorm -> LM head, logits [B, S, |V|], with positions
defaulting to arange(S); the loss at position t predicts token t + 1 and is averaged over all
B * (S - 1) predictions; sample_next_token(logits [B, |V|]) draws one token per row from
softmax(logits / T) restricted to the top_k largest logits, and is greedy (argmax) at T = 0.

Sampling is checked statistically without ever flaking: each distribution is sampled N times
(N rows of the same logits, so the batch rows must be independent draws) and every empirical
frequency must lie within a Hoeffding bound of its probability. The bound is chosen so that a
correct sampler fails any one check run with probability below 1e-10 (a union bound over every
token of every distribution a run compares). On top of that, exact properties: greedy equals
argmax, top-k never returns a token outside the top k, the same generator seed gives the same
samples and different seeds different ones.

Known mistakes are recognised by computing them from the same inputs with the reference pieces.
Some properties cannot be observed when the grader calls the function in another process (a
gradient does not travel; torch's global generator is the other process's): those are checked
when the function runs here, which is always the case in the notebook and in the grader's run
inside the notebook.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import reference as ref
from .config import LLAMA2_7B, ModelConfig
from .engine import Check, CheckFailure, LearnerError, is_remote, values_close
from .nb11 import random_layer, random_positions  # the same random blocks as chapter 11
from .reference import block as ref_block
from .reference import model as ref_model
from .i18n import N_, _
from .reference.norms import rms_norm

TOP = ("embed", "layers", "final_norm", "lm_head")
BLOCK = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
BLOCK_NORMS = ("attn_norm", "ffn_norm")
BLOCK_MATRICES = ("wqkv", "wo", "w_gate", "w_up", "w_down")
INIT_STD = ref_block.INIT_STD
LOGITS = ("B", "S", "V")

# --------------------------------------------------------------------------------------------
# The course's own answers are not answers: calling checks.reference's version of the exercise
# (however it was imported or renamed) is caught by its code object while the learner's function
# runs. The earlier chapters' pieces (decoder_block, init_block_params, rms_norm, ...) stay
# allowed: they are what this chapter assembles.

_REFERENCE_HINT = N_("this exercise asks you to write {name} yourself (from the earlier chapters' "
                     "pieces where it needs them), not to call the course's finished one")


BUILD_BLOCK = N_("build each block with init_block_params (chapter 11)")


def _no_reference(c: Check, *names: str) -> None:
    """Make `c.call` fail if the learner's function reaches checks.reference's `names`."""
    c.forbid_functions([getattr(ref_model, n) for n in names], _(_REFERENCE_HINT))


def _local(f) -> bool:
    """Whether the learner's function runs in this process (not through the grader's worker)."""
    return not is_remote(f)


def _quiet_expect(c: Check, got, want, **kw) -> None:
    """expect_tensor without listing the case in the pass summary."""
    c.expect_tensor(got, want, **kw)
    if kw.get("what") in c.properties:
        c.properties.remove(kw["what"])


def _cfg_text(cfg: ModelConfig) -> str:
    return (f"|V|={cfg.vocab_size}, H={cfg.hidden_size}, N_h={cfg.n_heads}, "
            f"N_kv={cfg.n_kv_heads}, D_h={cfg.head_dim}, H_ff={cfg.ffn_hidden_size}, "
            f"L={cfg.n_layers}")


# ============================================================================================
# Exercise 1: init_model_params


def _init_cfgs(c: Check) -> list[ModelConfig]:
    """GQA with D_h != H / N_h and three blocks; MHA with two. Every matrix has >= 500 entries,
    |V| > H, and all sizes differ."""
    n_kv, g = c.sizes(2, 2, 4)
    d = c.choice([8, 10])
    n_h = n_kv * g
    gqa = ModelConfig(vocab_size=c.randint(90, 130), hidden_size=n_h * d + c.choice([4, 8]),
                      n_heads=n_h, n_kv_heads=n_kv, head_dim=d,
                      ffn_hidden_size=80 + c.randint(0, 20), n_layers=3, max_seq_len=64)
    n = c.randint(3, 6)
    mha = ModelConfig(vocab_size=c.randint(60, 90), hidden_size=8 * n, n_heads=n, n_kv_heads=n,
                      ffn_hidden_size=24 * n + 4, n_layers=2, max_seq_len=64)
    return [gqa, mha]


def _top_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return ref_model.model_shapes(cfg)


def _top_shape_hint(name: str, got: tuple, want: tuple, cfg: ModelConfig) -> str | None:
    h, v = cfg.hidden_size, cfg.vocab_size
    if name == "lm_head":
        if got == (v, h):
            return _("the LM head is applied as x @ W, so it is [H, |V|] (a [|V|, H] matrix is "
                     "the embedding table's layout, or nn.Linear's [out, in])")
        if got == (h, h) or got == (cfg.n_heads * cfg.head_dim, h):
            return _("the LM head maps the H features of a token to |V| scores, [H, |V|]; a "
                     "matrix into H features is the shape of the attention output projection W_O")
    if name == "embed" and got == (h, v):
        return _("the embedding table has one row per token: [|V|, H]")
    if name == "final_norm" and len(got) != 1:
        return _("a norm's scale is one number per hidden feature: shape [H]")
    return None


def _expect_block_layout(c: Check, layer, cfg: ModelConfig, dtype: torch.dtype, where: str,
                         label: str) -> None:
    if not isinstance(layer, dict):
        c.fail(_("{where} is {kind}; expected a dict with the block's 7 tensors ({names}).")
               .format(where=where, kind=type(layer).__name__, names=", ".join(BLOCK)),
               BUILD_BLOCK)
    missing = [n for n in BLOCK if n not in layer]
    extra = sorted(str(k) for k in set(layer) - set(BLOCK))
    if missing or extra:
        c.fail(_("{where} does not have the block layout's keys ({problems}).").format(
            where=where, problems=_key_problems(missing, extra)),
               _("build each block with init_block_params (chapter 11): {names}").format(
                   names=", ".join(BLOCK)))
    shapes = ref_block.block_shapes(cfg)
    for name in BLOCK:
        t = layer[name]
        if not isinstance(t, torch.Tensor):
            c.fail(_("{name} is {kind}; expected a torch.Tensor.").format(
                name=f"{where}['{name}']", kind=type(t).__name__))
        if tuple(t.shape) != shapes[name]:
            c.fail(_("{name} has shape {got}, expected {want} ({case}).").format(
                name=f"{where}['{name}']", got=list(t.shape), want=list(shapes[name]),
                case=label), BUILD_BLOCK)
        if t.dtype != dtype:
            c.fail(_("{name} has dtype {got}, expected {want} ({case}).").format(
                name=f"{where}['{name}']", got=t.dtype, want=dtype, case=label),
                   _("pass dtype=dtype on to every block (init_block_params(cfg, generator, "
                     "dtype))"))


def _key_problems(missing: list[str], extra: list[str]) -> str:
    """"missing a, b; unexpected c" in the current language."""
    return "; ".join(([_("missing {names}").format(names=", ".join(missing))] if missing else [])
                     + ([_("unexpected {names}").format(names=", ".join(extra))] if extra
                        else []))


def _expect_model_layout(c: Check, got, cfg: ModelConfig, dtype: torch.dtype, label: str) -> None:
    if not isinstance(got, dict):
        c.fail(_("returned {kind}; expected a dict with the keys {names}.").format(
            kind=type(got).__name__, names=", ".join(TOP)))
    keys = set(got)
    missing = [n for n in TOP if n not in keys]
    extra = sorted(str(k) for k in keys - set(TOP))
    if missing or extra:
        hint = _("use the names of the parameter layout exactly")
        if "lm_head" in missing and not ({"output", "head", "unembed", "w_out"} & keys):
            hint = _("LLaMA-2's LM head is a matrix of its own (not tied to the embedding): "
                     "params['lm_head'], [H, |V|]")
        elif "layers" in missing and ({"blocks", "block", "h", "layer"} & keys):
            hint = _("the list of blocks is called 'layers'")
        elif "final_norm" in missing and ({"norm", "ln_f", "norm_f"} & keys):
            hint = _("the norm after the last block is called 'final_norm'")
        c.fail(_("the dict's keys are not the layout's ({problems}); expected exactly {names}.")
               .format(problems=_key_problems(missing, extra), names=", ".join(TOP)), hint)
    for name, shape in _top_shapes(cfg).items():
        t = got[name]
        if not isinstance(t, torch.Tensor):
            c.fail(_("{name} is {kind}; expected a torch.Tensor.").format(
                name=f"params['{name}']", kind=type(t).__name__))
        if tuple(t.shape) != shape:
            c.fail(_("{name} has shape {got}, expected {want} ({case}).").format(
                name=f"params['{name}']", got=list(t.shape), want=list(shape), case=label),
                   _top_shape_hint(name, tuple(t.shape), shape, cfg))
        if t.dtype != dtype:
            c.fail(_("{name} has dtype {got}, expected {want} ({case}).").format(
                name=f"params['{name}']", got=t.dtype, want=dtype, case=label),
                   _("create every tensor with dtype=dtype (the final norm too)"))
    layers = got["layers"]
    if not isinstance(layers, list):
        c.fail(_("params['layers'] is {kind}; expected a list with one dict per block.").format(
            kind=type(layers).__name__),
               "params['layers'] = [init_block_params(cfg, generator, dtype) for _ in "
               "range(cfg.n_layers)]")
    if len(layers) != cfg.n_layers:
        c.fail(_("params['layers'] holds {count} blocks, expected {want} (cfg.n_layers; {case}).")
               .format(count=len(layers), want=cfg.n_layers, case=label),
               _("one block per layer: range(cfg.n_layers)"))
    for i, layer in enumerate(layers):
        _expect_block_layout(c, layer, cfg, dtype, f"params['layers'][{i}]", label)
    c.note(_("the layout: embed [|V|, H], L blocks, final_norm [H], lm_head [H, |V|]"))


def _expect_random_matrix(c: Check, t: torch.Tensor, where: str, label: str) -> None:
    t = t.detach().double()
    if not bool(t.isfinite().all()):
        c.fail(_("{name} holds NaN or inf ({case}).").format(name=where, case=label),
               _("torch.empty leaves memory uninitialised: fill it (normal_) or use "
                 "torch.randn"))
    mean, std, n = float(t.mean()), float(t.std()), t.numel()
    if std == 0:
        c.fail(_("every entry of {name} is {value} ({case}).").format(
            name=where, value=f"{float(t.flatten()[0]):g}", case=label),
               _("draw the weight matrices at random: torch.randn(..., "
                 "generator=generator) * 0.02"))
    rows_equal = t.shape[0] > 1 and bool((t[0] == t[1]).all())
    cols_equal = t.shape[1] > 1 and bool((t[:, 0] == t[:, 1]).all())
    if rows_equal or cols_equal:
        repeats = (_("{name} repeats the same row ({case}).") if rows_equal else
                   _("{name} repeats the same column ({case})."))
        c.fail(repeats.format(name=where, case=label),
               _("draw the whole matrix at once, one random number per entry"))
    # With >= 500 entries the sample std of a correct draw is within 25% of 0.02 except with
    # probability < 1e-15, and the mean within 7 standard errors except with probability < 1e-11.
    if not (0.75 * INIT_STD <= std <= 1.25 * INIT_STD):
        if 0.75 <= std <= 1.25:
            hint = _("std 1: multiply torch.randn(...) by 0.02")
        elif abs(std * math.sqrt(t.shape[0]) - 1) < 0.25:
            hint = _("scaled by 1 / sqrt(fan_in); this course (like LLaMA's and Hugging Face's "
                     "initializer_range) draws every matrix with std 0.02")
        elif abs(std - INIT_STD / math.sqrt(3)) < 0.15 * INIT_STD:
            hint = _("uniform in [-0.02, 0.02] has std 0.0115: draw from a normal with std "
                     "0.02")
        else:
            hint = _("draw from a normal distribution with mean 0 and std 0.02")
        c.fail(_("{name} has standard deviation {std}, expected about {want} ({case}).").format(
            name=where, std=f"{std:.4g}", want=INIT_STD, case=label), hint)
    if abs(mean) > 7 * INIT_STD / math.sqrt(n):
        c.fail(_("{name} has mean {mean}, expected about 0 ({case}).").format(
            name=where, mean=f"{mean:.4g}", case=label),
               _("draw from a normal with mean 0 (torch.rand is uniform on [0, 1))"))


def _expect_model_values(c: Check, got: dict, label: str) -> None:
    if not bool((got["final_norm"] == 1).all()):
        c.fail(_("{name} should be all ones ({case}).").format(name="params['final_norm']",
                                                               case=label),
               _("a norm's scale starts at one (torch.ones), like the blocks' norms"))
    _expect_random_matrix(c, got["embed"], "params['embed']", label)
    _expect_random_matrix(c, got["lm_head"], "params['lm_head']", label)
    if torch.equal(got["lm_head"], got["embed"].T):
        c.fail(_("params['lm_head'] is the embedding table transposed ({case}).").format(
            case=label),
               _("that is a tied LM head (GPT-2 does it); LLaMA-2's LM head is a matrix of its "
                 "own: draw it separately, [H, |V|]"))
    layers = got["layers"]
    for i, layer in enumerate(layers):
        for name in BLOCK_NORMS:
            if not bool((layer[name] == 1).all()):
                c.fail(_("{name} should be all ones ({case}).").format(
                    name=f"params['layers'][{i}]['{name}']", case=label), BUILD_BLOCK)
        for name in BLOCK_MATRICES:
            _expect_random_matrix(c, layer[name], f"params['layers'][{i}]['{name}']", label)
        for j in range(i):
            same = [n for n in BLOCK_MATRICES if torch.equal(layer[n], layers[j][n])]
            if same:
                c.fail(_("blocks {j} and {i} hold the same {names} ({case}).").format(
                    j=j, i=i, names=", ".join(same), case=label),
                       _("every block needs its own weights: call init_block_params once per "
                         "block (`[init_block_params(...)] * L` repeats ONE dict L times, and a "
                         "fixed seed per block makes every block draw the same numbers)"))
    c.note(_("norms at one; matrices N(0, 0.02^2); every block its own; LM head untied"))


def _all_tensors(p: dict) -> list[tuple[str, torch.Tensor]]:
    out = [(f"params['{n}']", p[n]) for n in ("embed", "final_norm", "lm_head")]
    for i, layer in enumerate(p["layers"]):
        out += [(f"params['layers'][{i}]['{n}']", layer[n]) for n in BLOCK]
    return out


def _random_tensors(p: dict) -> list[tuple[str, torch.Tensor]]:
    return [(w, t) for w, t in _all_tensors(p) if "norm" not in w]


def check_init_model_params(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("init_model_params", f, seed=seed) as c:
        _no_reference(c, "init_model_params")
        local = _local(f)
        for cfg in _init_cfgs(c) + ([_init_cfgs(c)[0]] if thorough else []):
            label = _cfg_text(cfg)
            s = c.randint(0, 2**31 - 1)
            got = c.call(cfg, generator=torch.Generator().manual_seed(s))
            _expect_model_layout(c, got, cfg, torch.float32, label)
            _expect_model_values(c, got, label)
            again = c.call(cfg, generator=torch.Generator().manual_seed(s))
            _expect_model_layout(c, again, cfg, torch.float32, label)
            differ = [w for (w, a), (_w, b) in zip(_all_tensors(got), _all_tensors(again))
                      if not torch.equal(a, b)]
            if differ:
                blocks_only = all(w.startswith("params['layers']") for w in differ)
                names = ", ".join(differ[:3]) + (" ..." if len(differ) > 3 else "")
                c.fail(_("two generators seeded alike ({seeded}) gave different {names} "
                         "({case}).").format(seeded=f"torch.Generator().manual_seed({s})",
                                             names=names, case=label),
                       _("pass generator=generator on to init_block_params as well")
                       if blocks_only else
                       _("draw every random number from the `generator` argument: "
                         "torch.randn(..., generator=generator)"))
            other = c.call(cfg, generator=torch.Generator().manual_seed(s + 1))
            _expect_model_layout(c, other, cfg, torch.float32, label)
            same = [w for (w, a), (_w, b) in zip(_random_tensors(got), _random_tensors(other))
                    if torch.equal(a, b)]
            if same:
                c.fail(_("generators with different seeds gave the same {names} ({case}).")
                       .format(names=", ".join(same[:3]), case=label),
                       _("the weights must come from the `generator` argument; a fixed seed "
                         "(torch.manual_seed) inside the function makes them constant"))
        c.headline(_("reproducible from a seeded generator"))
        cfg = _init_cfgs(c)[1]
        for dtype in ((torch.float64, torch.bfloat16, torch.float16) if thorough
                      else (torch.float64, torch.bfloat16)):
            label = f"{_cfg_text(cfg)}, dtype={str(dtype).removeprefix('torch.')}"
            got = c.call(cfg, generator=torch.Generator().manual_seed(c.randint(0, 1000)),
                         dtype=dtype)
            _expect_model_layout(c, got, cfg, dtype, label)
            _expect_model_values(c, got, label)
        c.note(_("float64 and bfloat16"))
        # generator=None: torch's global generator, which moves on after every draw.
        label = _cfg_text(cfg) + ", generator=None"
        first, second = c.call(cfg), c.call(cfg)
        for p in (first, second):
            _expect_model_layout(c, p, cfg, torch.float32, label)
        _expect_model_values(c, first, label)
        same = [w for (w, a), (_w, b) in zip(_random_tensors(first), _random_tensors(second))
                if torch.equal(a, b)]
        if same:
            c.fail(_("with generator=None, two calls in a row gave the same {names}.").format(
                names=", ".join(same[:3])),
                   _("with generator=None draw from torch's global generator, which moves on "
                     "after every draw; a new torch.Generator() (or a fixed seed) starts from "
                     "the same state every time"))
        if local:
            state = torch.get_rng_state()
            try:
                s = c.randint(0, 2**31 - 1)
                torch.manual_seed(s)
                first = c.call(cfg)
                torch.manual_seed(s)
                second = c.call(cfg)
            finally:
                torch.set_rng_state(state)
            _expect_model_layout(c, second, cfg, torch.float32, label)
            differ = [w for (w, a), (_w, b) in zip(_all_tensors(first), _all_tensors(second))
                      if not torch.equal(a, b)]
            if differ:
                c.fail(_("with generator=None, two calls after the same torch.manual_seed gave "
                         "different {names}.").format(names=", ".join(differ[:3])),
                       _("with generator=None draw from torch's global generator (torch.randn(..., "
                         "generator=None) does)"))
        c.note(_("generator=None uses torch's global generator"))


# ============================================================================================
# Exercise 2: model_forward

NO_FINAL_NORM = N_("no final RMSNorm: after the last block, normalise with params['final_norm'] "
                   "(and cfg.norm_eps) before the LM head")
FINAL_EPS = N_("ignored cfg.norm_eps in the final norm: rms_norm(x, params['final_norm'], "
               "cfg.norm_eps)")
TIED_HEAD = N_("used the embedding table (transposed) as the LM head: LLaMA-2's LM head is its own "
               "matrix, params['lm_head'] [H, |V|]")
FIRST_BLOCK_ONLY = N_("ran only the first block: run all L blocks of params['layers'], in order")
LAST_BLOCK_ONLY = N_("ran only the last block (was x overwritten from the embeddings in the "
                     "loop?): each block takes the previous block's output, x = decoder_block(x, "
                     "layer, ...)")
SKIPPED_LAST = N_("skipped the last block (range(L - 1)?): run every block of params['layers']")
REVERSED = N_("ran the blocks in reverse order: block 0 first, then 1, ..., L - 1")
FIRST_REPEATED = N_("ran params['layers'][0] L times: each block has its own weights, "
                    "for layer in params['layers']")
NO_BLOCKS = N_("left out the blocks: embed -> L decoder blocks -> final norm -> LM head")
EMBED_SCALED = N_("scaled the embeddings by sqrt(H) (as the original Transformer and Gemma do); "
                  "LLaMA feeds the looked-up rows as they are")
NORM_EVERY = N_("applied the final norm after every block: it comes once, after the last block "
                "(each block normalises its own sublayer inputs)")
POSITIONS_IGNORED = N_("ignored `positions`: used 0, 1, ..., S-1 although positions were given; "
                       "pass the given positions to every block (arange(S) is only the default)")
FIRST_ROW_POSITIONS = N_("used the first row of positions [B, S] for every sequence; pass the "
                         "whole [B, S] tensor on to the blocks (RoPE accepts it)")
PROBABILITIES = N_("returned probabilities (softmax of the logits): model_forward returns the raw "
                   "scores x @ W_lm; the softmax belongs to the loss or to sampling")
LOG_PROBABILITIES = N_("returned log-probabilities (log_softmax of the logits): model_forward "
                       "returns the raw scores x @ W_lm")
LAST_ONLY = N_("returned only the last position's logits [B, |V|]: model_forward returns the "
               "logits of every position, [B, S, |V|] (generation picks the last row itself)")
NORM_AFTER_HEAD = N_("normalised after the LM head: the final norm comes before it")
POSITIONS_REQUIRED = N_("positions is optional: `positions=None` in the signature, and when it is "
                        "None use torch.arange(S) (every sequence starts at position 0)")


def _model_cfg(c: Check, kind: str = "gqa", *, decoupled: bool = False, partial: bool = False,
               base: float = 10000.0, eps: float = 1e-5, layers: int = 3) -> ModelConfig:
    if kind == "gqa":
        n_kv, g = c.sizes(2, 2, 4)
    elif kind == "mqa":
        n_kv, g = 1, c.randint(2, 5)
    else:
        n_kv, g = c.randint(2, 5), 1
    n_h = n_kv * g
    d = c.choice([4, 6, 8])
    h = n_h * d + (c.choice([2, 4, 6]) if decoupled else 0)
    h = max(h, 8)
    return ModelConfig(vocab_size=c.randint(61, 100), hidden_size=h, n_heads=n_h,
                       n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=2 * h + c.randint(1, 9),
                       n_layers=layers, rope_base=base, rotary_dim=d - 2 if partial else d,
                       norm_eps=eps, max_seq_len=512)


def _params(c: Check, cfg: ModelConfig) -> dict:
    h, v = cfg.hidden_size, cfg.vocab_size
    return {"embed": c.randn(v, h), "layers": [random_layer(c, cfg) for _n in range(cfg.n_layers)],
            "final_norm": 1.0 + 0.4 * c.randn(h),
            "lm_head": c.randn(h, v, scale=1.5 / math.sqrt(h))}


def _forward(ids, params, cfg, positions, *, final_norm=True, eps=None, head=None, blocks=None,
             embed_scale=1.0, norm_every=False, arange=False, first_row=False):
    """model_forward with the named mistakes (no keyword: the correct computation)."""
    s = ids.shape[-1]
    pos = torch.arange(s) if positions is None or arange else positions
    if first_row and pos.dim() == 2:
        pos = pos[0]
    x = F.embedding(ids, params["embed"]) * embed_scale
    layers = params["layers"] if blocks is None else blocks(params["layers"])
    for layer in layers:
        x = ref.decoder_block(x, layer, cfg, pos)
        if norm_every:
            x = rms_norm(x, params["final_norm"], cfg.norm_eps)
    if final_norm and not norm_every:
        x = rms_norm(x, params["final_norm"], cfg.norm_eps if eps is None else eps)
    w = params["lm_head"] if head is None else head(params)
    return x @ w


def _forward_mixups(ids, params, cfg, positions) -> dict:
    def v(**kw):
        return lambda: _forward(ids, params, cfg, positions, **kw)

    def right():
        return _forward(ids, params, cfg, positions)

    wrong = {
        NO_FINAL_NORM: v(final_norm=False),
        TIED_HEAD: v(head=lambda p: p["embed"].T),
        FIRST_BLOCK_ONLY: v(blocks=lambda ls: ls[:1]),
        LAST_BLOCK_ONLY: v(blocks=lambda ls: ls[-1:]),
        SKIPPED_LAST: v(blocks=lambda ls: ls[:-1]),
        REVERSED: v(blocks=lambda ls: ls[::-1]),
        FIRST_REPEATED: v(blocks=lambda ls: [ls[0]] * len(ls)),
        NO_BLOCKS: v(blocks=lambda ls: []),
        EMBED_SCALED: v(embed_scale=math.sqrt(cfg.hidden_size)),
        NORM_EVERY: v(norm_every=True),
        PROBABILITIES: lambda: torch.softmax(right(), dim=-1),
        LOG_PROBABILITIES: lambda: torch.log_softmax(right(), dim=-1),
        LAST_ONLY: lambda: right()[:, -1],
        NORM_AFTER_HEAD: lambda: rms_norm(_forward(ids, params, cfg, positions, final_norm=False),
                                          torch.ones(cfg.vocab_size), cfg.norm_eps),
    }
    if cfg.norm_eps != 1e-5:
        wrong[FINAL_EPS] = v(eps=1e-5)
    if positions is not None:
        wrong[POSITIONS_IGNORED] = v(arange=True)
        if positions.dim() == 2:
            wrong[FIRST_ROW_POSITIONS] = v(first_row=True)
    return wrong


def _label(cfg: ModelConfig, b: int, s: int, positions, how: str) -> str:
    kind = ("MHA" if cfg.n_kv_heads == cfg.n_heads else
            "MQA" if cfg.n_kv_heads == 1 else "GQA")
    parts = [f"{kind}: B={b}, S={s}, {_cfg_text(cfg)}"]
    if cfg.rotary_dim != cfg.head_dim:
        parts.append(f"rotary_dim={cfg.rotary_dim}")
    if cfg.rope_base != 10000.0:
        parts.append(f"rope_base={cfg.rope_base:g}")
    if cfg.norm_eps != 1e-5:
        parts.append(f"norm_eps={cfg.norm_eps:g}")
    if positions is None:
        parts.append(how)
    elif positions.dim() == 1:
        parts.append(f"positions [S] {positions.tolist()}")
    else:
        parts.append(_("positions [B, S], one row per sequence"))
    return ", ".join(parts)


def _forward_case(c: Check, cfg: ModelConfig, b: int, s: int, mode: str) -> None:
    """mode: 'omitted' (no positions argument), 'none' (positions=None), 'S' or 'BS'."""
    params = _params(c, cfg)
    ids = c.randint(0, cfg.vocab_size, (b, s))
    positions = None if mode in ("omitted", "none") else random_positions(c, b, s, batched=mode == "BS")
    before = (ids.clone(), [(w, t.clone()) for w, t in _all_tensors(params)])
    how = _("positions not passed") if mode == "omitted" else "positions=None"
    label = _label(cfg, b, s, positions, how)
    try:
        if mode == "omitted":
            got = c.call(ids, params, cfg)
        elif mode == "none":
            got = c.call(ids, params, cfg, positions=None)
        else:
            got = c.call(ids, params, cfg, positions)
    except LearnerError as err:
        first = err.message.splitlines()[0]
        if mode in ("omitted", "none") and ("positions" in err.message or "NoneType" in first):
            raise CheckFailure(c.exercise, f"({label}) {err.shown_message}",
                               hint=POSITIONS_REQUIRED,
                               seed=c.seed) from None
        raise
    if not torch.equal(ids, before[0]) or any(not torch.equal(t, t0) for (_w, t), (_w0, t0) in
                                              zip(_all_tensors(params), before[1])):
        c.fail(_("changed its inputs (token_ids or params) in place ({case}).").format(
            case=label),
               _("leave the inputs alone: `x = x + ...` makes a new tensor, `x += ...` does not"))
    with torch.no_grad():
        want = ref_model.model_forward(ids, params, cfg, positions)
    _quiet_expect(c, got, want, what=f"logits ({label})", dims=LOGITS,
                  wrong=_forward_mixups(ids, params, cfg, positions), atol=1e-4, rtol=1e-3)


def check_model_forward(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("model_forward", f, seed=seed) as c:
        _no_reference(c, "model_forward")
        b, s = c.sizes(2, 2, 8)
        s += 2
        _forward_case(c, _model_cfg(c, "gqa"), b, s, "omitted")
        c.headline(_("embed -> L blocks -> final RMSNorm -> LM head, logits [B, S, |V|]"))
        _forward_case(c, _model_cfg(c, "gqa", decoupled=True, partial=True,
                                    base=c.choice([500.0, 1e6]), eps=c.choice([0.05, 0.2])),
                      b, s, "BS")
        _forward_case(c, _model_cfg(c, "mha"), b, s, "S")
        _forward_case(c, _model_cfg(c, "mqa", base=500.0, layers=2), b, s, "none")
        if thorough:
            for _n in range(3):
                b, s = c.sizes(2, 2, 8)
                _forward_case(c, _model_cfg(c, c.choice(["gqa", "mha", "mqa"]),
                                            decoupled=c.choice([False, True]),
                                            partial=c.choice([False, True]),
                                            eps=c.choice([1e-5, 0.1])),
                              b, s + 1, c.choice(["omitted", "S", "BS"]))
            _forward_case(c, _model_cfg(c, "gqa"), 3, 1, "omitted")   # one token
        c.headline(_("positions: default arange(S), [S] and [B, S] with gaps"))
        c.note(_("GQA, MHA, MQA; rope_base, rotary_dim and norm_eps from cfg"))
        # Causality, on the learner's own function: a new last token changes no earlier logits.
        cfg = _model_cfg(c, "gqa", layers=2)
        b, s = 2, c.randint(4, 8)
        params = _params(c, cfg)
        ids = c.randint(0, cfg.vocab_size, (b, s))
        changed = ids.clone()
        changed[:, -1] = (ids[:, -1] + 1 + c.randint(0, cfg.vocab_size - 1)) % cfg.vocab_size
        out, out2 = c.call(ids, params, cfg), c.call(changed, params, cfg)
        if isinstance(out, torch.Tensor) and isinstance(out2, torch.Tensor) and \
                out.shape == out2.shape == (b, s, cfg.vocab_size):
            if not values_close(out[:, :-1], out2[:, :-1], 1e-5, 1e-4):
                c.fail(_("changing only the LAST token changed the logits of earlier "
                         "positions."),
                       _("the model must be causal: every block's attention uses the causal "
                         "mask"))
            if values_close(out[:, -1], out2[:, -1], 1e-6, 1e-6):
                c.fail(_("changing the last token did not change the last position's logits."),
                       _("the logits of position t are computed from the tokens up to and "
                         "including t"))
        c.note(_("causal: a later token never changes earlier logits"))


# ============================================================================================
# Exercise 3: next_token_loss

NO_SHIFT = N_("no shift: the logits at position t predict the NEXT token, so compare "
              "logits[:, :-1] with token_ids[:, 1:] (scoring each position against its own token "
              "rewards copying the input)")
WRONG_WAY = N_("shifted the wrong way: logits[:, t] predicts token t + 1, so pair logits[:, :-1] "
               "with token_ids[:, 1:] (not logits[:, 1:] with token_ids[:, :-1])")
ROLLED = N_("wrapped around (torch.roll): the last position has no next token and the first token "
            "is never a target; drop them by slicing, logits[:, :-1] and token_ids[:, 1:]")
SUMMED = N_("summed instead of averaged: the loss is the MEAN over all B * (S - 1) predictions "
            "(cross_entropy's default reduction), so that it does not grow with batch or length")
SUM_OVER_TIME = N_("summed over the positions and averaged over the batch: take the mean over all "
                   "B * (S - 1) predictions")
SUM_OVER_BATCH = N_("averaged over the positions but summed over the batch: take the mean over all "
                    "B * (S - 1) predictions")
DIVIDED_BY_BS = N_("divided by B * S: there are only S - 1 predictions per sequence (the last "
                   "position has no next token); average over B * (S - 1)")
PER_TOKEN = N_("returned one loss per prediction: average them into one scalar (reduction='mean', "
               "or .mean())")
PER_SEQUENCE = N_("returned one loss per sequence: average over the batch as well, into one scalar")
SHAPE_ONE = N_("returned a tensor of shape [1]: the loss is a 0-dim scalar tensor")
AXIS_SEQ = N_("log-softmax over the wrong axis (the sequence axis, dim=1): the distribution is "
              "over the vocabulary, the last axis (dim=-1)")
AXIS_BATCH = N_("log-softmax over the wrong axis (the batch axis, dim=0): the distribution is over "
                "the vocabulary, the last axis (dim=-1)")
NO_LOG = N_("forgot the log: cross-entropy is the mean of -log p(target), not of -p(target)")
NO_LOG_SOFTMAX = N_("forgot the log-softmax: -logits[target] is not a log-probability; normalise "
                    "with log_softmax over the vocabulary first (nll_loss expects "
                    "log-probabilities)")
NO_MINUS = N_("forgot the minus sign: the loss is -log p(target), which is positive")
UNSTABLE = N_("not stable for large logits: exp() overflows (or softmax underflows to 0 and log(0) "
              "= -inf); use log_softmax (x - logsumexp(x)) or F.cross_entropy, which subtract the "
              "largest logit first")
NOT_DIFFERENTIABLE = N_("the loss must stay differentiable: training backpropagates through it; "
                        "avoid .item(), .detach(), .numpy(), torch.tensor(...) of a result or "
                        "torch.no_grad() inside the function")


def _ce(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), reduction=reduction)


def _nll_with(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """-mean of logp[:, t, ids[:, t + 1]] for a [B, S, V] tensor of (wrong) log-probabilities."""
    return -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()


def _loss_mixups(logits: torch.Tensor, ids: torch.Tensor) -> dict:
    b, s, _v = logits.shape
    shifted, targets = logits[:, :-1], ids[:, 1:]
    n = b * (s - 1)
    per_token = lambda: _ce(shifted, targets, "none").view(b, s - 1)  # noqa: E731
    return {
        NO_SHIFT: lambda: _ce(logits, ids),
        _("{mistake} (the last position dropped)").format(mistake=_(NO_SHIFT)):
            lambda: _ce(shifted, ids[:, :-1]),
        _("{mistake} (the first position dropped)").format(mistake=_(NO_SHIFT)):
            lambda: _ce(logits[:, 1:], targets),
        WRONG_WAY: lambda: _ce(logits[:, 1:], ids[:, :-1]),
        ROLLED: lambda: _ce(logits, ids.roll(-1, dims=1)),
        SUMMED: lambda: per_token().sum(),
        SUM_OVER_TIME: lambda: per_token().sum() / b,
        SUM_OVER_BATCH: lambda: per_token().sum() / (s - 1),
        DIVIDED_BY_BS: lambda: per_token().sum() / (b * s),
        PER_TOKEN: lambda: per_token(),
        _("{mistake} (flattened)").format(mistake=_(PER_TOKEN)): lambda: per_token().reshape(n),
        PER_SEQUENCE: lambda: per_token().mean(-1),
        SHAPE_ONE: lambda: _ce(shifted, targets).reshape(1),
        AXIS_SEQ: lambda: _nll_with(torch.log_softmax(logits, dim=1), ids),
        _("log-softmax over the wrong axis (the sequence axis, dim=1, of the sliced logits): the "
          "distribution is over the vocabulary, the last axis (dim=-1)"):
            lambda: -torch.log_softmax(shifted, dim=1).gather(-1, targets[..., None]).mean(),
        AXIS_BATCH: lambda: _nll_with(torch.log_softmax(logits, dim=0), ids),
        NO_LOG: lambda: _nll_with(torch.softmax(logits, dim=-1), ids),
        NO_LOG_SOFTMAX: lambda: _nll_with(logits, ids),
        NO_MINUS: lambda: -_ce(shifted, targets),
        _("{mistake} and summed instead of averaged").format(mistake=_(NO_SHIFT)):
            lambda: _ce(logits, ids, "sum"),
    }


def _loss_case(c: Check, logits: torch.Tensor, ids: torch.Tensor, label: str) -> torch.Tensor:
    before = (logits.clone(), ids.clone())
    got = c.call(logits, ids)
    if isinstance(got, (float, int)):
        c.fail(_("returned a Python {kind} ({case}); expected a 0-dim tensor.").format(
            kind=type(got).__name__, case=label),
               _("return the tensor itself, without .item(): training calls loss.backward() on "
                 "it"))
    if not torch.equal(logits, before[0]) or not torch.equal(ids, before[1]):
        c.fail(_("changed its inputs in place ({case}).").format(case=label),
               _("slice and compute into new tensors; leave logits and token_ids alone"))
    want = ref_model.next_token_loss(logits, ids)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and want.isfinite().all() and \
            not bool(got.detach().isfinite().all()):
        c.fail(_("the loss is {got} for {case}; the correct loss is finite ({want}).").format(
            got=float(got), case=label, want=f"{float(want):.6g}"), UNSTABLE)
    _quiet_expect(c, got, want, what=_("the loss ({case})").format(case=label),
                  wrong=_loss_mixups(logits, ids))
    return got


def check_next_token_loss(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("next_token_loss", f, seed=seed) as c:
        _no_reference(c, "next_token_loss")
        local = _local(f)
        for _n in range(3 if thorough else 2):
            b, s, v = c.sizes(3, 2, 12)
            v += 10
            logits = c.randn(b, s + 1, v, scale=2.0)
            ids = c.randint(0, v, (b, s + 1))
            _loss_case(c, logits, ids, f"logits [B={b}, S={s + 1}, V={v}]")
        c.headline(_("mean cross-entropy of logits[:, t] against token_ids[:, t + 1]"))
        # Uniform logits: every prediction has probability 1/|V|, so the loss is ln |V|.
        b, s, v = c.sizes(3, 3, 12)
        got = _loss_case(c, torch.zeros(b, s, v), c.randint(0, v, (b, s)),
                         _("all-zero logits {shape}").format(shape=f"[B={b}, S={s}, V={v}]"))
        c.note(_("uniform logits give ln |V|"))
        # One prediction per sequence (S = 2), a single sequence, float64.
        b, v = c.sizes(2, 3, 12)
        _loss_case(c, c.randn(b, 2, v + 7), c.randint(0, v + 7, (b, 2)),
                   _("S=2 (one prediction per sequence), logits {shape}").format(
                       shape=f"[B={b}, S=2, V={v + 7}]"))
        s, v = c.sizes(2, 4, 12)
        _loss_case(c, c.randn(1, s, v, dtype=torch.float64, scale=2.0),
                   c.randint(0, v, (1, s)),
                   _("float64 logits {shape}").format(shape=f"[B=1, S={s}, V={v}]"))
        c.note("S=2, B=1, float64")
        # Large logits: a naive exp overflows and log(softmax) underflows; the loss stays finite.
        b, s, v = c.sizes(3, 3, 12)
        big = 1000.0 + c.randn(b, s, v, scale=30.0)
        _loss_case(c, big, c.randint(0, v, (b, s)),
                   _("large logits (~1000 ± 30) {shape}").format(shape=f"[B={b}, S={s}, V={v}]"))
        c.note(_("stable for large logits"))
        if local:   # the gradient, which training follows, when the function runs here
            b, s, v = c.sizes(3, 3, 12)
            logits = c.randn(b, s, v, scale=2.0)
            ids = c.randint(0, v, (b, s))
            leaf = logits.clone().requires_grad_(True)
            got = c.call(leaf, ids)
            if not isinstance(got, torch.Tensor):
                c.fail(_("the loss should be a torch.Tensor, got {kind}.").format(
                    kind=type(got).__name__),
                       NOT_DIFFERENTIABLE)
            if not got.requires_grad:
                c.fail(_("no gradient flows back to the logits from the loss."),
                       NOT_DIFFERENTIABLE)
            (grad,) = torch.autograd.grad(got.sum(), leaf, allow_unused=True)
            if grad is None:
                c.fail(_("no gradient flows back to the logits from the loss."),
                       NOT_DIFFERENTIABLE)
            ref_leaf = logits.clone().requires_grad_(True)
            (want,) = torch.autograd.grad(ref_model.next_token_loss(ref_leaf, ids), ref_leaf)
            _quiet_expect(c, grad, want, what=_("the gradient with respect to the logits"),
                          dims=LOGITS)
            c.note(_("gradient flows to the logits"))


# ============================================================================================
# Exercise 4: model_param_count

UNTIED = N_("counted only one [|V|, H] matrix: LLaMA-2's LM head [H, |V|] is a separate matrix "
            "from the embedding table [|V|, H] (the two are not tied), so both count")
HEAD_AS_WO = N_("counted the LM head as an H x H matrix, the shape of the attention output "
                "projection W_O: W_O maps the merged heads back to H inside every block, while the "
                "LM head maps H features to |V| scores once, at the top: [H, |V|]")
HEAD_AS_BLOCK_WO = N_("counted the LM head as [N_h * D_h, H], W_O's shape: the LM head maps H "
                      "features to |V| scores: [H, |V|]")
NO_FINAL_NORM_COUNT = N_("left out the final RMSNorm's scale: H more parameters")
FINAL_NORM_PER_BLOCK = N_("counted a final norm in every block: there is one final norm, after the "
                          "last block (each block's own two norms are in block_param_count)")
L_MINUS_ONE = N_("counted L - 1 blocks: the model has cfg.n_layers blocks")
L_PLUS_ONE = N_("counted L + 1 blocks: the model has cfg.n_layers blocks")
ONE_BLOCK = N_("counted one block: multiply the block count by cfg.n_layers")
MHA_BLOCKS = N_("counted the attention as 4 H x H matrices: with GQA, W_K and W_V have N_kv * D_h "
                "columns (chapter 11's block_param_count)")
HEAD_BIAS = N_("added a bias of |V| to the LM head: the course's linear layers have no biases")
NO_BLOCK_NORMS = N_("left out the blocks' norm scales: each block has two RMSNorms of H "
                    "(chapter 11's block_param_count)")
AS_FLOAT = N_("returned a float; a parameter count is an exact int (avoid `/`)")


def _count_mixups(cfg: ModelConfig, want: int) -> dict:
    h, v, n_l = cfg.hidden_size, cfg.vocab_size, cfg.n_layers
    block = ref_block.block_param_count(cfg)
    mha_block = 4 * h * h + 3 * h * cfg.ffn_hidden_size + 2 * h
    wrong = {
        AS_FLOAT: float(want),
        UNTIED: want - v * h,
        HEAD_AS_WO: want - h * v + h * h,
        HEAD_AS_BLOCK_WO: want - h * v + cfg.n_heads * cfg.head_dim * h,
        NO_FINAL_NORM_COUNT: want - h,
        FINAL_NORM_PER_BLOCK: want + (n_l - 1) * h,
        L_MINUS_ONE: want - block,
        L_PLUS_ONE: want + block,
        ONE_BLOCK: want - (n_l - 1) * block,
        HEAD_BIAS: want + v,
        NO_BLOCK_NORMS: want - 2 * h * n_l,
        _("{mistake}; and left out the final RMSNorm's scale: H more parameters").format(
            mistake=_(UNTIED)):
            want - v * h - h,
    }
    if cfg.n_kv_heads != cfg.n_heads or cfg.n_heads * cfg.head_dim != h:
        wrong[MHA_BLOCKS] = want + n_l * (mha_block - block)
    return wrong


def _count_cfg(c: Check, kind: str) -> ModelConfig:
    n_kv = 1 if kind == "mqa" else c.randint(2, 5)
    g = 1 if kind == "mha" else c.randint(2, 5)
    n_h, d = n_kv * g, c.choice([16, 32, 64])
    h = n_h * d if kind == "mha" else n_h * d + c.choice([-16, 32, 64])
    return ModelConfig(vocab_size=c.randint(1000, 50000), hidden_size=h, n_heads=n_h,
                       n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=c.randint(3 * h, 4 * h),
                       n_layers=c.randint(3, 40), max_seq_len=2048)


def check_model_param_count(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("model_param_count", f, seed=seed) as c:
        _no_reference(c, "model_param_count")
        gqa_7b = ModelConfig(n_kv_heads=8)
        cases = [(LLAMA2_7B, "LLaMA-2-7B"), (gqa_7b, _("LLaMA-2-7B shapes with GQA, N_kv = 8"))]
        for _n in range(4 if thorough else 2):
            cfg = _count_cfg(c, c.choice(["gqa", "mqa"]))
            cases.append((cfg, _cfg_text(cfg)))
        cfg = _count_cfg(c, "mha")
        cases.append((cfg, _cfg_text(cfg)))
        for cfg, label in cases:
            want = ref_model.model_param_count(cfg)
            c.expect_equal(c.call(cfg), want, what=f"model_param_count ({label})",
                           wrong=_count_mixups(cfg, want))
            c.properties.remove(f"model_param_count ({label})")
        c.headline(_("the article's 6,738,415,616 for LLaMA-2-7B"))
        c.note(_("untied LM head [H, |V|]; GQA, MQA, D_h != H / N_h"))


# ============================================================================================
# Exercise 5: sample_next_token

#: Samples drawn from each distribution that is compared with its expected probabilities.
N_SAMPLES = 40_000
#: The most distributions one run compares (thorough included), for the union bound.
MAX_COMPARISONS = 16
#: The most tokens in one compared distribution.
MAX_VOCAB = 9
#: A correct sampler fails one check run with probability at most this.
FAILURE_PROBABILITY = 1e-10


def frequency_tolerance(n: int = N_SAMPLES) -> float:
    """Largest allowed |frequency - probability| for any token.

    Hoeffding: P(|count / n - p| >= t) <= 2 exp(-2 n t^2) for one token; a union bound over the
    MAX_VOCAB tokens of MAX_COMPARISONS distributions puts the chance that a correct sampler
    exceeds t anywhere in a run at FAILURE_PROBABILITY or less.
    """
    events = MAX_VOCAB * MAX_COMPARISONS
    return math.sqrt(math.log(2 * events / FAILURE_PROBABILITY) / (2 * n))


TOL = frequency_tolerance()

GREEDY_ERROR = N_("temperature 0 means greedy decoding: return logits.argmax(-1) without sampling "
                  "(dividing by 0 gives inf and NaN probabilities)")
GREEDY_ARGMIN = N_("took the argmin: greedy decoding picks the LARGEST logit, argmax")
GREEDY_AXIS = N_("took the argmax over the batch axis (dim=0): each row is one sequence's logits "
                 "over the vocabulary, so take argmax(dim=-1)")
NAN_PROBS = N_("the probabilities hold NaN, inf or negative numbers: take the softmax over the "
               "vocabulary axis (dim=-1) of logits / T, after setting the dropped logits to -inf "
               "(a softmax over another axis gives NaN where a whole column is -inf)")
KEEPDIM = N_("returned [B, 1]: return one token id per row, shape [B] (squeeze the last axis, e.g. "
             "torch.multinomial(...).squeeze(-1) or argmax(dim=-1) without keepdim)")
TEMP_IGNORED = N_("ignored the temperature: divide the logits by T before the softmax")
TEMP_MULTIPLIED = N_("multiplied the logits by T: temperature DIVIDES them, softmax(logits / T), "
                     "so T < 1 sharpens and T > 1 flattens the distribution")
TOPK_IGNORED = N_("ignored top_k: keep only the k largest logits (set the others to -inf)")
TOPK_SMALLEST = N_("kept the k SMALLEST logits: top-k keeps the k largest (torch.topk's default)")
TOPK_PLUS_ONE = N_("kept k + 1 tokens: top_k keeps exactly the k largest logits")
TOPK_MINUS_ONE = N_("kept k - 1 tokens: top_k keeps exactly the k largest logits")
TOPK_ZERO_FILL = N_("set the dropped logits to 0 instead of -inf: exp(0) = 1 still gives them "
                    "weight; fill with float('-inf') so that their probability is exactly 0")
UNIFORM = N_("sampled uniformly over the vocabulary: draw in proportion to softmax(logits / T) "
             "(torch.multinomial(probs, 1)); a softmax over the batch axis (dim=0) also looks like "
             "this when the rows are alike")
UNIFORM_TOPK = N_("sampled uniformly among the k kept tokens: weight them by softmax(logits / T)")
SAME_ROW = N_("every row of the batch got the same token: each row is its own sequence and needs "
              "its own draw (torch.multinomial(probs, 1) draws one per row)")
GENERATOR_IGNORED = N_("draw the random numbers from the `generator` argument: "
                       "torch.multinomial(probs, 1, generator=generator) (torch.distributions' "
                       ".sample() cannot take a generator)")
FIXED_SEED = N_("the samples must come from the `generator` argument; a fixed seed (or a new "
                "torch.Generator()) inside the function makes them the same every time")
OUT_OF_TOP_K = N_("top-k must drop every token outside the k largest logits: set their logits to "
                  "-inf before the softmax (e.g. below torch.topk(logits, k).values[..., -1:])")


def _spread_logits(c: Check, v: int) -> torch.Tensor:
    """One row of well-separated logits in random order: distinct, spread from about -2 to 2.5, so
    that every mistake changes some token's probability by a lot and top-k has no ties."""
    values = torch.linspace(-2.0, 2.5, v, dtype=torch.float64)
    values = values + (torch.rand(v, generator=c.gen, dtype=torch.float64) - 0.5) * 0.2
    return values[torch.randperm(v, generator=c.gen)].to(torch.float32)


def _probs(row: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    return ref_model.next_token_probs(row[None], temperature=temperature, top_k=top_k)[0]


def _keep(row: torch.Tensor, k: int, largest: bool = True) -> torch.Tensor:
    keep = torch.zeros(row.shape, dtype=torch.bool)
    keep[torch.topk(row, k, largest=largest).indices] = True
    return keep


def _masked_softmax(scores: torch.Tensor, keep: torch.Tensor, fill: float = float("-inf")):
    return torch.softmax(scores.double().masked_fill(~keep, fill), dim=-1)


def _sampling_mixups(row: torch.Tensor, temperature: float, top_k: int | None) -> dict:
    """The distributions known mistakes would sample from."""
    v = row.shape[-1]
    k = v if top_k is None else min(top_k, v)
    keep = _keep(row, k)
    scaled = row.double() / temperature
    wrong = {}
    if temperature != 1:
        wrong[TEMP_IGNORED] = _masked_softmax(row, keep)
        wrong[TEMP_MULTIPLIED] = _masked_softmax(row.double() * temperature, keep)
    if k < v:
        wrong[TOPK_IGNORED] = torch.softmax(scaled, -1)
        wrong[TOPK_SMALLEST] = _masked_softmax(scaled, _keep(row, k, largest=False))
        wrong[TOPK_PLUS_ONE] = _masked_softmax(scaled, _keep(row, k + 1))
        if k > 1:
            wrong[TOPK_MINUS_ONE] = _masked_softmax(scaled, _keep(row, k - 1))
        wrong[TOPK_ZERO_FILL] = _masked_softmax(scaled, keep, fill=0.0)
        wrong[UNIFORM_TOPK] = keep.double() / k
    wrong[UNIFORM] = torch.full((v,), 1.0 / v, dtype=torch.float64)
    return wrong


def _sample(c: Check, logits: torch.Tensor, label: str, **kwargs) -> torch.Tensor:
    """Call the learner; check the output's type, shape, dtype and range."""
    before = logits.clone()
    try:
        got = c.call(logits, **kwargs)
    except LearnerError as err:
        first = err.message.splitlines()[0]
        if kwargs.get("temperature") == 0 and not ("TypeError" in first and "argument" in first):
            raise CheckFailure(c.exercise, err.shown_message, hint=GREEDY_ERROR,
                               seed=c.seed) from None
        if "probability tensor" in first:
            raise CheckFailure(c.exercise, err.shown_message, hint=NAN_PROBS,
                               seed=c.seed) from None
        raise
    if not torch.equal(logits, before):
        c.fail(_("changed the logits it was given in place ({case}).").format(case=label),
               _("`logits /= temperature` or `logits[...] = -inf` writes into the caller's "
                 "tensor; compute into a new tensor (`scores = logits / temperature`, "
                 "`masked_fill`)"))
    b, v = logits.shape
    if not isinstance(got, torch.Tensor) or type(got) not in (torch.Tensor, torch.nn.Parameter):
        c.fail(_("returned {kind} ({case}); expected a LongTensor [B] of token ids.").format(
            kind=type(got).__name__, case=label))
    if got.shape != (b,):
        hint = KEEPDIM if tuple(got.shape) == (b, 1) else (
            GREEDY_AXIS if tuple(got.shape) == (v,) else None)
        c.fail(_("returned shape {shape} ({case}); expected [B={b}], one token id per row.")
               .format(shape=list(got.shape), case=label, b=b), hint)
    if got.dtype != torch.int64:
        c.fail(_("returned dtype {dtype} ({case}); expected torch.int64 (token ids, as argmax "
                 "and multinomial return them).").format(dtype=got.dtype, case=label))
    if bool(((got < 0) | (got >= v)).any()):
        c.fail(_("returned token ids outside 0 .. |V|-1 = {last} ({case}).").format(
            last=v - 1, case=label))
    return got


def _expect_distribution(c: Check, samples: torch.Tensor, probs: torch.Tensor, wrong: dict,
                         label: str) -> None:
    """Empirical frequencies of `samples` against `probs` [V], within TOL for every token."""
    v = probs.shape[-1]
    n = samples.numel()
    tol = frequency_tolerance(n)
    if n > 1 and bool((samples == samples[0]).all()) and float(probs.max()) < 0.9:
        c.fail(_("all {count} rows of the same logits got the same token {token} ({case}).")
               .format(count=n, token=int(samples[0]), case=label), SAME_ROW)
    freq = torch.bincount(samples, minlength=v).double() / n
    dev = (freq - probs).abs()
    if float(dev.max()) > tol:
        hint = None
        for mistake, q in wrong.items():
            if float((freq - q).abs().max()) <= tol:
                hint = mistake
                break
        worst = int(dev.argmax())
        c.fail(_("sampled token {token} with frequency {freq} in {count} draws, but its "
                 "probability is {prob} ({case}; a correct sampler stays within ±{tol} of every "
                 "probability except with probability < {bound}).\n  expected: {expected}\n  "
                 "observed: {observed}").format(
            token=worst, freq=f"{float(freq[worst]):.3f}", count=n,
            prob=f"{float(probs[worst]):.3f}", case=label, tol=f"{tol:.3f}",
            bound=f"{FAILURE_PROBABILITY:g}", expected=[round(float(p), 3) for p in probs],
            observed=[round(float(p), 3) for p in freq]), hint)


def _case_label(v: int, temperature: float, top_k: int | None, defaults: bool = False) -> str:
    if defaults:
        return _("{count} tokens, defaults (temperature=1.0, top_k=None)").format(count=v)
    return _("{count} tokens, temperature={temperature}, top_k={top_k}").format(
        count=v, temperature=f"{temperature:g}", top_k=top_k)


def _statistical_case(c: Check, v: int, temperature: float, top_k: int | None, *,
                      defaults: bool = False) -> None:
    row = _spread_logits(c, v)
    logits = row.repeat(N_SAMPLES, 1)
    label = _case_label(v, temperature, top_k, defaults)
    gen = torch.Generator().manual_seed(c.randint(0, 2**31 - 1))
    kwargs = {"generator": gen} if defaults else {"temperature": temperature, "top_k": top_k,
                                                  "generator": gen}
    got = _sample(c, logits, label, **kwargs)
    if top_k is not None and top_k < v:
        allowed = _keep(row, top_k)
        outside = got[~allowed[got]]
        if outside.numel():
            freq = torch.bincount(got, minlength=v).double() / got.numel()
            tol = frequency_tolerance(got.numel())
            hint = next((mistake for mistake, q in _sampling_mixups(row, temperature, top_k).items()
                         if float((freq - q).abs().max()) <= tol), OUT_OF_TOP_K)
            c.fail(_("returned token {token}, which is not among the top_k={top_k} largest "
                     "logits ({case}).").format(token=int(outside[0]), top_k=top_k, case=label),
                   hint)
    _expect_distribution(c, got, _probs(row, temperature, top_k),
                         _sampling_mixups(row, temperature, top_k), label)


def check_sample_next_token(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("sample_next_token", f, seed=seed) as c:
        _no_reference(c, "sample_next_token")
        local = _local(f)
        # ---- greedy: temperature 0 is argmax, exactly, with or without a generator
        b, v = c.sizes(2, 3, 12)
        v += 10
        logits = c.randn(b, v, scale=3.0)
        want = logits.argmax(-1)
        greedy_wrong = {GREEDY_ARGMIN: logits.argmin(-1), GREEDY_AXIS: logits.argmax(0),
                        KEEPDIM: want[:, None]}
        for kwargs in ({"temperature": 0.0}, {"temperature": 0, "generator": torch.Generator()},
                       {"temperature": 0.0, "top_k": 3}):
            label = f"logits [B={b}, V={v}], " + ", ".join(f"{k}={val}" for k, val in
                                                          kwargs.items() if k != "generator")
            got = _sample(c, logits, label, **kwargs)
            _quiet_expect(c, got, want, what=_("greedy tokens ({case})").format(case=label),
                          dims=("B",),
                          wrong=greedy_wrong)
        huge = c.randn(b, v, scale=1e4)
        _quiet_expect(c, _sample(c, huge, "logits ~ 1e4", temperature=0.0), huge.argmax(-1),
                      what=_("greedy tokens for logits ~ 1e4"), dims=("B",))
        c.headline(_("temperature 0 is greedy: argmax of each row"))
        # ---- the distributions: defaults, sharper, flatter, top-k
        vs = [c.randint(6, MAX_VOCAB + 1) for _n in range(4)]
        _statistical_case(c, vs[0], 1.0, None, defaults=True)
        _statistical_case(c, vs[1], 0.5, None)
        _statistical_case(c, vs[2], 2.0, c.randint(2, vs[2] - 2))
        _statistical_case(c, vs[3], 1.0, c.randint(2, vs[3] - 2))
        if thorough:
            for temperature in (0.7, 1.6):
                v = c.randint(6, MAX_VOCAB + 1)
                _statistical_case(c, v, temperature, c.choice([None, c.randint(2, v - 1)]))
            v = c.randint(6, MAX_VOCAB + 1)
            _statistical_case(c, v, 1.3, v)          # top_k = |V| keeps everything
        c.headline(_("frequencies match softmax(logits / T) over the top k ({count} draws each, "
                     "within ±{tol})").format(count=N_SAMPLES, tol=f"{TOL:.3f}"))
        c.note(_("T < 1 sharpens, T > 1 flattens"))
        c.note(_("top-k never returns a token outside the top k"))
        # top_k = 1 leaves one candidate: the argmax, at any temperature
        for temperature in (1.0, 2.5):
            got = _sample(c, logits, f"top_k=1, temperature={temperature}", top_k=1,
                          temperature=temperature, generator=torch.Generator().manual_seed(0))
            if not torch.equal(got, want):
                c.fail(_("with top_k=1 (temperature={temperature}) returned {got}; the only "
                         "token top_k=1 keeps is the argmax, {want}.").format(
                    temperature=temperature, got=got.tolist(), want=want.tolist()),
                       TOPK_SMALLEST if torch.equal(got, logits.argmin(-1)) else
                       _("keep the k largest logits and set every other logit to -inf before the "
                         "softmax"))
        c.note(_("top_k=1 is greedy"))
        # ---- a batch of different rows: each row samples from its own distribution
        v = c.randint(6, MAX_VOCAB + 1)
        rows = torch.stack([_spread_logits(c, v) for _n in range(3)])
        n_each = N_SAMPLES
        logits = rows.repeat(n_each, 1)                        # rows 0, 1, 2, 0, 1, 2, ...
        temperature, top_k = 1.4, v - 2
        label = _("a batch that cycles through 3 different rows, {count} tokens, "
                  "temperature=1.4, top_k={top_k}").format(count=v, top_k=top_k)
        got = _sample(c, logits, label, temperature=temperature, top_k=top_k,
                      generator=torch.Generator().manual_seed(c.randint(0, 2**31 - 1)))
        for i in range(2 if not thorough else 3):
            _expect_distribution(c, got[i::3], _probs(rows[i], temperature, top_k),
                                 _sampling_mixups(rows[i], temperature, top_k),
                                 _("{case}: row pattern {i}").format(case=label, i=i))
        c.note(_("each row of a batch draws from its own logits, independently"))
        # ---- reproducible with a generator
        v = c.randint(6, MAX_VOCAB + 1)
        logits = _spread_logits(c, v).repeat(2000, 1)
        s = c.randint(0, 2**31 - 2)
        runs = [_sample(c, logits, _("generator seeded {seed}").format(seed=seed_),
                        temperature=1.0,
                        generator=torch.Generator().manual_seed(seed_)) for seed_ in (s, s, s + 1)]
        if not torch.equal(runs[0], runs[1]):
            c.fail(_("two generators seeded alike ({seeded}) gave different samples.").format(
                seeded=f"torch.Generator().manual_seed({s})"), GENERATOR_IGNORED)
        if torch.equal(runs[0], runs[2]):
            c.fail(_("generators with different seeds gave the same 2000 samples."), FIXED_SEED)
        c.note(_("same generator seed, same samples"))
        # ---- generator=None: torch's global generator
        first = _sample(c, logits, "generator=None", temperature=1.0)
        second = _sample(c, logits, "generator=None", temperature=1.0)
        if torch.equal(first, second):
            c.fail(_("with generator=None, two calls in a row gave the same 2000 samples."),
                   _("with generator=None draw from torch's global generator (torch.multinomial"
                     "(..., generator=None) does), which moves on after every draw"))
        if local:
            state = torch.get_rng_state()
            try:
                torch.manual_seed(s)
                first = _sample(c, logits, "generator=None", temperature=1.0)
                torch.manual_seed(s)
                second = _sample(c, logits, "generator=None", temperature=1.0)
            finally:
                torch.set_rng_state(state)
            if not torch.equal(first, second):
                c.fail(_("with generator=None, two calls after the same torch.manual_seed gave "
                         "different samples."),
                       _("with generator=None draw from torch's global generator"))
        c.note(_("generator=None uses torch's global generator"))
