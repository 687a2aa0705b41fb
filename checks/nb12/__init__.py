"""Checks for chapter 12: the whole model, its logits, the next-token loss, the parameter count and
sampling the next token.

Conventions (docs/conventions.md): params = {embed [|V|, H], layers: a list of L block dicts,
final_norm [H], lm_head [H, |V|]} with an untied LM head; model_forward(token_ids [B, S]) is
embedding -> L decoder blocks -> final RMSNorm -> LM head, logits [B, S, |V|], with positions
defaulting to arange(S); the loss at position t predicts token t + 1 and is averaged over all
B * (S - 1) predictions; sample_next_token(logits [B, |V|]) draws one token per row from
softmax(logits / T) restricted to the top_k largest logits (and any tied with the k-th), and is
greedy (argmax) at T = 0.

Sampling is checked statistically without ever flaking (checks.nb12.sampling says how), and by
exact properties: greedy equals argmax, top-k never returns a token outside the top k, the same
generator seed gives the same samples and different seeds different ones.

Known mistakes are recognised by computing them from the same inputs with the reference pieces
(checks.nb12.forward, checks.nb12.loss, checks.nb12.sampling declare them; the random
initialisation's rules are checks.nb11.init's, shared with chapter 11). Some properties cannot be
observed when the grader calls the function in another process (a gradient does not travel;
torch's global generator is the other process's; the positions a forward hands its blocks): those
are checked when the function runs here, which is always the case in the notebook and in the
grader's run inside the notebook.
"""

from __future__ import annotations

import torch

from .. import gradients
from ..nb11 import init
from . import forward as fwd
from . import loss
from . import sampling as smp
from ..config import LLAMA2_7B, ModelConfig
from ..engine import Check, is_remote, matches, values_close
from ..i18n import N_, _
from ..mistakes import Mistake
from ..nb11 import random_positions  # the same random positions as chapter 11
from .sampling import (FAILURE_PROBABILITY, MAX_COMPARISONS, MAX_VOCAB,
                            N_SAMPLES, TOL, frequency_tolerance)
from ..reference import block as ref_block
from ..reference import model as ref_model

TOP = ("embed", "layers", "final_norm", "lm_head")
BLOCK = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
BLOCK_NORMS = ("attn_norm", "ffn_norm")
BLOCK_MATRICES = ("wqkv", "wo", "w_gate", "w_up", "w_down")
LOGITS = ("B", "S", "V")

# --------------------------------------------------------------------------------------------
# The course's own answers are not answers: calling checks.reference's version of the exercise
# (however it was imported or renamed) is caught by its code object while the learner's function
# runs. The earlier chapters' pieces (decoder_block, init_block_params, rms_norm, ...) stay
# allowed: they are what this chapter assembles.

_REFERENCE_HINT = N_("this exercise asks you to write {name} yourself (from the earlier chapters' "
                     "pieces where it needs them), not to call the course's finished one")


def _no_reference(c: Check, *names: str) -> None:
    """Make `c.call` fail if the learner's function reaches checks.reference's `names`."""
    c.forbid_functions([getattr(ref_model, n) for n in names], _(_REFERENCE_HINT))


def _quiet_expect(c: Check, got, want, **kw) -> None:
    """expect_tensor without listing the case in the pass summary."""
    c.expect_tensor(got, want, **kw)
    if kw.get("what") in c.properties:
        c.properties.remove(kw["what"])


_cfg_text = fwd.cfg_text

# ============================================================================================
# Exercise 1: init_model_params

BUILD_BLOCK = Mistake("block_not_from_init_block_params", N_(
    "build each block with init_block_params (chapter 11)"))
_BUILD_BLOCK_NAMES = N_("build each block with init_block_params (chapter 11): {names}")
BLOCK_DTYPE = Mistake("dtype_not_passed_to_blocks", N_(
    "pass dtype=dtype on to every block (init_block_params(cfg, generator, dtype))"))
HEAD_V_BY_H = Mistake("lm_head_v_by_h", N_(
    "the LM head is applied as x @ W, so it is [H, |V|] (a [|V|, H] matrix is the embedding "
    "table's layout, or nn.Linear's [out, in])"))
HEAD_AS_WO = Mistake("lm_head_shaped_like_wo", N_(
    "the LM head maps the H features of a token to |V| scores, [H, |V|]; a matrix into H features "
    "is the shape of the attention output projection W_O"))
EMBED_TRANSPOSED = Mistake("embedding_transposed", N_(
    "the embedding table has one row per token: [|V|, H]"))
NORM_NOT_VECTOR = Mistake("norm_not_a_vector", N_(
    "a norm's scale is one number per hidden feature: shape [H]"))
