"""Chapter 12's model_forward check: the mistakes it names, the random models it runs, the
known-wrong forwards built from the reference pieces, and a watch on the positions a forward
hands its blocks (checks.nb12 holds `check_model_forward` itself).

Without positions, a forward must hand its blocks torch.arange(S). The logits cannot show it
(RoPE sees only differences of positions, so arange(1, S + 1) gives the same logits), so the
check looks at the `positions` argument of every decoder_block, attention_sublayer and apply_rope
call the forward makes while it runs in this process.
"""

from __future__ import annotations

import contextlib
import math
import sys

import torch
import torch.nn.functional as F

from .. import reference as ref
from ..config import ModelConfig
from ..engine import Check
from ..i18n import N_, _
from ..mistakes import Mistake
from ..nb11 import random_layer
from ..reference.norms import rms_norm

NO_FINAL_NORM = Mistake("no_final_norm", N_(
    "no final RMSNorm: after the last block, normalise with params['final_norm'] (and "
    "cfg.norm_eps) before the LM head"))
FINAL_EPS = Mistake("final_norm_eps_ignored", N_(
    "ignored cfg.norm_eps in the final norm: rms_norm(x, params['final_norm'], cfg.norm_eps)"))
TIED_HEAD = Mistake("embedding_as_lm_head", N_(
    "used the embedding table (transposed) as the LM head: LLaMA-2's LM head is its own matrix, "
    "params['lm_head'] [H, |V|]"))
FIRST_BLOCK_ONLY = Mistake("first_block_only", N_(
    "ran only the first block: run all L blocks of params['layers'], in order"))
LAST_BLOCK_ONLY = Mistake("last_block_only", N_(
    "ran only the last block (was x overwritten from the embeddings in the loop?): each block "
    "takes the previous block's output, x = decoder_block(x, layer, ...)"))
SKIPPED_LAST = Mistake("last_block_skipped", N_(
    "skipped the last block (range(L - 1)?): run every block of params['layers']"))
REVERSED = Mistake("blocks_reversed", N_(
    "ran the blocks in reverse order: block 0 first, then 1, ..., L - 1"))
FIRST_REPEATED = Mistake("first_block_repeated", N_(
    "ran params['layers'][0] L times: each block has its own weights, for layer in "
    "params['layers']"))
NO_BLOCKS = Mistake("no_blocks", N_(
    "left out the blocks: embed -> L decoder blocks -> final norm -> LM head"))
EMBED_SCALED = Mistake("embeddings_scaled", N_(
    "scaled the embeddings by sqrt(H) (as the original Transformer and Gemma do); LLaMA feeds the "
    "looked-up rows as they are"))
NORM_EVERY = Mistake("final_norm_after_every_block", N_(
    "applied the final norm after every block: it comes once, after the last block (each block "
    "normalises its own sublayer inputs)"))
POSITIONS_IGNORED = Mistake("positions_ignored", N_(
    "ignored `positions`: used 0, 1, ..., S-1 although positions were given; pass the given "
    "positions to every block (arange(S) is only the default)"))
FIRST_ROW_POSITIONS = Mistake("first_row_of_positions", N_(
    "used the first row of positions [B, S] for every sequence; pass the whole [B, S] tensor on "
    "to the blocks (RoPE accepts it)"))
PROBABILITIES = Mistake("returned_probabilities", N_(
    "returned probabilities (softmax of the logits): model_forward returns the raw scores x @ "
    "W_lm; the softmax belongs to the loss or to sampling"))
LOG_PROBABILITIES = Mistake("returned_log_probabilities", N_(
    "returned log-probabilities (log_softmax of the logits): model_forward returns the raw scores "
    "x @ W_lm"))
LAST_ONLY = Mistake("last_position_only", N_(
    "returned only the last position's logits [B, |V|]: model_forward returns the logits of every "
    "position, [B, S, |V|] (generation picks the last row itself)"))
NORM_AFTER_HEAD = Mistake("norm_after_lm_head", N_(
    "normalised after the LM head: the final norm comes before it"))
POSITIONS_REQUIRED = Mistake("positions_required", N_(
    "positions is optional: `positions=None` in the signature, and when it is None use "
    "torch.arange(S) (every sequence starts at position 0)"),
    raises=[("TypeError", r"required positional argument: 'positions'"),
            ("TypeError", r"'NoneType' object is not subscriptable"),
            ("AttributeError", r"'NoneType' object has no attribute '(dim|shape|ndim|size|"
                               r"unsqueeze|expand|device)'")])
DEFAULT_POSITIONS = Mistake("default_positions_not_from_zero", N_(
    "the default positions are torch.arange(S): every sequence starts at position 0 (the logits "
    "here cannot show another start, since RoPE sees only differences of positions, but a KV "
    "cache in chapter 13 does)"))
EMBED_OVERWRITTEN = Mistake("function_name_overwritten", N_(
    "a name that should be a function holds a tensor: did a cell assign to a function's name "
    "(`embed = params['embed']`)? Use another variable name, then run the cell that defines (or "
    "borrows) the function again"),
    raises=[("TypeError", r"'Tensor' object is not callable")])
IN_PLACE = Mistake("input_changed_in_place", N_(
    "leave the inputs alone: `x = x + ...` makes a new tensor, `x += ...` does not"))
NOT_CAUSAL = Mistake("not_causal", N_(
    "the model must be causal: every block's attention uses the causal mask"))
LAST_TOKEN_UNUSED = Mistake("last_token_unused", N_(
    "the logits of position t are computed from the tokens up to and including t"))
_HEAD_TRANSPOSED = N_(
    "applied the LM head transposed (x @ params['lm_head'].T): params['lm_head'] is already "
    "[H, |V|], so x @ params['lm_head'] (the course's weights are [in, out]; nn.Linear's are "
    "[out, in])")


