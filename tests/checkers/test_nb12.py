"""Chapter 12 checkers: the reference passes at every seed; each known mistake is diagnosed."""

import contextlib
import dataclasses
import math
import types

import pytest
import torch
import torch.nn.functional as F

from checks import LLAMA2_7B, ModelConfig, nb12
from checks.nb12 import sampling as nb12_sampling
from checks import reference as ref
from checks.engine import ForbiddenCall
from checks.reference import model as ref_model

from ..support.catalogue import Wrong, assert_passes, exercises, failure_text


def _copy(fn):
    """The reference function under a new code object: the checks reject calls to the course's
    own answers (by code object), so the tests pass a copy of them as the correct answer."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


REFERENCE = {
    nb12.check_init_model_params: _copy(ref_model.init_model_params),
    nb12.check_model_forward: _copy(ref_model.model_forward),
    nb12.check_next_token_loss: _copy(ref_model.next_token_loss),
    nb12.check_model_param_count: _copy(ref_model.model_param_count),
    nb12.check_sample_next_token: _copy(ref_model.sample_next_token),
}


@pytest.mark.parametrize("checker,name", [
    (nb12.check_init_model_params, "init_model_params"),
    (nb12.check_model_forward, "model_forward"),
    (nb12.check_next_token_loss, "next_token_loss"),
    (nb12.check_model_param_count, "model_param_count"),
    (nb12.check_sample_next_token, "sample_next_token"),
])
def test_the_courses_own_answer_is_rejected(checker, name):
    """Calling checks.reference's finished function (directly, or from inside a wrapper) is not
    an answer; the earlier chapters' pieces remain allowed (the learner-style answers use them)."""
    fn = getattr(ref_model, name)

    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    for candidate in (fn, wrapper):
        with pytest.raises(ForbiddenCall) as info:
            checker(candidate, seed=0)
        assert "course's own" in str(info.value)


# ---- learner-style correct answers (a second formulation next to the reference) -----------------

def _init(cfg, generator=None, dtype=torch.float32, *, tied=False, head_shape=None, blocks="own",
          layers_delta=0, final_norm=torch.ones, embed_std=0.02, pass_gen=True, pass_dtype=True,
          as_tuple=False, none_gen=None):
    """A learner-style init_model_params (built on chapter 11's init_block_params), with one
    thing changed."""
    if generator is None and none_gen is not None:
        generator = none_gen()
    h, v = cfg.hidden_size, cfg.vocab_size
    embed = (torch.randn(v, h, generator=generator) * embed_std).to(dtype)
    n = cfg.n_layers + layers_delta
    block_gen = generator if pass_gen else None
    block_dtype = dtype if pass_dtype else torch.float32
    if blocks == "own":
        layers = [ref.init_block_params(cfg, block_gen, block_dtype) for _ in range(n)]
    elif blocks == "repeated":
        layers = [ref.init_block_params(cfg, block_gen, block_dtype)] * n
    else:  # "seeded": every block from the same fixed seed
        layers = [ref.init_block_params(cfg, torch.Generator().manual_seed(0), block_dtype)
                  for _ in range(n)]
    if tied:
        lm_head = embed.T
    else:
        shape = head_shape(cfg) if head_shape else (h, v)
        lm_head = (torch.randn(*shape, generator=generator) * 0.02).to(dtype)
    return {"embed": embed, "layers": tuple(layers) if as_tuple else layers,
            "final_norm": final_norm(h, dtype=dtype), "lm_head": lm_head}


def _init_with(**changes):
    def init_model_params(cfg, generator=None, dtype=torch.float32):
        return _init(cfg, generator, dtype, **changes)
    return init_model_params


def _init_no_head(cfg, generator=None, dtype=torch.float32):
    params = _init(cfg, generator, dtype)
    del params["lm_head"]
    return params


def _init_changed(edit):
    """init_model_params whose params `edit(params, cfg, generator, dtype)` changes."""
    def init_model_params(cfg, generator=None, dtype=torch.float32):
        params = _init(cfg, generator, dtype)
        edit(params, cfg, generator, dtype)
        return params
    return init_model_params


def _renamed(old, new):
    def edit(params, cfg, generator, dtype):
        params[new] = params.pop(old)
    return edit


def _blocks_by_hand(params, cfg, generator, dtype):
    """Blocks written out by hand with separate W_Q, W_K, W_V, not init_block_params' layout."""
    h, d = cfg.hidden_size, cfg.head_dim
    for layer in params["layers"]:
        del layer["wqkv"]
        for name, n in (("wq", cfg.n_heads), ("wk", cfg.n_kv_heads), ("wv", cfg.n_kv_heads)):
            layer[name] = (torch.randn(h, n * d, generator=generator) * 0.02).to(dtype)


def _embed_drawn(draw):
    def edit(params, cfg, generator, dtype):
        params["embed"] = draw((cfg.vocab_size, cfg.hidden_size), generator).to(dtype)
    return edit


def _os_seeded_generator():
    """generator=None: a new Generator seeded from the OS (`.seed()`), not torch's global one."""
    generator = torch.Generator()
    generator.seed()
    return generator


def _forward_with(*, final_norm=True, eps=True, tied=False, blocks=None, reset=False,
                  embed_scale=False, use_positions=True, first_row=False, out=None,
                  norm_every=False, require_positions=False, start=0, head_t=False):
    """A learner-style model_forward (chapter 11's decoder_block, one-hot embedding lookup, a
    matmul head), with one thing changed."""
    def forward(token_ids, params, cfg, positions):
        s = token_ids.shape[1]
        if positions is None or not use_positions:
            positions = torch.arange(start, start + s)
        if first_row and positions.dim() == 2:
            positions = positions[0]
        emb = F.one_hot(token_ids, cfg.vocab_size).to(params["embed"].dtype) @ params["embed"]
        if embed_scale:
            emb = emb * math.sqrt(cfg.hidden_size)
        x = emb
        layers = params["layers"] if blocks is None else blocks(params["layers"])
        for layer in layers:
            x = ref.decoder_block(emb if reset else x, layer, cfg, positions)
            if norm_every:
                x = ref.rms_norm(x, params["final_norm"], cfg.norm_eps)
        if final_norm and not norm_every:
            x = ref.rms_norm(x, params["final_norm"], cfg.norm_eps if eps else 1e-5)
        head = params["embed"].T if tied else params["lm_head"]
        logits = x @ head.T if head_t else torch.einsum("bsh,hv->bsv", x, head)
        return out(logits) if out else logits

    if require_positions:
        return forward

    def model_forward(token_ids, params, cfg, positions=None):
        return forward(token_ids, params, cfg, positions)
    return model_forward


