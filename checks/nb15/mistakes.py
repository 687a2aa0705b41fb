"""The mistakes chapter 15's checks name (checks.mistakes), each declared once, in the words a
failure shows. A mistake's id is "15.<exercise>.<key>"."""

from __future__ import annotations

from ..i18n import N_
from ..mistakes import Mistake

REFERENCE_HINT = N_("this exercise asks you to write {name} yourself, not to call the course's "
                    "finished one")

# --------------------------------------------------------------------------------------------
# pad_left

PADDED_RIGHT = Mistake("padded_on_the_right", N_(
    "padded on the right: put the pads before each prompt's tokens, so that every row's last "
    "real token sits in the last column (the next token of every row is then read from the same "
    "column, and decode appends to every row at the same place)"))
POSITIONS_NOT_OFFSET = Mistake("positions_not_offset", N_(
    "the positions count columns, pads included: a left-padded row's first real token is at "
    "position 0 (positions = keep.cumsum(-1) - 1, the pads' clamped to 0); otherwise its keys are "
    "cached at the wrong positions and its decode steps differ from its own unbatched run"))
POSITIONS_FROM_ONE = Mistake("positions_from_one", N_(
    "the positions start at 1: each row's first real token is at position 0"))
KEEP_INVERTED = Mistake("keep_inverted", N_(
    "keep is inverted: True marks the real tokens (they may be attended), False the pads"))
PAD_ID_IGNORED = Mistake("pad_id_ignored", N_(
    "filled the pads with 0 instead of pad_id"))

# --------------------------------------------------------------------------------------------
# batched_prefill

PADS_ATTENDED = Mistake("pads_attended", N_(
    "real tokens attend to the pads before them: combine the causal mask with keep on the keys "
    "(keep[:, None, None, :], chapter 03's padding_mask) so that a pad is never attended"))
POSITIONS_IGNORED = Mistake("positions_ignored", N_(
    "RoPE used 0..T-1 for every row instead of the `positions` argument: the logits survive "
    "(attention scores depend only on distances), but the keys go into the cache rotated for the "
    "wrong positions, and every later decode step attends at the wrong distances (apply_rope "
    "takes positions [B, T])"))
NO_CAUSAL = Mistake("no_causal_mask", N_(
    "no causal mask: every token saw the tokens after it; combine causal_mask(T) with the "
    "padding mask"))
KV_BEFORE_ROPE = Mistake("kv_before_rope", N_(
    "returned K before RoPE: the cache stores K after RoPE (chapter 13), so return the rotated "
    "keys"))
KV_REPEATED = Mistake("kv_heads_repeated", N_(
    "returned K and V with N_h heads: return the N_kv KV heads (not repeated); the cache stores "
    "those"))

# --------------------------------------------------------------------------------------------
# BlockAllocator

BLOCK_TOO_MANY = Mistake("one_block_too_many", N_(
    "took one block too many when the tokens fill their last block exactly: a sequence of n "
    "tokens needs ceil(n / block_size) blocks, (n + block_size - 1) // block_size"))
BLOCK_TOO_FEW = Mistake("one_block_too_few", N_(
    "took one block too few (n // block_size): the tokens that do not fill a whole block still "
    "need one; ceil(n / block_size) blocks"))
GROWS_EARLY = Mistake("new_block_one_token_early", N_(
    "append_token took a new block one token early: a new block is needed only when the last "
    "one is full (length % block_size == 0 before the new token)"))
NEVER_GROWS = Mistake("never_grows", N_(
    "append_token did not take a new block when the last one was full: the new token has no "
    "slot"))
NOT_ATOMIC = Mistake("not_atomic_on_failure", N_(
    "a request that did not fit changed the pool: check that enough blocks are free before "
    "taking any, so that a failed allocate or append_token leaves everything as it was"))
NO_ERROR_WHEN_FULL = Mistake("no_error_when_full", N_(
    "asked for more blocks than are free, it did not raise: raise MemoryError (and change "
    "nothing)"))
WRONG_ERROR = Mistake("wrong_error_when_full", N_(
    "running out of blocks raised {name}: raise MemoryError, so that a scheduler can tell \"the "
    "pool is full\" from a bug"))
FREE_TWICE = Mistake("free_twice_accepted", N_(
    "freeing a sequence twice did not raise: its blocks went back to the pool twice; raise "
    "KeyError for a sequence that holds no blocks"))
FREE_LOSES_BLOCKS = Mistake("free_loses_blocks", N_(
    "free did not give the sequence's blocks back to the pool (num_free did not grow by them)"))
BLOCK_GIVEN_TWICE = Mistake("block_given_twice", N_(
    "handed out a block that another sequence already holds: take blocks from the free ones "
    "only, and remove them from the free list"))

# --------------------------------------------------------------------------------------------
# PagedKVCache

POOL_LAYOUT = Mistake("pool_layout", N_(
    "each layer's pools are [num_blocks, N_kv, block_size, D_h] (chapter 13's cache cut into "
    "blocks along S), one K pool and one V pool per layer"))
