"""The mistakes chapter 13's checks of the cache and of generation name (checks.mistakes): each
declared once, in the words a failure shows; the roofline's are in checks/nb13/roofline.py.

A mistake's id is "13.<exercise>.<key>": the same declaration named by two exercises' checks
(`NO_OFFSET` by forward_with_cache and by generate) gives one id per exercise.
"""

from __future__ import annotations

from ..i18n import N_
from ..mistakes import Mistake

# --------------------------------------------------------------------------------------------
# KVCache: what the cache allocates

NOT_PREALLOCATED = Mistake("nothing_preallocated", N_(
    "the cache allocated no tensors when it was created: preallocate each layer's K and V, [B, "
    "N_kv, max_seq_len, D_h], in __init__ (torch.zeros), and write into them; growing the cache "
    "with torch.cat copies every cached key at every step"))
REPEATED_HEADS_ALLOC = Mistake("stores_repeated_heads", N_(
    "the cache holds N_h heads: it stores the N_kv KV heads only (not repeated for every query "
    "head); that is the whole memory saving of GQA (chapter 06)"))
CFG_MAX_LEN = Mistake("sized_by_cfg_max_seq_len", N_(
    "sized the cache with cfg.max_seq_len; use the max_seq_len argument (a generation needs only "
    "P + max_new_tokens positions)"))
ONE_LAYER = Mistake("allocated_one_layer_only", N_(
    "allocated K and V for one layer only: every layer keeps its own cache"))
K_ONLY = Mistake("no_separate_v_buffer", N_(
    "allocated room for K only (or K and V sharing a buffer): K and V are stored separately"))
KV_SHARE_BUFFER = Mistake("k_and_v_share_one_buffer", N_(
    "K and V share one buffer: writing V overwrote the keys just written (update returned the "
    "same tensor for both); allocate a K buffer and a V buffer for every layer"))
DTYPE_IGNORED = Mistake("ignores_dtype", N_(
    "ignored the dtype argument: allocate the buffers with dtype=dtype"))
SUBCLASSES_REFERENCE = Mistake("subclasses_reference", N_(
    "write the cache yourself: preallocated tensors and an update method"))
NO_UPDATE_METHOD = Mistake("no_update_method", N_(
    "define `def update(self, layer_idx, k, v, start_pos)` in the class"))

# KVCache.update: where it writes, what it returns

COPY = Mistake("returns_copies", N_(
    "returned a copy ({what} lives in new memory), not a view of the preallocated buffer: slice "
    "it, `buffer[:, :, :start_pos + T]`; torch.cat, .clone() or indexing with a list copies every "
    "cached position at every step"))
REALLOCATED = Mistake("replaces_buffers_in_update", N_(
    "replaced its buffers during update (new tensors after the call): write into the "
    "preallocated tensors in place (`buffer[:, :, start_pos:start_pos + T] = k`)"))
OFFSET_PLUS_ONE = Mistake("writes_one_position_too_far", N_(
    "wrote the new K/V one position too far (at start_pos + 1): the T new tokens occupy positions "
    "start_pos .. start_pos+T-1"))
AT_ZERO = Mistake("writes_at_position_zero", N_(
    "wrote the new K/V at position 0 every time: write them at start_pos .. start_pos+T-1"))
OWN_COUNTER = Mistake("own_length_counter", N_(
    "kept a length counter of its own and ignored start_pos: the caller says where the new tokens "
    "go (which also lets it overwrite, to rewind a generation)"))
SHARED_COUNTER = Mistake("one_counter_for_all_layers", N_(
    "advanced one position counter on every update, for all layers together: all L layers write "
    "the same positions start_pos .. start_pos+T-1, each in its own buffer"))
SHARED_BUFFER = Mistake("layers_share_one_buffer", N_(
    "all layers share one buffer: each layer needs its own K and V"))
NEW_ONLY = Mistake("returns_new_kv_only", N_(
    "returned only the new K/V ([B, N_kv, T, D_h]): return every position so far, 0 .. "
    "start_pos+T-1, which the new queries attend to"))
WHOLE_BUFFER = Mistake("returns_whole_buffer", N_(
    "returned the whole preallocated buffer (max_seq_len positions, empty slots included): slice "
    "it to the filled part, 0 .. start_pos+T-1"))
UP_TO_START = Mistake("returns_positions_before_start", N_(
    "returned positions 0 .. start_pos-1, without the tokens just written"))
ONE_SHORT = Mistake("returns_one_position_short", N_(
    "returned one position too few: positions 0 .. start_pos+T-1 are start_pos+T of them"))
SWAPPED = Mistake("returns_values_and_keys_swapped", N_(
    "returned (values, keys): update returns (k_all, v_all), keys first"))