OTHER_NAMES = Mistake("other_names", N_("use the names of the parameter layout exactly"))
NO_LM_HEAD = Mistake("no_lm_head", N_(
    "LLaMA-2's LM head is a matrix of its own (not tied to the embedding): params['lm_head'], "
    "[H, |V|]"))
LAYERS_NAME = Mistake("layers_named_otherwise", N_("the list of blocks is called 'layers'"))
FINAL_NORM_NAME = Mistake("final_norm_named_otherwise", N_(
    "the norm after the last block is called 'final_norm'"))
DTYPE_IGNORED = Mistake("dtype_ignored", N_(
    "create every tensor with dtype=dtype (the final norm too)"))
LAYERS_NOT_LIST = Mistake("layers_not_a_list", "params['layers'] = [init_block_params(cfg, "
                          "generator, dtype) for _ in range(cfg.n_layers)]")
LAYER_COUNT = Mistake("wrong_number_of_blocks", N_("one block per layer: range(cfg.n_layers)"))
FINAL_NORM_NOT_ONE = Mistake("norm_not_one", N_(
    "a norm's scale starts at one (torch.ones), like the blocks' norms"))
TIED = Mistake("tied_lm_head", N_(
    "that is a tied LM head (GPT-2 does it); LLaMA-2's LM head is a matrix of its own: draw it "
    "separately, [H, |V|]"))
SAME_BLOCKS = Mistake("blocks_share_weights", N_(
    "every block needs its own weights: call init_block_params once per block "
    "(`[init_block_params(...)] * L` repeats ONE dict L times, and a fixed seed per block makes "
    "every block draw the same numbers)"))
BLOCK_GENERATOR = Mistake("generator_not_passed_to_blocks", N_(
    "pass generator=generator on to init_block_params as well"))


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


def _top_shape_hint(name: str, got: tuple, want: tuple, cfg: ModelConfig) -> Mistake | None:
    h, v = cfg.hidden_size, cfg.vocab_size
    if name == "lm_head":
        if got == (v, h):
            return HEAD_V_BY_H
        if got == (h, h) or got == (cfg.n_heads * cfg.head_dim, h):
            return HEAD_AS_WO
    if name == "embed" and got == (h, v):
        return EMBED_TRANSPOSED
    if name == "final_norm" and len(got) != 1:
        return NORM_NOT_VECTOR
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
               BUILD_BLOCK.with_text(_(_BUILD_BLOCK_NAMES).format(names=", ".join(BLOCK))))
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
                name=f"{where}['{name}']", got=t.dtype, want=dtype, case=label), BLOCK_DTYPE)


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
        hint = OTHER_NAMES
        if "lm_head" in missing and not ({"output", "head", "unembed", "w_out"} & keys):
            hint = NO_LM_HEAD
        elif "layers" in missing and ({"blocks", "block", "h", "layer"} & keys):
            hint = LAYERS_NAME
        elif "final_norm" in missing and ({"norm", "ln_f", "norm_f"} & keys):
            hint = FINAL_NORM_NAME
        c.fail(_("the dict's keys are not the layout's ({problems}); expected exactly {names}.")
               .format(problems=_key_problems(missing, extra), names=", ".join(TOP)), hint)
    for name, shape in ref_model.model_shapes(cfg).items():
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
                name=f"params['{name}']", got=t.dtype, want=dtype, case=label), DTYPE_IGNORED)
    layers = got["layers"]
    if not isinstance(layers, list):
        c.fail(_("params['layers'] is {kind}; expected a list with one dict per block.").format(
            kind=type(layers).__name__), LAYERS_NOT_LIST)
    if len(layers) != cfg.n_layers:
        c.fail(_("params['layers'] holds {count} blocks, expected {want} (cfg.n_layers; {case}).")
               .format(count=len(layers), want=cfg.n_layers, case=label), LAYER_COUNT)
    for i, layer in enumerate(layers):
        _expect_block_layout(c, layer, cfg, dtype, f"params['layers'][{i}]", label)


