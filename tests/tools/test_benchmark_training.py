"""The benchmark's training section: the nn.Module LLaMA is the course's model (same logits on the
same weights), and one quick run reports both speeds, their ratio and the MFU."""

from __future__ import annotations

import torch

from checks import training_run
from checks.reference import training as tr
from checks.reference.model import model_forward
from checks.tools.benchmark.training import ModuleLlama, format_training, run_training


def test_the_module_is_the_same_model():
    cfg = training_run.settings("grading").config(n_layers=2)
    params = tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ModuleLlama(cfg, params)(ids), model_forward(ids, params, cfg),
                                   atol=1e-5, rtol=1e-5)


def test_a_quick_run_reports_the_ratio_and_the_mfu():
    result = run_training("grading", 2)
    assert result["ratio"] > 0 and set(result["mfu"]) == {"course", "module"}
    assert abs(result["first_loss"]["course"] - result["first_loss"]["module"]) < 1e-4
    lines = format_training({"training": result})
    assert any("ratio course / module" in line for line in lines)
    assert format_training({}) == []
