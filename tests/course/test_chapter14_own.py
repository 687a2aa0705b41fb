"""Chapter 14 trains the learner's own model: with the instructor solutions of chapters 02-13 as
the learner's notebooks, every building block the chapter borrows is "yours", gradients reach
every parameter through them, and a few steps of the reference training step lower the loss of
the learner's `model_forward` on Shakespeare."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from checks import reference as ref
from checks import training_run
from checks.borrow import own_functions
from checks.reference import training as tr

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
pytestmark = pytest.mark.slow


def _wanted() -> dict[str, str]:
    """The names and chapters chapter 14's import cell borrows, read from the notebook."""
    cells = json.loads((SOLUTIONS / "14_training" / "14_training.ipynb").read_text())["cells"]
    source = "".join(next(c for c in cells if "own_functions(" in "".join(c["source"]))["source"])
    body = source.split("own_functions({", 1)[1].split("})", 1)[0]
    pairs = [line.strip().rstrip(",").split(":") for line in body.splitlines() if ":" in line]
    return {k.strip().strip('"'): v.strip().strip('"') for k, v in pairs}


def test_the_learners_own_model_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LLAMA_COURSE_GRADING", raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    for folder in SOLUTIONS.glob("[0-1][0-9]_*"):
        if folder.name[:2] != "14":
            shutil.copytree(folder, tmp_path / folder.name)
    wanted = _wanted()
    assert {"model_forward", "init_model_params", "rms_norm", "apply_rope",
            "grouped_query_attention", "swiglu_ffn", "generate"} <= set(wanted)
    borrowed = own_functions(wanted, root=tmp_path)
    assert all(whose == "yours" for whose in borrowed.whose.values()), capsys.readouterr().out
    model_forward, init_model_params = borrowed["model_forward"], borrowed["init_model_params"]
    assert model_forward is not ref.model_forward

    s = training_run.settings("grading")
    cfg = s.config(n_layers=2)
    params = tr.trainable(init_model_params(cfg, generator=torch.Generator().manual_seed(0)))
    text = torch.tensor(list(b"ROMEO:\nBut soft, what light through yonder window breaks?\n" * 20))
    x, y = tr.get_batch(text, 8, 32, generator=torch.Generator().manual_seed(1))
    loss = torch.nn.functional.cross_entropy(model_forward(x, params, cfg).flatten(0, 1),
                                             y.flatten())
    loss.backward()
    assert all(t.grad is not None and bool(t.grad.abs().sum() > 0) for t in tr.param_list(params))
    for t in tr.param_list(params):
        t.grad = None
    state: dict = {}
    losses = [tr.train_step(params, cfg, x, y, state, lr=1e-2, forward=model_forward)
              for _n in range(30)]
    assert losses[-1] < losses[0] - 1.0, losses
    out = borrowed["generate"](params, cfg, x[:1, :8], 5)
    assert out.shape == (1, 13)
