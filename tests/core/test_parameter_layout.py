"""The parameter layout (docs/conventions.md), defined once in `checks.config`: its shapes are the
conventions' table, LLaMA-2-7B's counts come out of it, and no other module of the package writes
the shapes out again (the reference, timing, the benchmark and SmolLM2's conversion take them
from there)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

from checks import LLAMA2_7B, ModelConfig
from checks import config
from checks import reference as ref

PACKAGE = Path(config.__file__).resolve().parent
# GQA, and D_h = 10 != H / N_h = 6: every symbol of the table has its own size.
CFG = ModelConfig(vocab_size=97, hidden_size=24, n_heads=4, n_kv_heads=2, head_dim=10,
                  ffn_hidden_size=40, n_layers=3)
NAMES = ("embed", "layers", "final_norm", "lm_head")
BLOCK = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")


def test_the_shapes_are_the_conventions_table():
    v, h, n_h, n_kv, d, h_ff = 97, 24, 4, 2, 10, 40
    assert config.block_shapes(CFG) == {
        "attn_norm": (h,), "wqkv": (h, (n_h + 2 * n_kv) * d), "wo": (n_h * d, h),
        "ffn_norm": (h,), "w_gate": (h, h_ff), "w_up": (h, h_ff), "w_down": (h_ff, h)}
    assert config.model_shapes(CFG) == {"embed": (v, h), "final_norm": (h,), "lm_head": (h, v)}
    assert config.qkv_widths(CFG) == (n_h * d, n_kv * d, n_kv * d)


def test_the_whole_layout_nests_one_block_per_layer_in_layout_order():
    shapes = config.param_shapes(CFG)
    assert tuple(shapes) == NAMES
    assert len(shapes["layers"]) == CFG.n_layers
    assert all(tuple(layer) == BLOCK and layer == config.block_shapes(CFG)
               for layer in shapes["layers"])
    assert {k: v for k, v in shapes.items() if k != "layers"} == config.model_shapes(CFG)


def test_llama2_7b_counts_come_out_of_the_layout():
    """docs/conventions.md: 202,383,360 parameters per block, 6,738,415,616 in all (untied)."""
    block = sum(math.prod(s) for s in config.block_shapes(LLAMA2_7B).values())
    top = sum(math.prod(s) for s in config.model_shapes(LLAMA2_7B).values())
    assert block == 202_383_360 == ref.block_param_count(LLAMA2_7B)
    assert LLAMA2_7B.n_layers * block + top == 6_738_415_616 == ref.model_param_count(LLAMA2_7B)


def test_the_reference_takes_its_shapes_from_the_layout():
    assert ref.block.block_shapes is config.block_shapes
    assert ref.model.model_shapes is config.model_shapes


def _shape_tables(path: Path) -> list[int]:
    """Lines of dict literals in `path` that give two or more layout tensors' names a literal
    tuple (one alone is another table that shares a name: chapter 02's exercise `embed`)."""
    names = set(NAMES + BLOCK)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict) and sum(
                isinstance(k, ast.Constant) and k.value in names and isinstance(v, ast.Tuple)
                for k, v in zip(node.keys, node.values)) >= 2:
            found.append(node.lineno)
    return found


def test_no_other_module_writes_the_shapes_out():
    written = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
               if "__pycache__" not in p.parts and p != Path(config.__file__).resolve()
               and (lines := _shape_tables(p))}
    assert not written, f"shape tables of the layout outside checks/config.py: {written}"
    assert _shape_tables(Path(config.__file__))          # the test sees the one there is