def _expect_model_values(c: Check, got: dict, label: str) -> None:
    init.expect_ones(c, got["final_norm"], "params['final_norm']", label, FINAL_NORM_NOT_ONE)
    init.expect_random_matrix(c, got["embed"], "params['embed']", label)
    init.expect_random_matrix(c, got["lm_head"], "params['lm_head']", label)
    if torch.equal(got["lm_head"], got["embed"].T):
        c.fail(_("params['lm_head'] is the embedding table transposed ({case}).").format(
            case=label), TIED)
    layers = got["layers"]
    for i, layer in enumerate(layers):
        for name in BLOCK_NORMS:
            init.expect_ones(c, layer[name], f"params['layers'][{i}]['{name}']", label,
                             BUILD_BLOCK)
        for name in BLOCK_MATRICES:
            init.expect_random_matrix(c, layer[name], f"params['layers'][{i}]['{name}']", label)
        for j in range(i):
            same = [n for n in BLOCK_MATRICES if torch.equal(layer[n], layers[j][n])]
            if same:
                c.fail(_("blocks {j} and {i} hold the same {names} ({case}).").format(
                    j=j, i=i, names=", ".join(same), case=label), SAME_BLOCKS)
    init.expect_own_tensors(c, _all_tensors(got), label)


def _all_tensors(p: dict) -> list[tuple[str, torch.Tensor]]:
    out = [(f"params['{n}']", p[n]) for n in ("embed", "final_norm", "lm_head")]
    for i, layer in enumerate(p["layers"]):
        out += [(f"params['layers'][{i}]['{n}']", layer[n]) for n in BLOCK]
    return out


def _random_tensors(p: dict) -> list[tuple[str, torch.Tensor]]:
    return [(w, t) for w, t in _all_tensors(p) if "norm" not in w]


def _blocks_only(names: list[str]) -> Mistake | None:
    return BLOCK_GENERATOR if all(w.startswith("params['layers']") for w in names) else None


