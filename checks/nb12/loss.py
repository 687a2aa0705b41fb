"""Chapter 12's next_token_loss and model_param_count checks: the mistakes they name and the
known-wrong results they compare with, built from the same inputs (checks.nb12 holds the
`check_` functions themselves)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..engine import Check
from ..i18n import N_, _
from ..mistakes import Mistake
from ..reference import block as ref_block

# ============================================================================================
# next_token_loss

NO_SHIFT = Mistake("no_shift", N_(
    "no shift: the logits at position t predict the NEXT token, so compare logits[:, :-1] with "
    "token_ids[:, 1:] (scoring each position against its own token rewards copying the input)"))
WRONG_WAY = Mistake("shifted_the_wrong_way", N_(
    "shifted the wrong way: logits[:, t] predicts token t + 1, so pair logits[:, :-1] with "
    "token_ids[:, 1:] (not logits[:, 1:] with token_ids[:, :-1])"))
ROLLED = Mistake("wrapped_around_with_roll", N_(
    "wrapped around (torch.roll): the last position has no next token and the first token is never"
    " a target; drop them by slicing, logits[:, :-1] and token_ids[:, 1:]"))
SUMMED = Mistake("summed", N_(
    "summed instead of averaged: the loss is the MEAN over all B * (S - 1) predictions "
    "(cross_entropy's default reduction), so that it does not grow with batch or length"))
SUM_OVER_TIME = Mistake("summed_over_positions", N_(
    "summed over the positions and averaged over the batch: take the mean over all B * (S - 1) "
    "predictions"))
SUM_OVER_BATCH = Mistake("summed_over_batch", N_(
    "averaged over the positions but summed over the batch: take the mean over all B * (S - 1) "
    "predictions"))
DIVIDED_BY_BS = Mistake("divided_by_b_times_s", N_(
    "divided by B * S: there are only S - 1 predictions per sequence (the last position has no "
    "next token); average over B * (S - 1)"))
PER_TOKEN = Mistake("loss_per_prediction", N_(
    "returned one loss per prediction: average them into one scalar (reduction='mean', or "
    ".mean())"))
PER_SEQUENCE = Mistake("loss_per_sequence", N_(
    "returned one loss per sequence: average over the batch as well, into one scalar"))
SHAPE_ONE = Mistake("shape_one", N_(
    "returned a tensor of shape [1]: the loss is a 0-dim scalar tensor"))
AXIS_SEQ = Mistake("log_softmax_over_sequence", N_(
    "log-softmax over the wrong axis (the sequence axis, dim=1): the distribution is over the "
    "vocabulary, the last axis (dim=-1)"))
AXIS_BATCH = Mistake("log_softmax_over_batch", N_(
    "log-softmax over the wrong axis (the batch axis, dim=0): the distribution is over the "
    "vocabulary, the last axis (dim=-1)"))
NO_LOG = Mistake("forgot_the_log", N_(
    "forgot the log: cross-entropy is the mean of -log p(target), not of -p(target)"))
NO_LOG_SOFTMAX = Mistake("no_log_softmax", N_(
    "forgot the log-softmax: -logits[target] is not a log-probability; normalise with log_softmax "
    "over the vocabulary first (nll_loss expects log-probabilities)"))
NO_MINUS = Mistake("no_minus_sign", N_(
    "forgot the minus sign: the loss is -log p(target), which is positive"))
UNSTABLE = Mistake("unstable_for_large_logits", N_(
    "not stable for large logits: exp() overflows (or softmax underflows to 0 and log(0) = -inf); "
    "use log_softmax (x - logsumexp(x)) or F.cross_entropy, which subtract the largest logit "
    "first"))
LOG_OF_SOFTMAX = Mistake("log_of_softmax", N_(
    "took log(softmax(x)): softmax underflows to exactly 0 for a logit far below the largest "
    "(about 100 below in float32), and log(0) = -inf; use log_softmax (x - logsumexp(x)) or "
    "F.cross_entropy, which never form the small probability"))
NOT_FLATTENED = Mistake("cross_entropy_not_flattened", N_(
    "F.cross_entropy reads the classes from dim 1 of a 3-D input: flatten first, logits to "
    "[B * (S - 1), |V|] and targets to [B * (S - 1)] (.reshape(-1, V), .reshape(-1)), or move the "
    "vocabulary axis to dim 1 (.transpose(1, 2))"),
    raises=[("RuntimeError", r"Expected target size"), ("ValueError", r"Expected target size")])
RETURNED_NUMBER = Mistake("returned_python_number", N_(
    "return the tensor itself, without .item(): training calls loss.backward() on it"))
IN_PLACE = Mistake("inputs_changed_in_place", N_(
    "slice and compute into new tensors; leave logits and token_ids alone"))
NOT_DIFFERENTIABLE = Mistake("not_differentiable", N_(
    "the loss must stay differentiable: training backpropagates through it; avoid .item(), "
    ".detach(), .numpy(), torch.tensor(...) of a result or torch.no_grad() inside the function"))


def _ce(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), reduction=reduction)


def _nll_with(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """-mean of logp[:, t, ids[:, t + 1]] for a [B, S, V] tensor of (wrong) log-probabilities."""
    return -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()


_LAST_DROPPED = N_("{mistake} (the last position dropped)")
_FIRST_DROPPED = N_("{mistake} (the first position dropped)")
_FLATTENED = N_("{mistake} (flattened)")
_AXIS_SEQ_SLICED = N_("log-softmax over the wrong axis (the sequence axis, dim=1, of the sliced "
                      "logits): the distribution is over the vocabulary, the last axis (dim=-1)")
_AND_SUMMED = N_("{mistake} and summed instead of averaged")


def _told(mistake: Mistake, template: str, key: str | None = None) -> Mistake:
    """`mistake` (or the mistake `key`) told with `template`, which places it in context."""
    return Mistake(key or mistake.key, _(template).format(mistake=_(mistake)))


def loss_mixups(logits: torch.Tensor, ids: torch.Tensor) -> dict:
    b, s, _v = logits.shape
    shifted, targets = logits[:, :-1], ids[:, 1:]
    n = b * (s - 1)
    per_token = lambda: _ce(shifted, targets, "none").view(b, s - 1)  # noqa: E731
    return {
        NO_SHIFT: lambda: _ce(logits, ids),
        _told(NO_SHIFT, _LAST_DROPPED): lambda: _ce(shifted, ids[:, :-1]),
        _told(NO_SHIFT, _FIRST_DROPPED): lambda: _ce(logits[:, 1:], targets),
        WRONG_WAY: lambda: _ce(logits[:, 1:], ids[:, :-1]),
        ROLLED: lambda: _ce(logits, ids.roll(-1, dims=1)),
        SUMMED: lambda: per_token().sum(),
        SUM_OVER_TIME: lambda: per_token().sum() / b,
        SUM_OVER_BATCH: lambda: per_token().sum() / (s - 1),
        DIVIDED_BY_BS: lambda: per_token().sum() / (b * s),
        PER_TOKEN: lambda: per_token(),
        _told(PER_TOKEN, _FLATTENED): lambda: per_token().reshape(n),
        PER_SEQUENCE: lambda: per_token().mean(-1),
        SHAPE_ONE: lambda: _ce(shifted, targets).reshape(1),
        AXIS_SEQ: lambda: _nll_with(torch.log_softmax(logits, dim=1), ids),
        AXIS_SEQ.with_text(_(_AXIS_SEQ_SLICED)):
            lambda: -torch.log_softmax(shifted, dim=1).gather(-1, targets[..., None]).mean(),
        AXIS_BATCH: lambda: _nll_with(torch.log_softmax(logits, dim=0), ids),
        NO_LOG: lambda: _nll_with(torch.softmax(logits, dim=-1), ids),
        NO_LOG_SOFTMAX: lambda: _nll_with(logits, ids),
        NO_MINUS: lambda: -_ce(shifted, targets),
        _told(NO_SHIFT, _AND_SUMMED, "no_shift_and_summed"): lambda: _ce(logits, ids, "sum"),
    }


# ============================================================================================
# model_param_count

UNTIED = Mistake("one_vxh_matrix_counted", N_(
    "counted only one [|V|, H] matrix: LLaMA-2's LM head [H, |V|] is a separate matrix from the "
    "embedding table [|V|, H] (the two are not tied), so both count"))
HEAD_AS_WO = Mistake("lm_head_as_h_by_h", N_(
    "counted the LM head as an H x H matrix, the shape of the attention output projection W_O: W_O"
    " maps the merged heads back to H inside every block, while the LM head maps H features to |V|"
    " scores once, at the top: [H, |V|]"))
NO_FINAL_NORM_COUNT = Mistake("final_norm_left_out", N_(
    "left out the final RMSNorm's scale: H more parameters"))
FINAL_NORM_PER_BLOCK = Mistake("final_norm_per_block", N_(
    "counted a final norm in every block: there is one final norm, after the last block (each "
    "block's own two norms are in block_param_count)"))
L_MINUS_ONE = Mistake("l_minus_one_blocks", N_(
    "counted L - 1 blocks: the model has cfg.n_layers blocks"))
L_PLUS_ONE = Mistake("l_plus_one_blocks", N_(
    "counted L + 1 blocks: the model has cfg.n_layers blocks"))
ONE_BLOCK = Mistake("one_block", N_("counted one block: multiply the block count by cfg.n_layers"))
MHA_BLOCKS = Mistake("mha_blocks", N_(
    "counted the attention as 4 H x H matrices: with GQA, W_K and W_V have N_kv * D_h columns "
    "(chapter 11's block_param_count)"))
HEAD_BIAS = Mistake("lm_head_bias", N_(
    "added a bias of |V| to the LM head: the course's linear layers have no biases"))
NO_BLOCK_NORMS = Mistake("block_norms_left_out", N_(
    "left out the blocks' norm scales: each block has two RMSNorms of H (chapter 11's "
    "block_param_count)"))
AS_FLOAT = Mistake("returned_float", N_(
    "returned a float; a parameter count is an exact int (avoid `/`)"))


_AND_NO_FINAL_NORM = N_("{mistake}; and left out the final RMSNorm's scale: H more parameters")


def count_mixups(cfg: ModelConfig, want: int) -> dict:
    h, v, n_l = cfg.hidden_size, cfg.vocab_size, cfg.n_layers
    block = ref_block.block_param_count(cfg)
    mha_block = 4 * h * h + 3 * h * cfg.ffn_hidden_size + 2 * h
    wrong = {
        AS_FLOAT: float(want),
        UNTIED: want - v * h,
        HEAD_AS_WO: want - h * v + h * h,
        NO_FINAL_NORM_COUNT: want - h,
        FINAL_NORM_PER_BLOCK: want + (n_l - 1) * h,
        L_MINUS_ONE: want - block,
        L_PLUS_ONE: want + block,
        ONE_BLOCK: want - (n_l - 1) * block,
        HEAD_BIAS: want + v,
        NO_BLOCK_NORMS: want - 2 * h * n_l,
        _told(UNTIED, _AND_NO_FINAL_NORM, "one_vxh_matrix_and_no_final_norm"): want - v * h - h,
    }
    if cfg.n_kv_heads != cfg.n_heads or cfg.n_heads * cfg.head_dim != h:
        wrong[MHA_BLOCKS] = want + n_l * (mha_block - block)
    return wrong


def count_cfg(c: Check, kind: str) -> ModelConfig:
    n_kv = 1 if kind == "mqa" else c.randint(2, 5)
    g = 1 if kind == "mha" else c.randint(2, 5)
    n_h, d = n_kv * g, c.choice([16, 32, 64])
    h = n_h * d if kind == "mha" else n_h * d + c.choice([-16, 32, 64])
    return ModelConfig(vocab_size=c.randint(1000, 50000), hidden_size=h, n_heads=n_h,
                       n_kv_heads=n_kv, head_dim=d, ffn_hidden_size=c.randint(3 * h, 4 * h),
                       n_layers=c.randint(3, 40), max_seq_len=2048)