V_NOT_WRITTEN = Mistake("v_not_written", N_(
    "wrote the new K into the cache but not the new V: v_all holds what the V buffer held before "
    "(zeros); write v at start_pos .. start_pos+T-1 of the layer's V buffer too"))
RETURNS_REPEATED = Mistake("returns_repeated_heads", N_(
    "returned K/V repeated for every query head (N_h heads): update returns the cache's N_kv KV "
    "heads as they are stored, and grouped_query_attention shares them among the query heads by "
    "itself"))
OVERFLOW_IGNORES_T = Mistake("overflow_check_ignores_t", N_(
    "raised ValueError only when start_pos itself is past the end: a chunk of T new tokens "
    "overflows as soon as start_pos + T > max_seq_len, so check the end of the chunk, not its "
    "start"))
NO_OVERFLOW = Mistake("no_overflow_check", N_(
    "wrote past max_seq_len without raising: check `start_pos + T > max_seq_len` and raise "
    "ValueError (slicing silently stops at the end of the buffer)"))
WRONG_ERROR = Mistake("wrong_overflow_error", N_(
    "raised {name} on overflow; raise ValueError with a message that names the positions and "
    "max_seq_len"))
FULL_IS_FINE = Mistake("raises_when_exactly_full", N_(
    "raised an error when writing exactly up to the last position: the cache holds positions 0 .. "
    "max_seq_len-1, so only start_pos + T > max_seq_len overflows (use `>`, not `>=`)"),
    raises=[("ValueError", None)])

# --------------------------------------------------------------------------------------------
# forward_with_cache

NO_OFFSET = Mistake("decode_positions_not_offset", N_(
    "decode positions not offset: rotated the new tokens by positions 0 .. T-1 (torch.arange(T)); "
    "they sit at start_pos .. start_pos+T-1, so positions = torch.arange(start_pos, start_pos + "
    "T)"))
TOP_LEFT = Mistake("top_left_mask", N_(
    "causal mask top-left aligned (`causal_mask(T)` or `tril(ones(T, S_k))`): the T new queries "
    "are the LAST T of the start_pos+T keys, so query i sits at position start_pos + i; use the "
    "bottom-right mask causal_mask(T, start_pos + T)"))
SQUARE_NEW = Mistake("square_mask_of_new_tokens", N_(
    "built the mask with causal_mask(T): a [T, T] square, while the T new queries meet start_pos "
    "+ T keys (the scores are [T, start_pos + T]); use the bottom-right causal_mask(T, start_pos "
    "+ T). A decode step hides the mistake: there a [1, 1] mask broadcasts"))
SQUARE_ALL = Mistake("square_mask_of_all_keys", N_(
    "built the mask with causal_mask(start_pos + T): one row per key, while only the T new tokens "
    "are queries (the scores are [T, start_pos + T]); use the bottom-right causal_mask(T, "
    "start_pos + T)"))
SQUARE_EITHER = Mistake("square_mask", N_(
    "a square causal mask against a longer cache (causal_mask(T) or causal_mask(start_pos + T)): "
    "the scores of T new queries against the start_pos + T keys are [T, start_pos + T]; use "
    "causal_mask(T, start_pos + T)"))
NO_MASK = Mistake("no_causal_mask", N_(
    "no causal mask: within a chunk of several new tokens each may attend only up to its own "
    "position; pass causal_mask(T, start_pos + T)"))
IGNORED_CACHE = Mistake("ignores_the_cache", N_(
    "ignored the cache: attended to the new tokens' own K and V only; attend to the (k_all, "
    "v_all) that cache.update returns, every position so far"))
UNROTATED_STORED = Mistake("cache_stores_k_before_rope", N_(
    "the cache stores K before RoPE: rotate K by its positions first, then store it (the rotated "
    "keys never change, so each is rotated exactly once)"))
UNROTATED_RECOMPUTED = Mistake("cache_stores_k_before_rope_rotates_again", N_(
    "the cache stores K before RoPE (and every cached key is rotated again at every step): rotate "
    "the new K first, then store it; cached keys are already rotated and are used as they are"))
POSITIONS_PLUS_ONE = Mistake("positions_one_too_far", N_(
    "rotated the new tokens by positions start_pos + 1 .. start_pos + T, one too far (positions "
    "counted from 1): attention sees only differences of positions, so the logits hide it, but "
    "the cache holds every key rotated by the wrong position; positions = "
    "torch.arange(start_pos, start_pos + T)"))
LAST_ONLY = Mistake("returns_last_position_only", N_(
    "returned the logits of the last position only ([B, 1, V]): forward_with_cache returns the "
    "logits of all T new tokens, [B, T, V]; generate picks the last one itself"))
SCALE_BY_H = Mistake("scaled_by_sqrt_h", N_(
    "scaled the scores by 1/sqrt(H) (cfg.hidden_size), the width of the whole model; each head "
    "scales its scores by 1/sqrt(D_h), its own width (cfg.head_dim)"))