def check_init_model_params(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("init_model_params", f, seed=seed) as c:
        _no_reference(c, "init_model_params")
        rules = {"values": lambda p, label: _expect_model_values(c, p, label),
                 "tensors": _all_tensors, "randoms": _random_tensors, "local": not is_remote(f)}
        for cfg in _init_cfgs(c) + ([_init_cfgs(c)[0]] if thorough else []):
            init.expect_generator_use(
                c, cfg, _cfg_text(cfg), blame=_blocks_only, layout=lambda p, label, cfg=cfg:
                _expect_model_layout(c, p, cfg, torch.float32, label), **rules)
        c.headline(_("reproducible from a seeded generator"))
        c.headline(_("the layout: embed [|V|, H], L blocks, final_norm [H], lm_head [H, |V|]"))
        c.headline(_("norms at one; matrices N(0, 0.02^2); every block its own; LM head untied"))
        cfg = _init_cfgs(c)[1]
        for dtype in ((torch.float64, torch.bfloat16, torch.float16) if thorough
                      else (torch.float64, torch.bfloat16)):
            label = f"{_cfg_text(cfg)}, dtype={str(dtype).removeprefix('torch.')}"
            got = c.call(cfg, generator=torch.Generator().manual_seed(c.randint(0, 1000)),
                         dtype=dtype)
            _expect_model_layout(c, got, cfg, dtype, label)
            _expect_model_values(c, got, label)
        c.headline(_("float64 and bfloat16"))
        init.expect_global_generator(
            c, cfg, _cfg_text(cfg) + ", generator=None",
            layout=lambda p, label: _expect_model_layout(c, p, cfg, torch.float32, label),
            **rules)
        c.headline(_("generator=None uses torch's global generator"))


# ============================================================================================
# Exercise 2: model_forward (its mistakes and helpers: checks.nb12.forward)

_POSITIONS_GIVEN = N_("with positions {how}, the blocks were given positions {got} ({case}); "
                      "expected torch.arange(S) = {want}.")


def _forward_case(c: Check, cfg: ModelConfig, b: int, s: int, mode: str,
                  default_seen: list[bool]) -> None:
    """mode: 'omitted' (no positions argument), 'none' (positions=None), 'S' or 'BS'.
    `default_seen` gets whether the positions a default case handed its blocks were seen."""
    params = fwd.random_params(c, cfg)
    ids = c.randint(0, cfg.vocab_size, (b, s))
    positions = None if mode in ("omitted", "none") else random_positions(
        c, b, s, batched=mode == "BS")
    how = _("positions not passed") if mode == "omitted" else "positions=None"
    label = fwd.case_label(cfg, b, s, positions, how)
    c.errors = (fwd.POSITIONS_REQUIRED, fwd.EMBED_OVERWRITTEN, fwd.head_transposed(cfg))
    with fwd.watching_positions() as seen:
        if mode == "omitted":
            got = c.call(ids, params, cfg)
        elif mode == "none":
            got = c.call(ids, params, cfg, positions=None)
        else:
            got = c.call(ids, params, cfg, positions)
    with torch.no_grad():
        want = ref_model.model_forward(ids, params, cfg, positions)
    _quiet_expect(c, got, want, what=f"logits ({label})", dims=LOGITS,
                  wrong=fwd.forward_mixups(ids, params, cfg, positions), atol=1e-4, rtol=1e-3)
    if positions is None:
        default_seen.append(bool(seen))
        wrong = fwd.wrong_default(seen, s)
        if wrong is not None:
            c.fail(_(_POSITIONS_GIVEN).format(
                how=_("not passed") if mode == "omitted" else "None", got=wrong.tolist(),
                case=label, want=list(range(s))), fwd.DEFAULT_POSITIONS)


def check_model_forward(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("model_forward", f, seed=seed, in_place=fwd.IN_PLACE) as c:
        _no_reference(c, "model_forward")
        b, s = c.sizes(2, 2, 8)
        s += 2
        seen: list[bool] = []
        _forward_case(c, fwd.model_cfg(c, "gqa"), b, s, "omitted", seen)
        c.headline(_("embed -> L blocks -> final RMSNorm -> LM head, logits [B, S, |V|]"))
        _forward_case(c, fwd.model_cfg(c, "gqa", decoupled=True, partial=True,
                                       base=c.choice([500.0, 1e6]), eps=c.choice([0.05, 0.2])),
                      b, s, "BS", seen)
        _forward_case(c, fwd.model_cfg(c, "mha"), b, s, "S", seen)
        _forward_case(c, fwd.model_cfg(c, "mqa", base=500.0, layers=2), b, s, "none", seen)
        if thorough:
            for _n in range(3):
                b, s = c.sizes(2, 2, 8)
                _forward_case(c, fwd.model_cfg(c, c.choice(["gqa", "mha", "mqa"]),
                                               decoupled=c.choice([False, True]),
                                               partial=c.choice([False, True]),
                                               eps=c.choice([1e-5, 0.1])),
                              b, s + 1, c.choice(["omitted", "S", "BS"]), seen)
            _forward_case(c, fwd.model_cfg(c, "gqa"), 3, 1, "omitted", seen)   # one token
        # The line claims the default only where the positions handed to the blocks were seen.
        c.headline(_("positions: default arange(S), [S] and [B, S] with gaps") if all(seen) else
                   _("positions: omitted and None accepted, [S] and [B, S] with gaps"))
        c.note(_("GQA, MHA, MQA; rope_base, rotary_dim and norm_eps from cfg"))
        # Causality, on the learner's own function: a new last token changes no earlier logits.
        cfg = fwd.model_cfg(c, "gqa", layers=2)
        b, s = 2, c.randint(4, 8)
        params = fwd.random_params(c, cfg)
        ids = c.randint(0, cfg.vocab_size, (b, s))
        changed = ids.clone()
        changed[:, -1] = (ids[:, -1] + 1 + c.randint(0, cfg.vocab_size - 1)) % cfg.vocab_size
        out, out2 = c.call(ids, params, cfg), c.call(changed, params, cfg)
        if isinstance(out, torch.Tensor) and isinstance(out2, torch.Tensor) and \
                out.shape == out2.shape == (b, s, cfg.vocab_size):
            if not values_close(out[:, :-1], out2[:, :-1], 1e-5, 1e-4):
                c.fail(_("changing only the LAST token changed the logits of earlier "
                         "positions."), fwd.NOT_CAUSAL)
            if values_close(out[:, -1], out2[:, -1], 1e-6, 1e-6):
                c.fail(_("changing the last token did not change the last position's logits."),
                       fwd.LAST_TOKEN_UNUSED)
        c.note(_("causal: a later token never changes earlier logits"))
        if not is_remote(f):   # gradients, which training follows, when the function runs here
            _trainable_case(c, cfg, params, ids)


def _trainable_case(c: Check, cfg: ModelConfig, params: dict, ids: torch.Tensor) -> None:
    """The forward of parameters that require gradients (as in training) must give every one of
    them a finite, non-zero gradient, through every function of the learner's under it: no
    torch.no_grad, no detached step, nothing changed in place that autograd needs. A failure
    names the function at fault and its chapter (chapter 11's block, chapter 08's RoPE, ...)."""
    leaves = fwd.trainable_params(params)
    c.errors = (fwd.IN_PLACE_LEAF, fwd.GRAPH_CUT, fwd.POSITIONS_REQUIRED, fwd.EMBED_OVERWRITTEN)
    c.call(ids, leaves, cfg)          # the learner's own errors, named as in every other case
    leaves = fwd.trainable_params(params)
    cut = gradients.trace(c.fn, (ids, leaves, cfg), fwd.named_tensors(leaves))
    if cut is not None:
        c.fail(_("gradients cannot train this forward (parameters with requires_grad=True, as "
                 "in training): {detail}.").format(detail=cut.detail()),
               fwd.trainability_mistake(cut))
    c.note(_("gradients reach every parameter"))


# ============================================================================================
# Exercise 3: next_token_loss (its mistakes: checks.nb12.loss)


def _loss_case(c: Check, logits: torch.Tensor, ids: torch.Tensor, label: str,
               not_finite: Mistake = loss.UNSTABLE) -> torch.Tensor:
    """`not_finite`: the mistake of a loss that is inf or NaN where the correct one is finite."""
    got = c.call(logits, ids)
    if isinstance(got, (float, int)):
        c.fail(_("returned a Python {kind} ({case}); expected a 0-dim tensor.").format(
            kind=type(got).__name__, case=label), loss.RETURNED_NUMBER)
    want = ref_model.next_token_loss(logits, ids)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and want.isfinite().all() and \
            not bool(got.detach().isfinite().all()):
        c.fail(_("the loss is {got} for {case}; the correct loss is finite ({want}).").format(
            got=float(got), case=label, want=f"{float(want):.6g}"), not_finite)
    _quiet_expect(c, got, want, what=_("the loss ({case})").format(case=label),
                  wrong=_telling_mixups(c, got, want, logits, ids))
    return got


def _telling_mixups(c: Check, got, want: torch.Tensor, logits: torch.Tensor,
                    ids: torch.Tensor) -> dict:
    """The known-wrong losses for these inputs; when the learner's loss is wrong and several of
    them reproduce it (one number may match two mistakes by chance), only those that also
    reproduce the learner's loss of fresh inputs of the same shapes."""
    mixups = loss.loss_mixups(logits, ids)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or \
            matches(got, want, 0.0, 0.0):
        return mixups
    hits = [m for m, variant in mixups.items() if matches(got, variant(), 0.0, 0.0)]
    if len(hits) > 1:
        fresh = c.randn(*logits.shape, dtype=logits.dtype, scale=2.0)
        fresh_ids = c.randint(0, logits.shape[-1], tuple(ids.shape))
        again, others = c.call(fresh, fresh_ids), loss.loss_mixups(fresh, fresh_ids)
        hits = [m for m in hits if matches(again, others[m](), 0.0, 0.0)] or hits
    return {m: mixups[m] for m in hits}


def check_next_token_loss(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("next_token_loss", f, seed=seed, errors=[loss.NOT_FLATTENED],
               in_place=loss.IN_PLACE) as c:
        _no_reference(c, "next_token_loss")
        for _n in range(3 if thorough else 2):
            b, s, v = c.sizes(3, 2, 12)
            v += 10
            logits = c.randn(b, s + 1, v, scale=2.0)
            ids = c.randint(0, v, (b, s + 1))
            _loss_case(c, logits, ids, f"logits [B={b}, S={s + 1}, V={v}]")
        c.headline(_("mean cross-entropy of logits[:, t] against token_ids[:, t + 1]"))
        # Uniform logits: every prediction has probability 1/|V|, so the loss is ln |V|.
        b, s, v = c.sizes(3, 3, 12)
        _loss_case(c, torch.zeros(b, s, v), c.randint(0, v, (b, s)),
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
        # Large logits: a naive exp overflows; the loss stays finite. (Within 60 of each other:
        # a softmax does not underflow yet, so that log(softmax) is told by the next case.)
        b, s, v = c.sizes(3, 3, 12)
        big = 1000.0 + c.randn(b, s, v, scale=30.0).clamp(-30.0, 30.0)
        _loss_case(c, big, c.randint(0, v, (b, s)),
                   _("large logits (~1000 ± 30) {shape}").format(shape=f"[B={b}, S={s}, V={v}]"))
        # A large gap: every target's logit 150 below its row's largest, so that its softmax
        # underflows to 0 in float32 (log(softmax) gives -inf; log_softmax gives -150).
        b, s, v = c.sizes(3, 3, 12)
        ids = c.randint(0, v, (b, s))
        gap = c.randn(b, s, v)
        gap.scatter_(-1, ids.roll(-1, dims=1)[..., None], -150.0)
        _loss_case(c, gap, ids, _("targets 150 below the largest logit {shape}").format(
            shape=f"[B={b}, S={s}, V={v}]"), not_finite=loss.LOG_OF_SOFTMAX)
        c.headline(_("stable for large logits"))
        if not is_remote(f):   # the gradient, which training follows, when the function runs here
            b, s, v = c.sizes(3, 3, 12)
            logits = c.randn(b, s, v, scale=2.0)
            ids = c.randint(0, v, (b, s))
            leaf = logits.clone().requires_grad_(True)
            got = c.call(leaf, ids)
            if not isinstance(got, torch.Tensor):
                c.fail(_("the loss should be a torch.Tensor, got {kind}.").format(
                    kind=type(got).__name__), loss.NOT_DIFFERENTIABLE)
            if not got.requires_grad:
                c.fail(_("no gradient flows back to the logits from the loss."),
                       loss.NOT_DIFFERENTIABLE)
            (grad,) = torch.autograd.grad(got.sum(), leaf, allow_unused=True)
            if grad is None:
                c.fail(_("no gradient flows back to the logits from the loss."),
                       loss.NOT_DIFFERENTIABLE)
            ref_leaf = logits.clone().requires_grad_(True)
            (want,) = torch.autograd.grad(ref_model.next_token_loss(ref_leaf, ids), ref_leaf)
            _quiet_expect(c, grad, want, what=_("the gradient with respect to the logits"),
                          dims=LOGITS)
            c.headline(_("gradient flows to the logits"))


# ============================================================================================
# Exercise 4: model_param_count (its mistakes: checks.nb12.loss)


def check_model_param_count(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("model_param_count", f, seed=seed) as c:
        _no_reference(c, "model_param_count")
        gqa_7b = ModelConfig(n_kv_heads=8)
        cases = [(LLAMA2_7B, "LLaMA-2-7B"), (gqa_7b, _("LLaMA-2-7B shapes with GQA, N_kv = 8"))]
        for _n in range(4 if thorough else 2):
            cfg = loss.count_cfg(c, c.choice(["gqa", "mqa"]))
            cases.append((cfg, _cfg_text(cfg)))
        cfg = loss.count_cfg(c, "mha")
        cases.append((cfg, _cfg_text(cfg)))
        for cfg, label in cases:
            want = ref_model.model_param_count(cfg)
            c.expect_equal(c.call(cfg), want, what=f"model_param_count ({label})",
                           wrong=loss.count_mixups(cfg, want))
            c.properties.remove(f"model_param_count ({label})")
        c.headline(_("the article's 6,738,415,616 for LLaMA-2-7B"))
        c.note(_("untied LM head [H, |V|]; GQA, MQA, D_h != H / N_h"))


# ============================================================================================
# Exercise 5: sample_next_token (its statistics and mistakes: checks.nb12.sampling)


def check_sample_next_token(f, *, seed: int | None = None, thorough: bool = False) -> None:
    with Check("sample_next_token", f, seed=seed, in_place=smp.IN_PLACE) as c:
        _no_reference(c, "sample_next_token")
        # ---- greedy: temperature 0 is argmax, exactly, with or without a generator
        c.errors = smp.GREEDY_ERRORS
        b, v = c.sizes(2, 3, 12)
        v += 10
        logits = c.randn(b, v, scale=3.0)
        want = logits.argmax(-1)
        greedy_wrong = {smp.GREEDY_ARGMIN: logits.argmin(-1), smp.GREEDY_AXIS: logits.argmax(0),
                        smp.KEEPDIM: want[:, None]}
        for kwargs in ({"temperature": 0.0}, {"temperature": 0, "generator": torch.Generator()},
                       {"temperature": 0.0, "top_k": 3}):
            label = f"logits [B={b}, V={v}], " + ", ".join(f"{k}={val}" for k, val in
                                                          kwargs.items() if k != "generator")
            got = smp.sample(c, logits, label, **kwargs)
            _quiet_expect(c, got, want, what=_("greedy tokens ({case})").format(case=label),
                          dims=("B",), wrong=greedy_wrong)
        huge = c.randn(b, v, scale=1e4)
        _quiet_expect(c, smp.sample(c, huge, "logits ~ 1e4", temperature=0.0), huge.argmax(-1),
                      what=_("greedy tokens for logits ~ 1e4"), dims=("B",))
        c.headline(_("temperature 0 is greedy: argmax of each row"))
        # ---- the distributions: defaults, sharper with top_k > |V|, flatter, ties at the k-th
        c.errors = smp.SAMPLING_ERRORS
        vs = [c.randint(6, MAX_VOCAB + 1) for _n in range(4)]
        smp.statistical_case(c, vs[0], 1.0, None, defaults=True)
        smp.statistical_case(c, vs[1], 0.5, vs[1] + c.randint(1, 4))
        smp.statistical_case(c, vs[2], 2.0, c.randint(2, vs[2] - 2))
        smp.statistical_case(c, vs[3], 1.0, c.randint(2, vs[3] // 2 + 1), ties=True)
        if thorough:
            for temperature in (0.7, 1.6):
                v = c.randint(6, MAX_VOCAB + 1)
                smp.statistical_case(c, v, temperature, c.choice([None, c.randint(2, v - 1)]))
            v = c.randint(6, MAX_VOCAB + 1)
            smp.statistical_case(c, v, 1.3, v)          # top_k = |V| keeps everything
        c.headline(_("frequencies match softmax(logits / T) over the top k ({count} draws each, "
                     "within ±{tol})").format(count=N_SAMPLES, tol=f"{TOL:.3f}"))
        c.headline(_("top-k keeps logits tied with the k-th largest; top_k > |V| keeps every "
                     "token"))
        c.note(_("T < 1 sharpens, T > 1 flattens"))
        c.note(_("top-k never returns a token outside the top k"))
        # ---- a batch of different rows: each row samples from its own distribution
        smp.batch_case(c, thorough)
        c.note(_("each row of a batch draws from its own logits, independently"))
        # ---- a batch of one row: still shape [1], greedy and sampled, with and without top-k
        one = smp.spread_logits(c, 7)[None]
        for kwargs in ({"temperature": 0.0}, {"temperature": 1.0},
                       {"temperature": 0.7, "top_k": 3}):
            label = _("a batch of one row [1, 7], {args}").format(
                args=", ".join(f"{k}={val}" for k, val in kwargs.items()))
            smp.sample(c, one, label, generator=torch.Generator().manual_seed(c.randint(0, 999)),
                       **kwargs)
        c.note(_("a batch of one row gives shape [1]"))
        # ---- large logits (about ±1000) on the sampling paths, with and without top-k
        c.errors = (smp.SOFTMAX_OVERFLOW,)
        smp.huge_case(c)
        c.note(_("stable for logits around ±1000"))
        # top_k = 1 leaves one candidate: the argmax, at any temperature
        c.errors = smp.TOP_1_ERRORS
        for temperature in (1.0, 2.5):
            got = smp.sample(c, logits, f"top_k=1, temperature={temperature}", top_k=1,
                             temperature=temperature, generator=torch.Generator().manual_seed(0))
            if not torch.equal(got, want):
                c.fail(_("with top_k=1 (temperature={temperature}) returned {got}; the only "
                         "token top_k=1 keeps is the argmax, {want}.").format(
                    temperature=temperature, got=got.tolist(), want=want.tolist()),
                       smp.TOPK_SMALLEST if torch.equal(got, logits.argmin(-1)) else
                       smp.NOT_GREEDY_AT_K1)
        c.note(_("top_k=1 is greedy"))
        # ---- reproducible with a generator
        v = c.randint(6, MAX_VOCAB + 1)
        logits = smp.spread_logits(c, v).repeat(2000, 1)
        s = c.randint(0, 2**31 - 2)
        for top_k in (None, c.randint(2, v - 1)):
            how = "" if top_k is None else f", top_k={top_k}"
            runs = [smp.sample(c, logits, _("generator seeded {seed}").format(seed=seed_) + how,
                               temperature=1.0, top_k=top_k,
                               generator=torch.Generator().manual_seed(seed_))
                    for seed_ in (s, s, s + 1)]
            if not torch.equal(runs[0], runs[1]):
                c.fail(_("two generators seeded alike ({seeded}) gave different samples{how}.")
                       .format(seeded=f"torch.Generator().manual_seed({s})", how=how),
                       smp.GENERATOR_IGNORED)
            if torch.equal(runs[0], runs[2]):
                c.fail(_("generators with different seeds gave the same 2000 samples{how}.")
                       .format(how=how), smp.FIXED_SEED)
        c.note(_("same generator seed, same samples"))
        # ---- generator=None: torch's global generator
        first = smp.sample(c, logits, "generator=None", temperature=1.0)
        second = smp.sample(c, logits, "generator=None", temperature=1.0)
        if torch.equal(first, second):
            c.fail(_("with generator=None, two calls in a row gave the same 2000 samples."),
                   smp.NONE_FRESH)
        if not is_remote(f):
            state = torch.get_rng_state()
            try:
                torch.manual_seed(s)
                first = smp.sample(c, logits, "generator=None", temperature=1.0)
                torch.manual_seed(s)
                second = smp.sample(c, logits, "generator=None", temperature=1.0)
            finally:
                torch.set_rng_state(state)
            if not torch.equal(first, second):
                c.fail(_("with generator=None, two calls after the same torch.manual_seed gave "
                         "different samples."), smp.NONE_NOT_GLOBAL)
        c.note(_("generator=None uses torch's global generator"))


# --------------------------------------------------------------------------------------------
# The mistakes each exercise's check can name: checks.registry maps "12.<exercise>.<key>" to
# exactly one of them (tests/checkers/test_registry.py holds each id to one message and to a
# catalogued wrong implementation that names it).

MISTAKES = {
    "init_model_params": (
        SAME_BLOCKS, BLOCK_DTYPE, BLOCK_GENERATOR, LAYERS_NOT_LIST, HEAD_AS_WO, HEAD_V_BY_H,
        init.NONE_FRESH, NO_LM_HEAD, init.NORM_ZEROS, init.SHARED, init.STD_ONE, TIED, LAYER_COUNT,
        BUILD_BLOCK, DTYPE_IGNORED, EMBED_TRANSPOSED, FINAL_NORM_NAME, FINAL_NORM_NOT_ONE,
        LAYERS_NAME, NORM_NOT_VECTOR, OTHER_NAMES, init.WRONG_STD, init.NONZERO_MEAN,
        init.UNINITIALISED, init.NONE_NOT_GLOBAL),
    "model_forward": (
        fwd.REVERSED, fwd.DEFAULT_POSITIONS, fwd.TIED_HEAD, fwd.EMBED_SCALED, fwd.NORM_EVERY,
        fwd.FINAL_EPS, fwd.FIRST_BLOCK_ONLY, fwd.FIRST_REPEATED, fwd.FIRST_ROW_POSITIONS,
        fwd.EMBED_OVERWRITTEN, fwd.LAST_BLOCK_ONLY, fwd.SKIPPED_LAST, fwd.LAST_ONLY,
        fwd.HEAD_TRANSPOSED, fwd.NO_BLOCKS, fwd.NO_FINAL_NORM, fwd.POSITIONS_IGNORED,
        fwd.POSITIONS_REQUIRED, fwd.LOG_PROBABILITIES, fwd.PROBABILITIES, fwd.HEAD_TRANSPOSED,
        fwd.NO_GRAD, fwd.GRAPH_CUT, fwd.IN_PLACE_LEAF, fwd.NORM_AFTER_HEAD, fwd.IN_PLACE,
        fwd.LAST_TOKEN_UNUSED, fwd.IN_PLACE_SAVED, fwd.GRADIENT_NOT_FINITE),
    "next_token_loss": (
        loss.NOT_FLATTENED, loss.DIVIDED_BY_BS, loss.NO_LOG, loss.IN_PLACE, loss.LOG_OF_SOFTMAX,
        loss.AXIS_BATCH, loss.AXIS_SEQ, loss.PER_TOKEN, loss.PER_SEQUENCE, loss.NO_LOG_SOFTMAX,
        loss.NO_MINUS, loss.NO_SHIFT, loss.NOT_DIFFERENTIABLE, loss.RETURNED_NUMBER,
        loss.WRONG_WAY, loss.SUMMED, loss.SUM_OVER_TIME, loss.UNSTABLE, loss.ROLLED,
        loss.SUM_OVER_BATCH, loss.SHAPE_ONE),
    "model_param_count": (
        loss.NO_BLOCK_NORMS, loss.NO_FINAL_NORM_COUNT, loss.FINAL_NORM_PER_BLOCK,
        loss.L_MINUS_ONE, loss.L_PLUS_ONE, loss.HEAD_AS_WO, loss.HEAD_BIAS, loss.MHA_BLOCKS,
        loss.ONE_BLOCK, loss.UNTIED, loss.AS_FLOAT),
    "sample_next_token": (
        smp.GREEDY_AXIS, smp.GREEDY_ERROR, smp.TOPK_ZERO_FILL, smp.FIXED_SEED,
        smp.GENERATOR_IGNORED, smp.GREEDY_ARGMIN, smp.TOPK_MINUS_ONE, smp.TOPK_PLUS_ONE,
        smp.TOPK_SMALLEST, smp.IN_PLACE, smp.SAME_ROW, smp.ONE_THRESHOLD, smp.KEEPDIM,
        smp.TEMP_IGNORED, smp.TEMP_MULTIPLIED, smp.THRESHOLD_NO_KEEPDIM, smp.TIES_DROPPED,
        smp.NOT_INT64, smp.TOPK_IGNORED, smp.TOPK_TOO_LARGE, smp.UNIFORM, smp.SQUEEZED,
        smp.TEMP_AFTER_SOFTMAX, smp.TEMP_TWICE, smp.TEMP_SQRT, smp.TOPK_FLAT, smp.TOPK_INDEX,
        smp.ALWAYS_GREEDY, smp.TOPK_COVERS_DROPPED, smp.SOFTMAX_OVERFLOW, smp.NONE_FRESH,
        smp.NONE_NOT_GLOBAL,
        smp.UNIFORM_TOPK, smp.NOT_GREEDY_AT_K1, smp.OUT_OF_TOP_K, smp.NAN_PROBS),
}
