"""What chapter 13's timing runs where: dtype and sizes chosen from a device's description alone
(`checks.timing.DeviceInfo`: kind, name, total and free memory, CUDA compute capability), so
every device is tested here without it.

The descriptions are what `torch.cuda.mem_get_info` and `get_device_capability` report on those
GPUs (a 16 GB T4 as on Colab, an A100 with 40 GB, an H200 with 141 GB), what Metal recommends on
a 16 GB Mac, and a CPU. The expected sizes follow from the rules in `checks.timing` (90% of the
free memory less 512 MiB usable; at most 60% of it for the weights; a point runs when its cache
and activations fit beside them), worked out by hand in the comments.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from checks import LLAMA2_7B, ModelConfig, timing
from checks.timing import DeviceInfo

T4 = DeviceInfo("cuda", "Tesla T4", 15_828_320_256, 15_720_251_392, (7, 5))
A100 = DeviceInfo("cuda", "NVIDIA A100-SXM4-40GB", 42_298_834_944, 41_906_667_520, (8, 0))
H200 = DeviceInfo("cuda", "NVIDIA H200", 150_110_011_392, 149_681_733_632, (9, 0))
MPS = DeviceInfo("mps", "Apple GPU (MPS, arm64)", 11_453_251_584, 11_453_251_584)
CPU = DeviceInfo("cpu", "x86_64 CPU, 1 thread", 16 * 2**30, 12 * 2**30)

SEVEN_B = timing.SIZES["7b"]
SMOLLM = ModelConfig(vocab_size=49152, hidden_size=576, n_heads=9, n_kv_heads=3,
                     ffn_hidden_size=1536, n_layers=30, max_seq_len=8192, rope_base=100000.0)

# Per device: dtype, layers, prefill points, decode points.
EXPECTED = {
    # 13.6 GB usable; weights at most 8.17 GB: 0.52 GB (embedding, LM head) + 18 x 0.405 GB per
    # layer = 7.81 GB (19 would be 8.22). Two decode points need 19 GB of cache: left out.
    "T4": (T4, torch.float16, 18, SEVEN_B.prefill, ((1, 512), (8, 512), (32, 512), (1, 2048))),
    # All 13.5 GB of weights fit in 37.2 GB; B=128 at C=512 and B=32 at C=2048 need 34 GB of
    # cache each: left out.
    "A100": (A100, torch.bfloat16, 32, SEVEN_B.prefill,
             ((1, 512), (8, 512), (32, 512), (1, 2048))),
    # 134 GB usable: everything.
    "H200": (H200, torch.bfloat16, 32, SEVEN_B.prefill, SEVEN_B.decode),
    # Apple's GPUs: fp16, at most 8 layers and the shorter prompts (timing.MPS_LIMITS).
    "MPS": (MPS, torch.float16, 8, ((1, 128), (1, 512), (1, 1024)),
            ((1, 512), (8, 512), (32, 512))),
    # The CPU: the scaled-down configuration in fp32, whatever its memory.
    "CPU": (CPU, torch.float32, 4, timing.SIZES["small"].prefill, timing.SIZES["small"].decode),
}


@pytest.mark.parametrize("which", list(EXPECTED))
def test_the_plan_for_each_device(which):
    dev, dtype, layers, prefill, decode = EXPECTED[which]
    plan = timing.plan_for(dev)
    assert timing.timing_dtype(dev) == dtype and plan.dtype == dtype
    assert plan.cfg.n_layers == layers
    assert plan.prefill == prefill and plan.decode == decode
    if dev.kind != "cpu":    # LLaMA-2-7B's layer shapes, only fewer of them
        assert dataclasses.replace(plan.cfg, n_layers=32) == LLAMA2_7B
        assert ("all 32 layers" if layers == 32 else f"{layers} of its 32 layers") in plan.label
    assert dev.name in plan.choice


@pytest.mark.parametrize("which", list(EXPECTED))
def test_the_chosen_sizes_fit_and_the_left_out_ones_do_not(which):
    dev, dtype, *_ = EXPECTED[which]
    plan = timing.plan_for(dev)
    room = timing.usable_memory(dev)
    assert 0 < room < dev.free_memory
    for phase, chosen in (("prefill", plan.prefill), ("decode", plan.decode)):
        for point in chosen:
            assert timing.memory_needed(plan.cfg, plan.dtype, phase, *point) <= room, point
    if dev.kind == "cpu":
        return
    candidates = timing.MPS_LIMITS if dev.kind == "mps" else \
        {"prefill": SEVEN_B.prefill, "decode": SEVEN_B.decode}
    for phase, chosen in (("prefill", plan.prefill), ("decode", plan.decode)):
        for point in set(candidates[phase]) - set(chosen):
            assert timing.memory_needed(plan.cfg, plan.dtype, phase, *point) > room, point
    assert plan.copy_bytes * 2 <= room          # the bandwidth copy's two buffers


def test_a_t4_cannot_hold_all_of_llama_2_7b_with_a_cache():
    """Why the T4 gets fewer layers: 13.5 GB of fp16 weights and even the smallest cache exceed
    what a 16 GB card leaves usable."""
    weights = timing.weights_needed(LLAMA2_7B, torch.float16)
    assert 13.4e9 < weights < 13.6e9
    assert timing.memory_needed(LLAMA2_7B, torch.float16, "decode", 1, 512) > \
        timing.usable_memory(T4)
    plan = timing.plan_for(T4)
    assert "no fast bf16" in plan.choice and "compute capability 7.5" in plan.choice
    assert "2 points left out" in plan.choice


def test_bf16_only_from_compute_capability_8():
    for capability, dtype in (((6, 0), torch.float16), ((7, 0), torch.float16),
                              ((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                              ((8, 6), torch.bfloat16), ((9, 0), torch.bfloat16)):
        dev = dataclasses.replace(A100, capability=capability)
        assert timing.timing_dtype(dev) == dtype, capability


def test_a_gpu_too_small_for_one_layer_gets_the_small_plan():
    tiny_gpu = DeviceInfo("cuda", "a 2 GB GPU", 2 * 2**30, 2 * 2**30, (6, 1))
    plan = timing.plan_for(tiny_gpu)
    assert plan.cfg == timing.SIZES["small"].cfg and plan.dtype == torch.float32
    assert "do not fit" in plan.choice


def test_asked_sizes_are_kept():
    assert timing.plan_for(H200, "tiny").cfg == timing.SIZES["tiny"].cfg
    assert timing.plan_for(CPU, "small").prefill == timing.SIZES["small"].prefill
    assert "as asked" in timing.plan_for(CPU, "small").choice
    assert "the CPU's default" in timing.plan_for(CPU).choice
    with pytest.raises(ValueError, match="size 'huge'"):
        timing.plan_for(CPU, "huge")


@pytest.mark.parametrize("dev,dtype", [(T4, torch.float16), (H200, torch.bfloat16),
                                       (MPS, torch.float16), (CPU, torch.float32)])
def test_the_real_model_runs_in_the_devices_dtype(dev, dtype):
    plan = timing.smollm_plan(dev, SMOLLM)
    assert plan.dtype == dtype
    points = timing.SMOLLM_POINTS["cpu" if dev.kind == "cpu" else "gpu"]
    assert plan.prefill == points["prefill"] and plan.decode == points["decode"]
    tiny = timing.smollm_plan(dev, SMOLLM, "tiny")
    assert tiny.prefill == ((1, 8),) and tiny.decode == ((1, 8),)


def test_this_machine_is_described():
    dev = timing.describe_device()
    assert dev.kind == timing.default_kind()
    assert 0 < dev.free_memory <= dev.total_memory
    if dev.kind == "cpu":
        assert dev.capability is None and "CPU" in dev.name
        assert timing.plan_for(dev).cfg == timing.SIZES["small"].cfg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_a_real_gpu_is_described_as_torch_sees_it():
    dev = timing.describe_device("cuda")
    free, total = torch.cuda.mem_get_info()
    assert dev.total_memory == total and abs(dev.free_memory - free) < 2**30
    assert dev.capability == torch.cuda.get_device_capability()
    plan = timing.plan_for(dev)
    assert plan.prefill and plan.decode


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="expected 'cuda', 'mps' or 'cpu'"):
        timing.describe_device("tpu")


# Chapter 14 on any device: the data stay on the CPU, the model may be elsewhere. PyTorch's meta
# device stands in for a GPU on a machine without one: tensors there have shapes and devices but
# no values, so a run that puts every batch where the model is gets as far as reading the loss's
# value (which a meta tensor does not have), while one that leaves a batch on the CPU stops
# earlier, on the devices' mismatch.

META_VALUE = "cannot be called on meta tensors"


def _meta_model():
    from checks.reference import training as tr
    from checks.training_run import settings, to_device

    cfg = settings("grading").config()
    params = to_device(tr.init_training_params(cfg, generator=torch.Generator().manual_seed(0)),
                       "meta")
    return tr, cfg, params


def test_meta_stands_in_for_another_device():
    """What the tests below rely on: a batch left on the CPU fails on the mismatch."""
    logits = torch.zeros(4, 256, device="meta")
    with pytest.raises(RuntimeError, match="device"):
        torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match=META_VALUE):
        float(torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long,
                                                                     device="meta")))


def test_the_reference_evaluate_moves_batches_to_the_parameters_device():
    tr, cfg, params = _meta_model()
    data = torch.arange(500) % 256
    seen = []

    def forward(x, params, cfg):
        seen.append(x.device)
        return tr.model_forward(x, params, cfg)

    with pytest.raises(RuntimeError, match=META_VALUE):
        tr.evaluate(params, cfg, data, batch_size=2, context_len=8, n_batches=2,
                    generator=torch.Generator().manual_seed(0), forward=forward)
    assert seen == [torch.device("meta")]


def test_an_evaluate_that_leaves_batches_on_the_cpu_is_caught():
    """The test above can fail: the same evaluation without moving the batches stops on the
    devices' mismatch, not on the loss's value."""
    tr, cfg, params = _meta_model()
    data = torch.arange(500) % 256

    def evaluate_on_the_cpu(params, cfg, data, *, batch_size, context_len, n_batches,
                            generator=None):
        with torch.no_grad():
            x, y = tr.get_batch(data, batch_size, context_len, generator=generator)
            return float(tr.batch_loss(tr.model_forward(x, params, cfg), y))

    with pytest.raises(RuntimeError) as raised:
        evaluate_on_the_cpu(params, cfg, data, batch_size=2, context_len=8, n_batches=1)
    assert META_VALUE not in str(raised.value)


def test_get_batch_returns_batches_on_the_datas_device():
    from checks.reference import training as tr

    data = (torch.arange(300) % 256).to("meta")
    x, y = tr.get_batch(data, 3, 7, generator=torch.Generator().manual_seed(0))
    assert x.device == y.device == data.device and x.shape == y.shape == (3, 7)