REPEATED_HEADS = Mistake("cache_gets_repeated_heads", N_(
    "passed K/V with N_h heads (repeated for every query head) to cache.update: the cache stores "
    "the N_kv KV heads only, and grouped_query_attention shares them among the query heads by "
    "itself"))
NOT_HEADS_FIRST = Mistake("kv_not_heads_first", N_(
    "pass K and V heads-first, [B, N_kv, T, D_h] (split_qkv gives that layout)"))
UPDATE_START = Mistake("update_at_wrong_start_pos", N_(
    "the new tokens' K and V go to positions start_pos .. start_pos+T-1: pass the start_pos you "
    "were given"))
LAYER_NOT_CACHED = Mistake("layer_not_cached", N_(
    "layer {layer}'s K and V never reached the cache: call cache.update(layer_idx, k, v, "
    "start_pos) once in every layer"))
UPDATE_TWICE = Mistake("update_not_once_per_layer", N_(
    "call cache.update once per layer and call"))

# --------------------------------------------------------------------------------------------
# generate

NOT_ADVANCED = Mistake("start_pos_not_advanced", N_(
    "cache not advanced: every decode step used start_pos = P, so each new token overwrote the "
    "previous one's slot; the token generated at step t sits at position P + t"))
SKIPPED_SLOT = Mistake("start_pos_one_too_far", N_(
    "start_pos one too far in the decode steps (P + t + 1): the token generated at step t sits at "
    "position P + t, the slot right after the previous one"))
FIRST_POSITION = Mistake("logits_of_first_position", N_(
    "took the logits of the first position after the prefill: the next token comes from the LAST "
    "position's logits, logits[:, -1]"))
RECOMPUTED = Mistake("recomputes_whole_sequence", N_(
    "recomputed the whole sequence each step: with use_cache=True, feed only the newest token "
    "(one per sequence) at start_pos = its position; the cache holds the keys and values of "
    "everything before it"))
UNCACHED_USES_CACHE = Mistake("uncached_path_uses_the_cache", N_(
    "with use_cache=False it still used the cache (fed only the newest token at each step): "
    "without the cache, every step runs the model over the whole sequence so far (P, P + 1, ..., "
    "P + n - 1 tokens per sequence), the slow path the cache is measured against"))
DECODE_IDS_1D = Mistake("decode_tokens_without_sequence_axis", N_(
    "fed a decode step's new tokens as [B] (tokens[:, -1]), without the sequence axis: "
    "forward_with_cache takes token_ids [B, T], so a decode step feeds tokens[:, -1:], [B, 1]"),
    raises=[("IndexError", r"tuple index out of range"),
            ("ValueError", r"not enough values to unpack \(expected 2, got 1\)")])
PREFILL_BY_TOKEN = Mistake("prefill_one_token_at_a_time", N_(
    "pushed the prompt through one token at a time: prefill runs the whole prompt in one call, "
    "forward_with_cache(prompt_ids, ..., start_pos=0)"))
NEW_TOKENS_ONLY = Mistake("returns_new_tokens_only", N_(
    "returned only the new tokens: return the prompt followed by them, [B, P + n]"))
WASTED_FORWARD = Mistake("forward_after_last_token", N_(
    "fed the last new token back through the model: its logits are never used, so that forward "
    "pass is wasted (a whole pass over every weight); n new tokens need the prefill and n - 1 "
    "decode steps; stop the loop once the last token is chosen"))
WASTED_FORWARD_UNCACHED = Mistake("uncached_forward_after_last_token", N_(
    "fed the last new token back through the model: its logits are never used, so that pass is "
    "wasted; without the cache, n new tokens need n passes (over P, P + 1, ..., P + n - 1 "
    "tokens)"))
ONE_TOO_MANY = Mistake("one_token_too_many", N_("generated max_new_tokens + 1 tokens"))
ONE_TOO_FEW = Mistake("one_token_too_few", N_("generated max_new_tokens - 1 tokens"))
PROMPT_CHANGED = Mistake("changes_prompt_in_place", N_("write the tokens into a new tensor"))
EMBED_NOT_SEEN = Mistake("embedding_not_read_from_params", N_(
    "look the tokens up with params['embed'][token_ids] or F.embedding(token_ids, "
    "params['embed']) (or chapter 02's embed), which the check can count"))
FORWARD_FOR_NOTHING = Mistake("forward_for_zero_tokens", N_(
    "with nothing to generate, no forward pass is needed: return the prompt"))
GENERATOR_IGNORED = Mistake("generator_not_passed_on", N_(
    "pass `generator` on to the sampler (sample_next_token(..., generator=generator)); the global "
    "random state must not matter"))