HEAD_TRANSPOSED = Mistake("lm_head_transposed", _HEAD_TRANSPOSED)  # as the registry tells it


def head_transposed(cfg: ModelConfig) -> Mistake:
    """x @ lm_head.T: the matmul error of these sizes ([.. x H] and [|V| x H])."""
    h, v = cfg.hidden_size, cfg.vocab_size
    return Mistake("lm_head_transposed", _HEAD_TRANSPOSED, raises=[
        ("RuntimeError", rf"shapes cannot be multiplied \(\d+x{h} and {v}x{h}\)")])


def model_cfg(c: Check, kind: str = "gqa", *, decoupled: bool = False, partial: bool = False,
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


def random_params(c: Check, cfg: ModelConfig) -> dict:
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


def forward_mixups(ids, params, cfg, positions) -> dict:
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


def cfg_text(cfg: ModelConfig) -> str:
    return (f"|V|={cfg.vocab_size}, H={cfg.hidden_size}, N_h={cfg.n_heads}, "
            f"N_kv={cfg.n_kv_heads}, D_h={cfg.head_dim}, H_ff={cfg.ffn_hidden_size}, "
            f"L={cfg.n_layers}")


def case_label(cfg: ModelConfig, b: int, s: int, positions, how: str) -> str:
    kind = ("MHA" if cfg.n_kv_heads == cfg.n_heads else
            "MQA" if cfg.n_kv_heads == 1 else "GQA")
    parts = [f"{kind}: B={b}, S={s}, {cfg_text(cfg)}"]
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


_TAKES_POSITIONS = ("decoder_block", "attention_sublayer", "apply_rope")


@contextlib.contextmanager
def watching_positions():
    """Collects the `positions` argument of every decoder_block, attention_sublayer and
    apply_rope call made inside the block (the learner's or the course's)."""
    seen: list[torch.Tensor] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in _TAKES_POSITIONS:
            p = frame.f_locals.get("positions")
            if isinstance(p, torch.Tensor):
                seen.append(p.detach().clone())

    previous = sys.getprofile()

    def chained(frame, event, arg):
        profile(frame, event, arg)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(chained)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def wrong_default(seen: list[torch.Tensor], s: int) -> torch.Tensor | None:
    """The first positions seen that are not torch.arange(s) (in any batch shape), or None."""
    want = torch.arange(s)
    for p in seen:
        if p.shape[-1:] != (s,) or not bool((p.to(torch.int64) == want).all()):
            return p
    return None


# ---- training needs gradients through the forward (chapter 14 backpropagates through it) ------

NO_GRAD = Mistake("forward_under_no_grad", N_(
    "ran the forward (or part of it) under torch.no_grad() or torch.inference_mode(): no gradient "
    "flows back to the parameters, and chapter 14 trains through model_forward; leave gradient "
    "tracking on (disable it where you call the model for generation, not inside it)"))
GRAPH_CUT = Mistake("gradient_cut", N_(
    "no gradient reaches some parameters: something cut the graph between them and the logits "
    "(.detach(), .data, .numpy(), .tolist(), .item() or torch.tensor(...) of a result); compute "
    "with the tensors themselves so that autograd can follow every step (chapter 14 trains "
    "through model_forward)"),
    raises=[("RuntimeError", r"Can't call numpy\(\) on Tensor that requires grad")])
IN_PLACE_LEAF = Mistake("parameter_changed_in_place", N_(
    "changed a parameter in place (an operation ending in _, `w *= ...`, `w[...] = ...` on a "
    "tensor of params): with requires_grad=True, as in training, torch refuses it; compute into "
    "a new tensor (`w = w * ...`) and leave params as they are"),
    raises=[("RuntimeError", r"leaf Variable that requires grad is being used in an in-place")])

IN_PLACE_SAVED = Mistake("in_place_breaks_backward", N_(
    "changed in place a tensor that the backward pass needs (`x.mul_(...)`, `x *= ...`, "
    "`x[...] = ...` on a result that a later operation still uses): the forward runs, but "
    "loss.backward() fails in chapter 14; compute into a new tensor (`x = x * ...`)"),
    raises=[("RuntimeError", r"modified by an inplace operation")])
GRADIENT_NOT_FINITE = Mistake("gradient_not_finite", N_(
    "the logits are finite but their gradients are inf or NaN (a square root or a division at "
    "zero, a -inf that reaches the backward pass): chapter 14 cannot train through it; keep "
    "every step differentiable where it is used (add eps inside the square root, mask with "
    "torch.where or masked_fill)"))


def trainability_mistake(cut) -> Mistake:
    """The mistake of a `checks.gradients.Cut` found in model_forward."""
    from .. import gradients

    return {gradients.NO_GRAD: NO_GRAD, gradients.IN_PLACE: IN_PLACE_SAVED,
            gradients.NOT_FINITE: GRADIENT_NOT_FINITE}.get(cut.cause, GRAPH_CUT)


def trainable_params(params: dict) -> dict:
    """A copy of `params` whose every tensor is a fresh leaf with requires_grad=True."""
    def leaf(t):
        return t.detach().clone().requires_grad_(True)
    return {"embed": leaf(params["embed"]), "final_norm": leaf(params["final_norm"]),
            "lm_head": leaf(params["lm_head"]),
            "layers": [{k: leaf(t) for k, t in layer.items()} for layer in params["layers"]]}


def named_tensors(params: dict) -> list[tuple[str, torch.Tensor]]:
    out = [(f"params['{k}']", params[k]) for k in ("embed", "final_norm", "lm_head")]
    for i, layer in enumerate(params["layers"]):
        out += [(f"params['layers'][{i}]['{k}']", t) for k, t in layer.items()]
    return out