def _loss_with(*, shift="right", reduction="mean", axis=-1, log=True, softmax=True, stable=True,
               item=False, detach=False, sign=1.0, log_of_softmax=False):
    """A learner-style next_token_loss (log_softmax and gather), with one thing changed."""
    def next_token_loss(logits, token_ids):
        if shift == "right":
            pred, target = logits[:, :-1], token_ids[:, 1:]
        elif shift == "none":
            pred, target = logits, token_ids
        elif shift == "wrong":
            pred, target = logits[:, 1:], token_ids[:, :-1]
        else:  # "roll"
            pred, target = logits, token_ids.roll(-1, dims=1)
        if not softmax:
            logp = pred
        elif not stable:
            e = torch.exp(pred)
            logp = torch.log(e / e.sum(-1, keepdim=True))
        elif log_of_softmax:
            logp = torch.log(torch.softmax(pred, dim=axis))
        elif log:
            logp = torch.log_softmax(pred, dim=axis)
        else:
            logp = torch.softmax(pred, dim=axis)
        picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)   # [B, S']
        if reduction == "mean":
            loss = -picked.mean()
        elif reduction == "sum":
            loss = -picked.sum()
        elif reduction == "bs":
            loss = -picked.sum() / logits.shape[0] / logits.shape[1]
        elif reduction == "sum_time":
            loss = -picked.sum(-1).mean()
        elif reduction == "per_seq":
            loss = -picked.mean(-1)
        else:
            loss = -picked
        loss = loss * sign
        if detach:
            loss = torch.tensor(loss.item(), dtype=loss.dtype)
        return loss.item() if item else loss
    return next_token_loss


def _count_with(*, embed=1, head="ok", final_norm=1, blocks=0, mha=False, bias=0, as_float=False):
    """A learner-style model_param_count (chapter 11's block_param_count), one thing changed."""
    def model_param_count(cfg):
        h, v = cfg.hidden_size, cfg.vocab_size
        block = (4 * h * h + 3 * h * cfg.ffn_hidden_size + 2 * h) if mha else \
            ref.block_param_count(cfg)
        lm_head = {"ok": h * v, "none": 0, "wo": h * h}[head]
        total = (embed * v * h + (cfg.n_layers + blocks) * block + final_norm * h + lm_head
                 + bias * v)
        return total / 1 if as_float else total
    return model_param_count


def _sampler_with(*, greedy="argmax", temp="divide", top_k_mode="ok", fill=float("-inf"),
                  draw="multinomial", use_generator=True, fixed_seed=False, in_place=False,
                  keepdim=False, axis=-1, as_float=False):
    """A learner-style sample_next_token (softmax and torch.multinomial), one thing changed."""
    def sample_next_token(logits, *, temperature=1.0, top_k=None, generator=None):
        if temperature == 0 and greedy != "divide":
            out = logits.argmin(-1) if greedy == "argmin" else logits.argmax(
                0 if greedy == "axis0" else -1, keepdim=keepdim)
            return out.float() if as_float else out
        scores = logits
        if in_place:
            scores /= temperature
        elif temp == "divide":
            scores = logits / temperature
        elif temp == "multiply":
            scores = logits * temperature
        if top_k is not None and top_k_mode != "ignored":
            k = top_k + 1 if top_k_mode == "plus_one" else top_k
            k = k if top_k_mode == "no_clamp" else min(k, scores.shape[-1])
            top = torch.topk(scores, k, dim=-1, largest=top_k_mode != "smallest")
            values = top.values
            if top_k_mode == "smallest":
                drop = scores > values[..., -1:]
            elif top_k_mode == "exact_k":     # exactly k tokens: ties with the k-th dropped
                drop = torch.ones_like(scores, dtype=torch.bool).scatter(-1, top.indices, False)
            elif top_k_mode == "le":
                drop = scores <= values[..., -1:]
            elif top_k_mode == "row0":        # row 0's threshold for every row
                drop = scores < values[0, -1]
            elif top_k_mode == "no_keepdim":
                drop = scores < values[..., -1]
            else:
                drop = scores < values[..., -1:]
            scores = scores.masked_fill(drop, fill)
        probs = torch.softmax(scores, dim=axis)
        gen = generator if use_generator else None
        if fixed_seed:
            gen = torch.Generator().manual_seed(1234)
        if draw == "multinomial":
            out = torch.multinomial(probs, 1, generator=gen)
        elif draw == "categorical":
            out = torch.distributions.Categorical(probs=probs).sample().unsqueeze(-1)
        elif draw == "uniform":
            out = torch.randint(0, probs.shape[-1], (probs.shape[0], 1), generator=gen)
        else:  # "shared_u": one uniform number for the whole batch, inverse CDF
            u = torch.rand(1, generator=gen)
            out = (probs.cumsum(-1) < u).sum(-1, keepdim=True).clamp(max=probs.shape[-1] - 1)
        out = out if keepdim else out.squeeze(-1)
        return out.float() if as_float else out
    return sample_next_token


