"""The course's reference implementation, written independently of the solution notebooks.

Expected values in the checks come from here. Where torch has a built-in for an operation the
reference uses it (so the learner is compared with PyTorch itself); elsewhere it uses another
formulation than the one the notebooks teach. Later chapters import earlier building blocks from
here, so a learner stuck in one chapter can still finish the next.

One module per topic; each chapter's names are re-exported here under the spec's names.
"""

from .attention import (attention, attention_scores, fuse_qkv_weights, grouped_query_attention,
                        kv_cache_bytes, kv_head_index, masked_softmax, merge_heads,
                        multi_head_attention, project_qkv, repeat_kv, split_heads, split_qkv)
from .masks import (bidirectional_mask, causal_mask, combine_masks, padding_mask,
                    to_additive_mask)
from .notation import head_dim, kv_group_size, tensor_shape, validate_config
from .tokens import (bpe_decode, bpe_encode, bpe_merge, bpe_train, embed, embedding_table_bytes,
                     one_hot, pad_batch, utf8_bytes)
from .positions import (equivariance_error, permutation_matrix, permute_tokens,
                        sinusoidal_positions)
from .rope import (apply_rope, interleaved_to_half_permutation, rope_angles, rope_frequencies,
                   rotate_pairs, rotation_matrix)
from .ffn import ffn, ffn_param_count, gelu, relu, silu, swiglu_ffn
from .norms import layer_norm, post_norm_residual, pre_norm_residual, rms_norm
from .block import attention_sublayer, block_param_count, decoder_block, init_block_params
from .model import (init_model_params, model_forward, model_param_count, next_token_loss,
                    sample_next_token)
from .generation import (KVCache, arithmetic_intensity, decode_step_bytes, forward_with_cache,
                         full_forward, generate, prefill_flops)
from .speculative import (accept_sampled, early_exit_draft, lookup_draft, speculative_generate,
                          verify_draft)
from .training import (adamw_step, bits_per_byte, clip_grad_norm, evaluate, get_batch, lr_at,
                       train_step)
from .serving import (BlockAllocator, PagedKVCache, batched_prefill, pad_left, paged_attention,
                      serve)
