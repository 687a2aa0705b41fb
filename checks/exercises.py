"""The syllabus: which chapter grades which exercise, as declared data.

Every graded exercise `name` of chapter NN has its checker `check_<name>` in the chapter's
package `checks.nbNN` (docs/maintainer/recipes.md, "Add an exercise"); this table lists them in
the order the notebook asks for them. It imports nothing of the chapters (a worker's copy of the
package holds only some of them, and naming an exercise's chapter must not load the whole
course); tests/core/test_layout.py holds every chapter's package to it, checker for checker.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple


class Chapter(NamedTuple):
    number: str  # "04"
    folder: str  # "04_self_attention": the notebook's folder and nbgrader's assignment
    exercises: tuple[str, ...]  # graded names, in the notebook's order

    @property
    def module(self) -> str:
        """The checks' module path: "checks.nb04"."""
        return f"{__package__}.nb{self.number}"


SYLLABUS: tuple[Chapter, ...] = (
    Chapter("01", "01_notation", ("head_dim", "kv_group_size", "validate_config",
                                  "tensor_shape")),
    Chapter("02", "02_tokens_to_embeddings", (
        "utf8_bytes", "bpe_merge", "bpe_train", "bpe_encode", "bpe_decode", "pad_batch", "embed",
        "one_hot", "embedding_table_bytes")),
    Chapter("03", "03_architectures", ("causal_mask", "bidirectional_mask", "padding_mask",
                                       "combine_masks", "to_additive_mask")),
    Chapter("04", "04_self_attention", ("project_qkv", "attention_scores", "masked_softmax",
                                        "attention")),
    Chapter("05", "05_multi_head", ("split_heads", "merge_heads", "fuse_qkv_weights",
                                    "split_qkv", "multi_head_attention")),
    Chapter("06", "06_gqa_mqa", ("kv_head_index", "repeat_kv", "grouped_query_attention",
                                 "kv_cache_bytes")),
    Chapter("07", "07_position_information", ("permute_tokens", "permutation_matrix",
                                              "equivariance_error", "sinusoidal_positions")),
    Chapter("08", "08_rope", ("rope_frequencies", "rope_angles", "rotation_matrix",
                              "rotate_pairs", "apply_rope", "interleaved_to_half_permutation")),
    Chapter("09", "09_ffn_swiglu", ("relu", "gelu", "silu", "ffn", "swiglu_ffn",
                                    "ffn_param_count")),
    Chapter("10", "10_norm_residual", ("layer_norm", "rms_norm", "pre_norm_residual",
                                       "post_norm_residual")),
    Chapter("11", "11_decoder_block", ("init_block_params", "attention_sublayer",
                                       "decoder_block", "block_param_count")),
    Chapter("12", "12_lm_head_logits", ("init_model_params", "model_forward", "next_token_loss",
                                        "model_param_count", "sample_next_token")),
    Chapter("13", "13_generation_kv_cache", ("KVCache", "forward_with_cache", "generate",
                                             "prefill_flops", "decode_step_bytes",
                                             "arithmetic_intensity")),
    Chapter("14", "14_training", ("get_batch", "lr_at", "clip_grad_norm", "adamw_step",
                                  "train_step", "evaluate", "bits_per_byte")),
    Chapter("15", "15_serving", ("pad_left", "batched_prefill", "BlockAllocator", "PagedKVCache",
                                 "paged_attention", "serve")),
    Chapter("16", "16_speculative", ("lookup_draft", "early_exit_draft", "verify_draft",
                                     "speculative_generate", "accept_sampled")),
)

_BY_NUMBER = {chapter.number: chapter for chapter in SYLLABUS}
_CHAPTER_OF = {name: chapter.number for chapter in SYLLABUS for name in chapter.exercises}


def chapters() -> dict[str, tuple[str, ...]]:
    """{"04": ("project_qkv", "attention_scores", ...), ...}: each chapter's exercises, in the
    notebook's order."""
    return {chapter.number: chapter.exercises for chapter in SYLLABUS}


def chapter_of(exercise: str) -> str | None:
    """"04" for "attention_scores"; None for a name no chapter grades."""
    return _CHAPTER_OF.get(exercise)


def chapter(number: str) -> Chapter | None:
    """The chapter "04" (or "4", or "04_self_attention"); None when the course has none."""
    digits = str(number)[:2].rstrip("_")
    return _BY_NUMBER.get(digits.zfill(2)) if digits.isdigit() else None


def checks_module(number: str) -> ModuleType:
    """The checks of chapter `number` (`checks.nb04`): the one place a chapter's checkers are
    imported by number (the borrowing, the grader's knock-on rule). ImportError when the course
    has no such chapter, or this copy of the package does not hold it (a grader's worker)."""
    found = chapter(number)
    if found is None:
        raise ImportError(f"the course has no chapter {number!r}")
    return importlib.import_module(found.module)