def _sampler_variant(*, temp="divide", softmax="torch", top_k_mode="ok", none="global",
                     generator_in_top_k=True, draw="multinomial", squeeze="last"):
    """A second learner-style sample_next_token (temperature, top-k, softmax, draw written out
    step by step), one thing changed; with nothing changed, or the unusual-but-correct options
    (temp="power", top_k_mode="indices_mask", squeeze="flatten"), a correct one."""
    def sample_next_token(logits, *, temperature=1.0, top_k=None, generator=None):
        if temperature == 0:
            return logits.argmax(dim=-1)
        if generator is None and none == "fresh":
            generator = torch.Generator()
        elif generator is None and none == "seeded":
            generator = torch.Generator().manual_seed(42)
        gen = generator
        scores = logits
        if temp == "divide" or (temp == "only_without_top_k" and top_k is None):
            scores = scores / temperature
        elif temp == "twice":
            scores = scores / temperature / temperature
        elif temp == "sqrt":
            scores = scores / math.sqrt(temperature)
        if top_k is not None:
            if not generator_in_top_k:
                gen = None
            v = scores.shape[-1]
            k = min(top_k, v - 1) if top_k_mode == "v_minus_one" else min(top_k, v)
            if top_k_mode == "flat":
                kth = torch.topk(scores.flatten(), k).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            elif top_k_mode == "position":    # samples among the k, returns the position
                values, _indices = torch.topk(scores, k, dim=-1)
                return torch.multinomial(torch.softmax(values, -1), 1, generator=gen).squeeze(-1)
            elif top_k_mode == "indices_mask":
                values, indices = torch.topk(scores, k, dim=-1)
                keep = scores >= values[..., -1:]
                keep = keep.scatter(-1, indices, True)
                scores = scores.masked_fill(~keep, float("-inf"))
            else:
                kth = torch.topk(scores, k, dim=-1).values[..., -1:]
                scores = scores.masked_fill(scores < kth, float("-inf"))
        if softmax == "naive":
            e = torch.exp(scores)
            probs = e / e.sum(-1, keepdim=True)
        elif softmax == "global_max":
            e = torch.exp(scores - scores.max())
            probs = e / e.sum(-1, keepdim=True)
        else:
            probs = torch.softmax(scores, dim=-1)
        if temp == "after":
            probs = probs / temperature
        elif temp == "after_renormalised":
            probs = probs / temperature
            probs = probs / probs.sum(-1, keepdim=True)
        elif temp == "power":                 # softmax(l) ** (1/T) is proportional to exp(l / T)
            probs = probs ** (1 / temperature)
        if draw == "argmax":
            return probs.argmax(-1)
        out = torch.multinomial(probs, 1, generator=gen)
        if squeeze == "all":
            return out.squeeze()
        return out.flatten() if squeeze == "flatten" else out.squeeze(-1)
    return sample_next_token


def _forward_untrainable(how):
    """A learner-style model_forward whose values are right but which cannot be trained."""
    def model_forward(token_ids, params, cfg, positions=None):
        if positions is None:
            positions = torch.arange(token_ids.shape[1])
        x = params["embed"].data[token_ids] if how == "embed.data" else params["embed"][token_ids]
        if how == "detach":
            x = x.detach()
        with torch.no_grad() if how == "no_grad_blocks" else contextlib.nullcontext():
            for layer in params["layers"]:
                x = ref.decoder_block(x, layer, cfg, positions)
        x = ref.rms_norm(x, params["final_norm"], cfg.norm_eps)
        head = params["lm_head"]
        if how == "head_in_place":
            head.mul_(1.0)
        elif how == "head.data":
            head = head.data
        if how == "saved_in_place":          # x is saved for the LM head's backward
            logits = x @ head
            x.mul_(1.0)
            return logits
        if how == "nan_gradient":           # sqrt at zero: finite values, NaN gradients
            return x @ head + torch.sqrt((x - x).square()).sum(-1, keepdim=True)
        if how == "numpy":
            return torch.from_numpy(x.detach().numpy() @ head.detach().numpy())
        if how == "torch.tensor":
            return torch.tensor((x @ head).tolist())
        return x @ head
    if how == "no_grad":
        return torch.no_grad()(model_forward)
    if how == "inference_mode":
        return torch.inference_mode()(model_forward)
    return model_forward