POOLS_SHARED = Mistake("one_pool_for_all_layers", N_(
    "the layers share one pool: writing layer 1 overwrote layer 0's keys; allocate a K pool and "
    "a V pool for every layer"))
TABLE_IGNORED = Mistake("block_table_ignored", N_(
    "wrote position p into pool block p // block_size, ignoring the block table: the sequence's "
    "block is block_table[p // block_size]"))
CHUNK_NOT_SPLIT = Mistake("chunk_not_split_at_block_boundary", N_(
    "a chunk that crosses a block boundary ran on into the next block of the pool: the next "
    "block of the sequence is the next entry of its block table; address every position by "
    "itself (block_table[p // block_size], slot p % block_size)"))
READ_POOL_ORDER = Mistake("read_in_pool_order", N_(
    "read the blocks in pool order (sorted block ids): the block table's order is the text's "
    "order, whatever block ids the pool handed out"))
READ_WHOLE_BLOCKS = Mistake("read_ignores_length", N_(
    "read whole blocks: the last block is only partly filled; return the first `length` "
    "positions"))

# --------------------------------------------------------------------------------------------
# paged_attention

ATTN_POOL_ORDER = Mistake("blocks_in_pool_order", N_(
    "gathered the blocks in pool order (sorted block ids): a sequence's keys are in the order of "
    "its block table"))
ATTENDS_PAST_LENGTH = Mistake("attends_past_length", N_(
    "attended to the whole last block: its slots past the sequence's length hold stale numbers "
    "(another sequence's, or nothing yet); mask keys at positions >= length"))
NO_SCALE = Mistake("missing_scale", N_(
    "forgot the scale: divide the scores by sqrt(D_h)"))
HEADS_TILED = Mistake("kv_heads_tiled", N_(
    "query head h read KV head h % N_kv (repeat instead of repeat_interleave): query head h "
    "reads KV head h // G (chapter 06)"))
ONE_TABLE = Mistake("one_table_for_all", N_(
    "used the first sequence's block table (or length) for every sequence: each sequence "
    "attends through its own"))

# --------------------------------------------------------------------------------------------
# serve

STATIC_BATCHING = Mistake("waits_for_batch_to_drain", N_(
    "admitted new requests only when the whole batch had finished (static batching): admit a "
    "waiting request at the first step where a slot and the blocks are free"))
BATCH_TOO_LARGE = Mistake("batch_over_max", N_(
    "ran more than max_batch requests at once: admit while fewer than max_batch run"))
OVER_CAPACITY = Mistake("admits_beyond_capacity", N_(
    "admitted more than the blocks allow: the pool ran out while running requests grew; admit a "
    "request only when the free blocks cover its whole need (blocks_for(len(prompt) + "
    "max_new_tokens - 1)) beyond what the running requests may still take"),
    raises=(("MemoryError", None),))
NEVER_FREES = Mistake("blocks_never_freed", N_(
    "finished requests kept their blocks (allocator.free was not called when they retired): "
    "the pool filled up and the waiting requests starved"))
STALLS = Mistake("stalls", N_(
    "the scheduler stopped making progress: requests waited while nothing ran, or the same step "
    "repeated; each step must admit, decode or retire something"),
    raises=(("SchedulerStalled", None),))
DECODES_FINISHED = Mistake("decodes_finished", N_(
    "decoded a request that had finished (max_new_tokens reached, or stop_id produced): retire "
    "it at the end of the step in which it finished"))
CACHE_NOT_GROWN = Mistake("cache_not_grown", N_(
    "decoded a request without growing its cache first: call allocator.append_token(i) for every "
    "request in the decode batch, before decode (the fed token needs a slot)"))
ONE_BY_ONE = Mistake("decodes_one_by_one", N_(
    "called decode for one request at a time: one decode call for all running requests "
    "together is the whole point (every weight read once per step, not once per request)"))
NOT_FCFS = Mistake("not_first_come_first_served", N_(
    "admitted requests out of order: first come, first served; when the head of the queue does "
    "not fit, stop admitting for this step (or a long request could starve)"))
STARVES = Mistake("starves_waiting", N_(
    "returned before every request was served: keep stepping while requests wait or run"))
STOP_IGNORED = Mistake("stop_id_ignored", N_(
    "went on after a request produced stop_id: a request finishes at max_new_tokens or at "
    "stop_id (kept as its last token), whichever comes first"))
TTFT_FROM_ADMISSION = Mistake("ttft_from_admission", N_(
    "measured the time to first token from the request's admission: every request arrived at "
    "the start, so its wait in the queue counts (ttft = first token's time - start)"))
TPOT_OVER_ALL = Mistake("tpot_over_all_tokens", N_(
    "time per output token divides by all n tokens (or counts from the start): it is (last "
    "token's time - first token's time) / (n - 1), the pace after the first token"))
DECODES_NEW = Mistake("decodes_just_admitted", N_(
    "decoded a request in the same step that prefilled it: its first token comes from the "
    "prefill; it joins the decode batch from the next step"))