TEMPERATURE_IGNORED = Mistake("temperature_not_passed_on", N_(
    "pass `temperature` on to the sampler: temperature 0 is greedy, above 0 it samples from "
    "softmax(logits / temperature)"))

# generate, sampling (temperature > 0): the draws compared with the model's own
# softmax(logits / T), step by step, with and without the cache

SOFTMAX_TWICE = Mistake("softmax_of_probabilities", N_(
    "sampled from a softmax of probabilities (softmax applied twice, or the probabilities handed "
    "to a sampler that takes logits): the draws come out almost uniform over the vocabulary; "
    "pass the logits (divided by the temperature) to ONE softmax, or the logits themselves to "
    "sample_next_token"))
TEMPERATURE_TWICE = Mistake("temperature_applied_twice", N_(
    "divided the logits by the temperature twice (logits / T handed to a sampler that divides by "
    "T again): the draws follow softmax(logits / T²); divide once, or pass the raw logits and "
    "temperature=T to sample_next_token"))
TEMPERATURE_NOT_APPLIED = Mistake("sampled_at_temperature_one", N_(
    "sampled from softmax(logits), as if the temperature were 1 (the temperature was dropped on "
    "this path, or applied after the softmax, where dividing by T changes nothing once the "
    "sampler renormalises): sample from softmax(logits / temperature)"))
TEMPERATURE_MULTIPLIED = Mistake("logits_times_temperature", N_(
    "multiplied the logits by the temperature: a higher temperature must flatten the "
    "distribution, so sample from softmax(logits / temperature)"))
UNSTABLE_SOFTMAX = Mistake("softmax_overflows", N_(
    "the softmax overflowed on large logits (exp(logits / T) is inf beyond about 88 in float32, "
    "and inf / inf is nan): subtract each row's maximum before exp, or use torch.softmax, which "
    "does"),
    raises=[("RuntimeError", r"probability tensor contains either `inf`, `nan` or element < 0")])
GENERATOR_RESEEDED = Mistake("generator_reseeded", N_(
    "re-seeded the generator (manual_seed at every step or call, or a new torch.Generator made "
    "from its seed): two calls with the same generator gave the same tokens, because every "
    "draw starts over from the seed; draw every token from the generator you are given, as it "
    "is, so that it moves on from one draw to the next"))
FIXED_SEED = Mistake("fixed_seed_without_generator", N_(
    "with generator=None two calls gave the same tokens: a generator with a fixed seed (or "
    "torch.manual_seed) stood in for the missing one; when generator is None, pass None on, so "
    "the sampler draws from the global random state and every call differs"))

# KVCache and forward_with_cache: configurations whose sizes are not tied together

CACHE_HEAD_DIM_FROM_H = Mistake("head_dim_from_hidden_size", N_(
    "sized the cache's head dimension as hidden_size // n_heads: a config may set head_dim apart "
    "from H / N_h; use cfg.head_dim"))
FORWARD_HEAD_DIM_FROM_H = Mistake("head_dim_from_hidden_size", N_(
    "split the heads with head_dim = hidden_size // n_heads: a config may set head_dim apart "
    "from H / N_h (Q is [N_h·D_h] wide, not H); use cfg.head_dim"))
ROPE_BASE_FIXED = Mistake("rope_base_ignored", N_(
    "rotated with base 10000 (apply_rope's default, or a fixed number) instead of the config's: "
    "pass base=cfg.rope_base to apply_rope"))
EPS_FIXED = Mistake("norm_eps_ignored", N_(
    "normalised with eps = 1e-5 (rms_norm's default, or a fixed number) instead of the config's: "
    "pass cfg.norm_eps to every rms_norm"))
ROTARY_DIM_IGNORED = Mistake("rotary_dim_ignored", N_(
    "rotated every feature of each head: with rotary_dim < head_dim only the first rotary_dim "
    "features are rotated; pass rotary_dim=cfg.rotary_dim to apply_rope"))
SOFTMAX_OVER_BATCH = Mistake("softmax_over_batch_axis", N_(
    "took the softmax over the batch axis (dim=0) instead of the vocabulary: each row's "
    "probabilities must sum to 1 over its own |V| logits; use softmax(logits / T, dim=-1)"))
BATCH_SQUEEZED = Mistake("batch_axis_squeezed", N_(
    "squeezed away the batch axis: with a batch of one, logits[:, -1].squeeze() (or the next "
    "token's .squeeze()) drops B as well, and the token comes out 0-d; keep [B, |V|] and [B] "
    "(squeeze(-1) or reshape(B, 1) only the axis you mean)"),
    raises=[("IndexError", r"too many indices for tensor of dimension 0"),
            ("IndexError", r"Dimension out of range \\(expected to be in range of \\[-1, 0\\], "
                           r"but got 1\\)")])