def _blocks_with(apply_rope):
    """A model_forward on chapter 11's block written with its own `apply_rope` (as a learner's
    block borrows chapter 08's): Q and K go through it, V does not, so every parameter still
    gets a gradient and only the function that drops them tells."""
    def attention_sublayer(x, layer, cfg, positions):
        h = ref.rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        q, k, v = ref.split_qkv(h @ layer["wqkv"], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
        q = apply_rope(q, positions, base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
        k = apply_rope(k, positions, base=cfg.rope_base, rotary_dim=cfg.rotary_dim)
        s = q.shape[-2]
        mask = ref.causal_mask(s, s)
        return ref.merge_heads(ref.grouped_query_attention(q, k, v, mask)) @ layer["wo"]

    def decoder_block(x, layer, cfg, positions):
        u = x + attention_sublayer(x, layer, cfg, positions)
        return u + ref.swiglu_ffn(ref.rms_norm(u, layer["ffn_norm"], cfg.norm_eps),
                                  layer["w_gate"], layer["w_up"], layer["w_down"])

    def model_forward(token_ids, params, cfg, positions=None):
        if positions is None:
            positions = torch.arange(token_ids.shape[1])
        x = params["embed"][token_ids]
        for layer in params["layers"]:
            x = decoder_block(x, layer, cfg, positions)
        return ref.rms_norm(x, params["final_norm"], cfg.norm_eps) @ params["lm_head"]
    return model_forward


@torch.no_grad()
def _rope_without_grad(x, positions, **kwargs):
    return ref.apply_rope(x, positions, **kwargs)


def _rope_detached(x, positions, **kwargs):
    return ref.apply_rope(x.detach(), positions, **kwargs)


_forward_rope_without_grad = _blocks_with(_rope_without_grad)
_forward_q_detached = _blocks_with(_rope_detached)


def _init_one_ones(cfg, generator=None, dtype=torch.float32):
    """Every norm of the model one torch.ones tensor."""
    params = _init(cfg, generator, dtype)
    ones = torch.ones(cfg.hidden_size, dtype=dtype)
    for layer in params["layers"]:
        layer["attn_norm"] = layer["ffn_norm"] = ones
    params["final_norm"] = ones
    return params


def _forward_norm_after_head(token_ids, params, cfg, positions=None):
    """The final norm moved after the LM head: the logits normalised (with a scale of ones)."""
    logits = _forward_with(final_norm=False)(token_ids, params, cfg, positions)
    return ref.rms_norm(logits, torch.ones(cfg.vocab_size), cfg.norm_eps)


class _ForwardReusingLastResult:
    """Keeps its last logits and returns them again for the same params and the same shape of
    token ids ("nothing changed"), without looking at the ids themselves."""

    def __init__(self):
        self.last = None

    def __call__(self, token_ids, params, cfg, positions=None):
        if self.last is not None and self.last[0] is params["embed"] and \
                self.last[1] == token_ids.shape:
            return self.last[2]
        logits = _forward_with()(token_ids, params, cfg, positions)
        self.last = (params["embed"], token_ids.shape, logits)
        return logits


def _forward_positions_from_zero_in_place(token_ids, params, cfg, positions=None):
    """Makes the positions start at 0 with `-=`, which writes into the caller's tensor."""
    if positions is not None:
        positions -= positions.min()
    return _forward_with()(token_ids, params, cfg, positions)


def _forward_embed_overwritten(token_ids, params, cfg, positions=None):
    embed = params["embed"]         # the name of chapter 02's function, now a tensor
    x = embed(token_ids, params["embed"])
    return x @ params["lm_head"]


def _loss_stabilised_in_place(logits, ids):
    logits -= logits.max(-1, keepdim=True).values      # "for stability", into the caller's tensor
    return _loss_with()(logits, ids)


def _sample_os_seeded_when_none(logits, *, temperature=1.0, top_k=None, generator=None):
    """generator=None: a new Generator seeded from the OS, not torch's global one."""
    return _sampler_with()(logits, temperature=temperature, top_k=top_k,
                           generator=generator if generator is not None else
                           _os_seeded_generator())


def _sample_one_of_top_k(logits, *, temperature=1.0, top_k=None, generator=None):
    """With top-k, picks one of the k indices at random, each as likely as the others."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits / temperature
    if top_k is None or top_k >= scores.shape[-1]:
        return torch.multinomial(torch.softmax(scores, -1), 1, generator=generator).squeeze(-1)
    indices = torch.topk(scores, top_k, dim=-1).indices
    choice = torch.randint(0, top_k, (scores.shape[0], 1), generator=generator)
    return indices.gather(-1, choice).squeeze(-1)


def _sample_top_1_unfiltered(logits, *, temperature=1.0, top_k=None, generator=None):
    """Takes top_k=1 for "nothing to filter" and samples from every token."""
    return _sampler_with()(logits, temperature=temperature, generator=generator,
                           top_k=None if top_k == 1 else top_k)


def _sample_dropped_at_min(logits, *, temperature=1.0, top_k=None, generator=None):
    """Sets the dropped logits to the row's smallest logit instead of -inf."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits / temperature
    if top_k is not None:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = torch.where(scores < kth, scores.min(-1, keepdim=True).values, scores)
    return torch.multinomial(torch.softmax(scores, -1), 1, generator=generator).squeeze(-1)


def _sample_logits_as_weights(logits, *, temperature=1.0, top_k=None, generator=None):
    """No softmax: the logits divided by their sum as the probabilities (negative ones too)."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits / temperature
    probs = scores / scores.sum(-1, keepdim=True)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _loss_per_token(logits, ids):
    b, s, v = logits.shape
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1),
                                reduction="none")
    return per_token.view(b, s - 1)


def _loss_unflattened(logits, ids):
    return F.cross_entropy(logits[:, :-1], ids[:, 1:])


WRONG = {
    nb12.check_init_model_params: [
        Wrong("tied LM head", _init_with(tied=True), "12.init_model_params.tied_lm_head"),
        Wrong("lm_head [V, H]", _init_with(head_shape=lambda cfg: (cfg.vocab_size,
                                                                    cfg.hidden_size)),
              "12.init_model_params.lm_head_v_by_h"),
        Wrong("lm_head [H, H] like W_O", _init_with(head_shape=lambda cfg: (cfg.hidden_size,
                                                                             cfg.hidden_size)),
              "12.init_model_params.lm_head_shaped_like_wo"),
        Wrong("no lm_head at all", _init_no_head, "12.init_model_params.no_lm_head"),
        Wrong("[block] * L", _init_with(blocks="repeated"),
              "12.init_model_params.blocks_share_weights"),
        Wrong("every block from a fixed seed", _init_with(blocks="seeded"),
              "12.init_model_params.blocks_share_weights"),
        Wrong("L - 1 blocks", _init_with(layers_delta=-1),
              "12.init_model_params.wrong_number_of_blocks"),
        Wrong("layers as a tuple", _init_with(as_tuple=True),
              "12.init_model_params.layers_not_a_list"),
        Wrong("final norm at zero", _init_with(final_norm=torch.zeros),
              "12.init_model_params.norm_at_zero"),
        Wrong("embedding with std 1", _init_with(embed_std=1.0), "12.init_model_params.std_one"),
        Wrong("generator not passed to the blocks", _init_with(pass_gen=False),
              "12.init_model_params.generator_not_passed_to_blocks"),
        Wrong("dtype not passed to the blocks", _init_with(pass_dtype=False),
              "12.init_model_params.dtype_not_passed_to_blocks"),
        Wrong("new Generator() when None", _init_with(none_gen=torch.Generator),
              "12.init_model_params.new_generator_when_none"),
        Wrong("one torch.ones for every norm", _init_one_ones,
              "12.init_model_params.one_tensor_two_names"),
        Wrong("blocks by hand with wq, wk, wv", _init_changed(_blocks_by_hand),
              "12.init_model_params.block_not_from_init_block_params"),
        Wrong("final norm without dtype", _init_with(final_norm=lambda h, dtype: torch.ones(h)),
              "12.init_model_params.dtype_ignored"),
        Wrong("embedding [H, V]", _init_changed(_embed_drawn(
            lambda shape, g: torch.randn(shape[::-1], generator=g) * 0.02)),
              "12.init_model_params.embedding_transposed"),
        Wrong("final norm named norm", _init_changed(_renamed("final_norm", "norm")),
              "12.init_model_params.final_norm_named_otherwise"),
        Wrong("blocks named blocks", _init_changed(_renamed("layers", "blocks")),
              "12.init_model_params.layers_named_otherwise"),
        Wrong("embedding named tok_embeddings", _init_changed(_renamed("embed", "tok_embeddings")),
              "12.init_model_params.other_names"),
        Wrong("final norm of torch.rand", _init_with(
            final_norm=lambda h, dtype: torch.rand(h, dtype=dtype)),
              "12.init_model_params.norm_not_one"),
        Wrong("final norm [1, H]", _init_with(
            final_norm=lambda h, dtype: torch.ones(1, h, dtype=dtype)),
              "12.init_model_params.norm_not_a_vector"),
        Wrong("embedding with std 0.2", _init_with(embed_std=0.2),
              "12.init_model_params.wrong_std"),
        Wrong("embedding of torch.normal(0.02, 0.02)", _init_changed(_embed_drawn(
            lambda shape, g: torch.normal(0.02, 0.02, shape, generator=g))),
              "12.init_model_params.nonzero_mean"),
        # torch.empty's memory holds whatever was there; NaN here, so that every run sees it
        Wrong("embedding torch.empty never filled (NaN)", _init_changed(_embed_drawn(
            lambda shape, g: torch.full(shape, float("nan")))),
              "12.init_model_params.uninitialised_memory"),
        Wrong("Generator().seed() when None", _init_with(none_gen=_os_seeded_generator),
              "12.init_model_params.none_not_global_generator"),
    ],
    nb12.check_model_forward: [
        Wrong("final norm after the LM head", _forward_norm_after_head,
              "12.model_forward.norm_after_lm_head"),
        Wrong("positions -= positions.min()", _forward_positions_from_zero_in_place,
              "12.model_forward.input_changed_in_place"),
        Wrong("reuses the last logits for the same shape", _ForwardReusingLastResult(),
              "12.model_forward.last_token_unused"),
        Wrong("no final norm", _forward_with(final_norm=False), "12.model_forward.no_final_norm"),
        Wrong("final norm eps ignored", _forward_with(eps=False),
              "12.model_forward.final_norm_eps_ignored"),
        Wrong("tied LM head", _forward_with(tied=True), "12.model_forward.embedding_as_lm_head"),
        Wrong("first block only", _forward_with(blocks=lambda ls: ls[:1]),
              "12.model_forward.first_block_only"),
        Wrong("every block fed the embeddings", _forward_with(reset=True),
              "12.model_forward.last_block_only"),
        Wrong("blocks reversed", _forward_with(blocks=lambda ls: ls[::-1]),
              "12.model_forward.blocks_reversed"),
        Wrong("block 0 repeated", _forward_with(blocks=lambda ls: [ls[0]] * len(ls)),
              "12.model_forward.first_block_repeated"),
        Wrong("embeddings scaled by sqrt(H)", _forward_with(embed_scale=True),
              "12.model_forward.embeddings_scaled"),
        Wrong("positions ignored", _forward_with(use_positions=False),
              "12.model_forward.positions_ignored"),
        Wrong("first row of positions", _forward_with(first_row=True),
              "12.model_forward.first_row_of_positions"),
        Wrong("final norm after every block", _forward_with(norm_every=True),
              "12.model_forward.final_norm_after_every_block"),
        Wrong("returns softmax", _forward_with(out=lambda t: t.softmax(-1)),
              "12.model_forward.returned_probabilities"),
        Wrong("returns log_softmax", _forward_with(out=lambda t: t.log_softmax(-1)),
              "12.model_forward.returned_log_probabilities"),
        Wrong("last position only", _forward_with(out=lambda t: t[:, -1]),
              "12.model_forward.last_position_only"),
        Wrong("positions required", _forward_with(require_positions=True),
              "12.model_forward.positions_required"),
        Wrong("default positions from 1", _forward_with(start=1),
              "12.model_forward.default_positions_not_from_zero"),
        Wrong("x @ lm_head.T", _forward_with(head_t=True), "12.model_forward.lm_head_transposed"),
        Wrong("embed = params['embed']", _forward_embed_overwritten,
              "12.model_forward.function_name_overwritten"),
        Wrong("last block skipped", _forward_with(blocks=lambda ls: ls[:-1]),
              "12.model_forward.last_block_skipped"),
        Wrong("no blocks", _forward_with(blocks=lambda ls: []), "12.model_forward.no_blocks"),
        Wrong("@torch.no_grad()", _forward_untrainable("no_grad"),
              "12.model_forward.forward_under_no_grad"),
        Wrong("@torch.inference_mode()", _forward_untrainable("inference_mode"),
              "12.model_forward.forward_under_no_grad"),
        Wrong("blocks under torch.no_grad()", _forward_untrainable("no_grad_blocks"),
              "12.model_forward.forward_under_no_grad"),
        Wrong("embeddings detached", _forward_untrainable("detach"),
              "12.model_forward.gradient_cut"),
        Wrong("params['embed'].data", _forward_untrainable("embed.data"),
              "12.model_forward.gradient_cut"),
        Wrong("params['lm_head'].data", _forward_untrainable("head.data"),
              "12.model_forward.gradient_cut"),
        Wrong("logits through numpy", _forward_untrainable("numpy"),
              "12.model_forward.gradient_cut"),
        Wrong("logits rebuilt with torch.tensor", _forward_untrainable("torch.tensor"),
              "12.model_forward.gradient_cut"),
        Wrong("lm_head.mul_ in place", _forward_untrainable("head_in_place"),
              "12.model_forward.parameter_changed_in_place"),
        Wrong("x.mul_ after the LM head read it", _forward_untrainable("saved_in_place"),
              "12.model_forward.in_place_breaks_backward"),
        Wrong("sqrt at zero in the logits", _forward_untrainable("nan_gradient"),
              "12.model_forward.gradient_not_finite"),
        Wrong("block from chapter 11 with RoPE under no_grad", _forward_rope_without_grad,
              "12.model_forward.forward_under_no_grad"),
        Wrong("block from chapter 11 with q.detach()", _forward_q_detached,
              "12.model_forward.gradient_cut"),
    ],
    nb12.check_next_token_loss: [
        Wrong("no shift", _loss_with(shift="none"), "12.next_token_loss.no_shift"),
        Wrong("shifted the wrong way", _loss_with(shift="wrong"),
              "12.next_token_loss.shifted_the_wrong_way"),
        Wrong("torch.roll", _loss_with(shift="roll"),
              "12.next_token_loss.wrapped_around_with_roll"),
        Wrong("summed", _loss_with(reduction="sum"), "12.next_token_loss.summed"),
        Wrong("mean per sequence, summed over the batch",
              lambda logits, ids: _loss_per_token(logits, ids).mean(-1).sum(),
              "12.next_token_loss.summed_over_batch"),
        Wrong("mean(0, keepdim=True)",
              lambda logits, ids: _loss_per_token(logits, ids).flatten().mean(0, keepdim=True),
              "12.next_token_loss.shape_one"),
        Wrong("divided by B * S", _loss_with(reduction="bs"),
              "12.next_token_loss.divided_by_b_times_s"),
        Wrong("per sequence", _loss_with(reduction="per_seq"),
              "12.next_token_loss.loss_per_sequence"),
        Wrong("per token", _loss_with(reduction="none"), "12.next_token_loss.loss_per_prediction"),
        Wrong("log_softmax over the sequence axis", _loss_with(axis=1),
              "12.next_token_loss.log_softmax_over_sequence"),
        Wrong("log_softmax over the batch axis", _loss_with(axis=0),
              "12.next_token_loss.log_softmax_over_batch"),
        Wrong("forgot the log", _loss_with(log=False), "12.next_token_loss.forgot_the_log"),
        Wrong("no log_softmax at all", _loss_with(softmax=False),
              "12.next_token_loss.no_log_softmax"),
        Wrong("no minus sign", _loss_with(sign=-1.0), "12.next_token_loss.no_minus_sign"),
        Wrong("naive log(exp / sum exp)", _loss_with(stable=False),
              "12.next_token_loss.unstable_for_large_logits"),
        Wrong(".item()", _loss_with(item=True), "12.next_token_loss.returned_python_number"),
        Wrong("rebuilt with torch.tensor", _loss_with(detach=True),
              "12.next_token_loss.not_differentiable"),
        Wrong("log(softmax(x))", _loss_with(log_of_softmax=True),
              "12.next_token_loss.log_of_softmax"),
        Wrong("max subtracted in place", _loss_stabilised_in_place,
              "12.next_token_loss.inputs_changed_in_place"),
        Wrong("F.cross_entropy without flattening", _loss_unflattened,
              "12.next_token_loss.cross_entropy_not_flattened"),
        Wrong("summed over positions", _loss_with(reduction="sum_time"),
              "12.next_token_loss.summed_over_positions"),
    ],
    nb12.check_model_param_count: [
        Wrong("LM head tied/left out", _count_with(head="none"),
              "12.model_param_count.one_vxh_matrix_counted"),
        Wrong("embedding left out", _count_with(embed=0),
              "12.model_param_count.one_vxh_matrix_counted"),
        Wrong("LM head as H x H (W_O)", _count_with(head="wo"),
              "12.model_param_count.lm_head_as_h_by_h"),
        Wrong("no final norm", _count_with(final_norm=0),
              "12.model_param_count.final_norm_left_out"),
        Wrong("a final norm per block", lambda cfg: _count_with()(cfg) + (cfg.n_layers - 1) *
              cfg.hidden_size, "12.model_param_count.final_norm_per_block"),
        Wrong("L - 1 blocks", _count_with(blocks=-1), "12.model_param_count.l_minus_one_blocks"),
        Wrong("L + 1 blocks", _count_with(blocks=1), "12.model_param_count.l_plus_one_blocks"),
        Wrong("MHA blocks under GQA", _count_with(mha=True), "12.model_param_count.mha_blocks"),
        Wrong("LM head bias", _count_with(bias=1), "12.model_param_count.lm_head_bias"),
        Wrong("float", _count_with(as_float=True), "12.model_param_count.returned_float"),
        Wrong("one block", lambda cfg: _count_with(blocks=1 - cfg.n_layers)(cfg),
              "12.model_param_count.one_block"),
        Wrong("blocks without their norms",
              lambda cfg: _count_with()(cfg) - 2 * cfg.hidden_size * cfg.n_layers,
              "12.model_param_count.block_norms_left_out"),
    ],
    nb12.check_sample_next_token: [
        Wrong("Generator().seed() when None", _sample_os_seeded_when_none,
              "12.sample_next_token.none_not_global_generator"),
        Wrong("one of the top k at random", _sample_one_of_top_k,
              "12.sample_next_token.uniform_among_top_k"),
        Wrong("top_k=1 not filtered", _sample_top_1_unfiltered,
              "12.sample_next_token.top_k_1_not_argmax"),
        Wrong("dropped logits set to the row's min", _sample_dropped_at_min,
              "12.sample_next_token.token_outside_top_k"),
        Wrong("logits / their sum as probabilities", _sample_logits_as_weights,
              "12.sample_next_token.nan_probabilities"),
        Wrong("T = 0 divides by zero", _sampler_with(greedy="divide"),
              "12.sample_next_token.divided_by_zero_temperature"),
        Wrong("greedy argmin", _sampler_with(greedy="argmin"),
              "12.sample_next_token.greedy_argmin"),
        Wrong("keepdim [B, 1]", _sampler_with(keepdim=True),
              "12.sample_next_token.returned_b_by_1"),
        Wrong("float tokens", _sampler_with(as_float=True),
              "12.sample_next_token.token_ids_not_int64"),
        Wrong("temperature multiplies", _sampler_with(temp="multiply"),
              "12.sample_next_token.temperature_multiplied"),
        Wrong("temperature ignored", _sampler_with(temp="ignore"),
              "12.sample_next_token.temperature_ignored"),
        Wrong("top_k ignored", _sampler_with(top_k_mode="ignored"),
              "12.sample_next_token.top_k_ignored"),
        Wrong("k smallest", _sampler_with(top_k_mode="smallest"),
              "12.sample_next_token.kept_k_smallest"),
        Wrong("k + 1 kept", _sampler_with(top_k_mode="plus_one"),
              "12.sample_next_token.kept_k_plus_one"),
        Wrong("dropped logits set to 0", _sampler_with(fill=0.0),
              "12.sample_next_token.dropped_logits_set_to_zero"),
        Wrong("uniform draw", _sampler_with(draw="uniform"),
              "12.sample_next_token.uniform_over_vocabulary"),
        Wrong("softmax over the batch axis", _sampler_with(axis=0),
              "12.sample_next_token.uniform_over_vocabulary"),
        Wrong("one uniform for the whole batch", _sampler_with(draw="shared_u"),
              "12.sample_next_token.one_draw_for_all_rows"),
        Wrong("generator ignored", _sampler_with(use_generator=False),
              "12.sample_next_token.generator_ignored"),
        Wrong("torch.distributions.Categorical", _sampler_with(draw="categorical"),
              "12.sample_next_token.generator_ignored"),
        Wrong("fixed seed inside", _sampler_with(fixed_seed=True),
              "12.sample_next_token.fixed_seed_inside"),
        Wrong("logits /= T in place", _sampler_with(in_place=True),
              "12.sample_next_token.logits_changed_in_place"),
        Wrong("exactly k tokens (ties dropped)", _sampler_with(top_k_mode="exact_k"),
              "12.sample_next_token.ties_dropped"),
        Wrong("masked with <=", _sampler_with(top_k_mode="le"),
              "12.sample_next_token.kept_k_minus_one"),
        Wrong("row 0's threshold for every row", _sampler_with(top_k_mode="row0"),
              "12.sample_next_token.one_threshold_for_the_batch"),
        Wrong("topk values[..., -1] without keepdim", _sampler_with(top_k_mode="no_keepdim"),
              "12.sample_next_token.threshold_without_keepdim"),
        Wrong("top_k not clamped to |V|", _sampler_with(top_k_mode="no_clamp"),
              "12.sample_next_token.top_k_larger_than_vocabulary"),
        Wrong("argmax over the batch axis", _sampler_with(greedy="axis0"),
              "12.sample_next_token.argmax_over_batch_axis"),
        Wrong("generator dropped in the top-k branch", _sampler_variant(generator_in_top_k=False),
              "12.sample_next_token.generator_ignored"),
        Wrong("softmax by hand, exp / sum", _sampler_variant(softmax="naive"),
              "12.sample_next_token.softmax_overflows_for_large_logits"),
        Wrong("softmax by hand, one max for the batch", _sampler_variant(softmax="global_max"),
              "12.sample_next_token.softmax_overflows_for_large_logits"),
        Wrong(".squeeze() of a batch of one", _sampler_variant(squeeze="all"),
              "12.sample_next_token.squeezed_batch_of_one"),
        Wrong("top-k over the flattened batch", _sampler_variant(top_k_mode="flat"),
              "12.sample_next_token.top_k_over_flattened_batch"),
        Wrong("probabilities divided by T", _sampler_variant(temp="after"),
              "12.sample_next_token.temperature_after_softmax"),
        Wrong("probabilities divided by T, renormalised",
              _sampler_variant(temp="after_renormalised"),
              "12.sample_next_token.temperature_after_softmax"),
        Wrong("temperature applied twice", _sampler_variant(temp="twice"),
              "12.sample_next_token.temperature_applied_twice"),
        Wrong("logits divided by sqrt(T)", _sampler_variant(temp="sqrt"),
              "12.sample_next_token.temperature_square_root"),
        Wrong("temperature only without top_k", _sampler_variant(temp="only_without_top_k"),
              "12.sample_next_token.temperature_ignored"),
        Wrong("new torch.Generator() when None", _sampler_variant(none="fresh"),
              "12.sample_next_token.new_generator_when_none"),
        Wrong("seeded generator when None", _sampler_variant(none="seeded"),
              "12.sample_next_token.new_generator_when_none"),
        Wrong("position among the top k returned", _sampler_variant(top_k_mode="position"),
              "12.sample_next_token.returned_position_among_top_k"),
        Wrong("argmax of the probabilities at T > 0", _sampler_variant(draw="argmax"),
              "12.sample_next_token.greedy_at_every_temperature"),
        Wrong("top_k clamped to |V| - 1", _sampler_variant(top_k_mode="v_minus_one"),
              "12.sample_next_token.token_dropped_when_top_k_covers_vocabulary"),
    ],
}


def _loss_by_cross_entropy(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


# The correct answers: the reference (a copy), and the catalogue's own builders with nothing
# changed (each diagnosis above comes from the one change a wrong one makes)
CORRECT = {
    nb12.check_init_model_params: {"reference": REFERENCE[nb12.check_init_model_params],
                                   "learner_style": _init_with()},
    nb12.check_model_forward: {"reference": REFERENCE[nb12.check_model_forward],
                               "learner_style": _forward_with()},
    nb12.check_next_token_loss: {"reference": REFERENCE[nb12.check_next_token_loss],
                                 "learner_style": _loss_with(),
                                 "F.cross_entropy": _loss_by_cross_entropy},
    nb12.check_model_param_count: {"reference": REFERENCE[nb12.check_model_param_count],
                                   "learner_style": _count_with()},
    nb12.check_sample_next_token: {"reference": REFERENCE[nb12.check_sample_next_token],
                                   "learner_style": _sampler_with(),
                                   "step_by_step": _sampler_variant(),
                                   "softmax(l) ** (1/T)": _sampler_variant(temp="power"),
                                   "top-k indices kept":
                                       _sampler_variant(top_k_mode="indices_mask"),
                                   ".flatten()": _sampler_variant(squeeze="flatten")},
}
EXERCISES = exercises(CORRECT, WRONG)


# ---- the statistics of the sampling check ------------------------------------------------------

def test_frequency_tolerance_bounds_the_failure_probability():
    """Hoeffding per token, union over every token of every compared distribution: a correct
    sampler fails a run with probability <= 1e-10."""
    t = nb12.TOL
    events = nb12.MAX_VOCAB * nb12.MAX_COMPARISONS
    assert events * 2 * math.exp(-2 * nb12.N_SAMPLES * t * t) <= nb12.FAILURE_PROBABILITY * 1.0001
    assert t < 0.02   # tight enough that every mistake above moves some token by far more


def test_sampling_check_compares_at_most_max_comparisons(monkeypatch):
    """The union bound counts MAX_COMPARISONS distributions of at most MAX_VOCAB tokens."""
    seen = []
    original = nb12_sampling.expect_distribution

    def counting(c, samples, probs, wrong, label, **kwargs):
        seen.append(probs.numel())
        return original(c, samples, probs, wrong, label, **kwargs)

    monkeypatch.setattr(nb12_sampling, "expect_distribution", counting)
    for thorough in (False, True):
        seen.clear()
        nb12.check_sample_next_token(REFERENCE[nb12.check_sample_next_token], seed=11,
                                     thorough=thorough)
        assert 0 < len(seen) <= nb12.MAX_COMPARISONS and max(seen) <= nb12.MAX_VOCAB


@pytest.mark.parametrize("seed", range(100, 112))
def test_samplers_pass_at_many_seeds(seed):
    """Three different correct samplers (multinomial, Gumbel-max, inverse CDF) pass at any seed."""
    def inverse_cdf(logits, *, temperature=1.0, top_k=None, generator=None):
        if temperature == 0:
            return logits.argmax(-1)
        probs = ref_model.next_token_probs(logits, temperature=temperature, top_k=top_k)
        u = torch.rand(logits.shape[0], 1, generator=generator, dtype=torch.float64)
        cdf = probs.cumsum(-1)
        return (cdf < u * cdf[:, -1:]).sum(-1).clamp(max=logits.shape[-1] - 1)

    for sampler in (_sampler_with(), REFERENCE[nb12.check_sample_next_token], inverse_cdf):
        assert_passes(nb12.check_sample_next_token, sampler, seed)


# ---- the reference itself -----------------------------------------------------------------------

def test_reference_param_count_closed_form():
    h, v, l = 4096, 32000, 32
    assert ref_model.model_param_count(LLAMA2_7B) == 6_738_415_616
    assert ref_model.model_param_count(LLAMA2_7B) == \
        2 * v * h + l * (4 * h * h + 3 * h * 11008 + 2 * h) + h
    gqa = dataclasses.replace(LLAMA2_7B, n_kv_heads=8)
    assert ref_model.model_param_count(gqa) == 6_738_415_616 - 32 * 2 * 4096 * (4096 - 1024)


def test_reference_init_matches_its_count_and_layout():
    cfg = ModelConfig(vocab_size=70, hidden_size=24, n_heads=6, n_kv_heads=2, ffn_hidden_size=50,
                      n_layers=3)
    p = ref_model.init_model_params(cfg, generator=torch.Generator().manual_seed(0))
    n = sum(t.numel() for t in [p["embed"], p["final_norm"], p["lm_head"]]) + \
        sum(t.numel() for layer in p["layers"] for t in layer.values())
    assert n == ref_model.model_param_count(cfg)
    with torch.device("meta"):
        big = ref_model.init_model_params(LLAMA2_7B)
    assert sum(t.numel() for t in [big["embed"], big["final_norm"], big["lm_head"]]) + \
        sum(t.numel() for layer in big["layers"] for t in layer.values()) == 6_738_415_616


def test_reference_forward_is_causal_and_batch_independent():
    cfg = ModelConfig(vocab_size=50, hidden_size=24, n_heads=6, n_kv_heads=3, ffn_hidden_size=40,
                      n_layers=2)
    gen = torch.Generator().manual_seed(1)
    p = ref_model.init_model_params(cfg, generator=gen)
    p["layers"] = [{k: t * 20 if "norm" not in k else t for k, t in layer.items()}
                   for layer in p["layers"]]
    ids = torch.randint(0, 50, (3, 6), generator=gen)
    out = ref_model.model_forward(ids, p, cfg)
    changed = ids.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % 50
    torch.testing.assert_close(ref_model.model_forward(changed, p, cfg)[:, :4], out[:, :4])
    torch.testing.assert_close(ref_model.model_forward(ids[1:2], p, cfg), out[1:2])
    # explicit positions arange(S), [S] and [B, S], equal the default
    torch.testing.assert_close(ref_model.model_forward(ids, p, cfg, torch.arange(6)), out)
    torch.testing.assert_close(
        ref_model.model_forward(ids, p, cfg, torch.arange(6).expand(3, 6)), out)


def test_reference_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[2, 0, 1]])
    # position 0 predicts token 0 (p = e^2 / (e^2 + 2)), position 1 token 1 (p = e / (e + 2))
    want = ((math.log(math.exp(2) + 2) - 2) + (math.log(math.e + 2) - 1)) / 2
    assert abs(float(ref_model.next_token_loss(logits, ids)) - want) < 1e-6


def test_reference_sampler_properties():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.0, -2.0, 5.0, 1.0]])
    assert ref_model.sample_next_token(logits, temperature=0).tolist() == [1, 2]
    g = torch.Generator().manual_seed(0)
    draws = ref_model.sample_next_token(logits.repeat(5000, 1), top_k=2, generator=g)
    assert set(draws[0::2].tolist()) == {1, 2} and set(draws[1::2].tolist()) == {2, 3}
    with pytest.raises(ValueError):
        ref_model.sample_next_token(logits, temperature=-1.0)
    # Gumbel-max draws from softmax(logits / T): compare with the exact distribution
    g = torch.Generator().manual_seed(1)
    row = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])
    draws = ref_model.sample_next_token(row.expand(200_000, 5), temperature=1.7, generator=g)
    freq = torch.bincount(draws, minlength=5).double() / 200_000
    assert (freq - torch.softmax(row.double() / 1.7, -1)).abs().max() < 0.01


# --------------------------------------------------------------------------------------------
# The chapter's last section: the solutions' model on SmolLM2's real weights (skipped when the
# model's package is not installed)


@pytest.fixture(scope="module")
def smol():  # the real model: the tests that use it are marked slow
    from checks import smollm

    if not smollm.available():
        pytest.skip(f"SmolLM2 is not installed ({smollm.INSTALL})")
    params, cfg = smollm.load()
    return params, cfg, smollm.tokenizer()


@pytest.mark.slow
def test_solutions_model_answers_the_chapters_question(smol):
    """Greedy decoding with the solution's model_forward and sample_next_token, the prompt encoded
    by chapter 12's bpe_encode, as the chapter's cell does it."""
    from checks import smollm

    from ..support.solutions import solution_namespace

    ns = solution_namespace("12_lm_head_logits")
    params, cfg, tok = smol
    question = "What is the capital of France?"
    prompt = tok.encode(smollm.chat_text(question), bpe_encode=ns["bpe_encode"])
    assert prompt == tok.chat_prompt(question)
    tokens = torch.tensor([prompt])
    for _ in range(12):
        last = ns["model_forward"](tokens, params, cfg)[:, -1]
        tokens = torch.cat([tokens, ns["sample_next_token"](last, temperature=0.0)[:, None]], 1)
        if tokens[0, -1] == tok.im_end_id:
            break
    assert tok.decode(tokens[0, len(prompt):].tolist()) == (
        "The capital of France is Paris.<|im_end|>")


@pytest.mark.slow
def test_real_model_lm_head_is_tied_and_counted_once(smol):
    params, cfg, _ = smol
    table, head = params["embed"], params["lm_head"]
    assert head.data_ptr() == table.data_ptr() and torch.equal(head, table.T)
    tensors = [table, head, params["final_norm"],
               *(t for layer in params["layers"] for t in layer.values())]
    stored = sum({t.data_ptr(): t.numel() for t in tensors}.values())
    assert stored == ref.model_param_count(cfg) - cfg.vocab_size * cfg.hidden_size == 134_515_008


def test_chapter_12_reads_in_chinese(monkeypatch):
    from checks.environment import LANG_ENV
    from checks.engine import CheckFailure
    monkeypatch.setenv(LANG_ENV, "zh")
    wrong = {w.name: w for ex in EXERCISES for w in ex.wrong}
    text = failure_text(nb12.check_next_token_loss, wrong["summed"].fn)
    assert "可能的错误：求和而不是求平均" in text and "损失（logits" in text, text
    assert "likely mistake" not in text and "wrong values" not in text
    with pytest.raises(CheckFailure) as info:
        nb12.check_sample_next_token(wrong["temperature ignored"].fn, seed=1)
    assert "次抽取中 token" in str(info.value) and "忽略了温度" in str(info.value), str(info.value)
