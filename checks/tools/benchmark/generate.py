"""Section `generate`: greedy generation at batch 1 with 32-token prompts: the reference
(`checks.reference.generate`, KV cache) against Hugging Face's `LlamaForCausalLM.generate` on the
same weights (eager attention, its default cache, `do_sample=False`); tokens/s, their ratio, and
whether the tokens are identical. Decode's time (the generation minus its prefill, timed on its
own) and the bytes its steps must read (`checks.reference.roofline.decode_bytes`) feed table
(b).

Timing: warm-up first, then repeats; the two implementations alternate (and the order alternates
between rounds) so that both see the same machine, and the fastest repeat counts.
"""

from __future__ import annotations

import importlib.util
import time

import torch

from ...config import ModelConfig
from ...reference import generation as gen
from ...reference import roofline
from .common import Plan, best, first_difference, prompt_tokens


def hf_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def hf_model(params: dict, cfg: ModelConfig):
    """Hugging Face's LlamaForCausalLM holding `params` (eager attention; no special tokens, so
    that generation never stops early)."""
    from ...reference.hf import hf_model_from_params

    model = hf_model_from_params(params, cfg, bos_token_id=None, eos_token_id=None,
                                 pad_token_id=None)
    model.generation_config.pad_token_id = None
    model.generation_config.eos_token_id = None
    return model


def hf_model_if_available(params: dict, cfg: ModelConfig, out: dict, say):
    """Hugging Face's model on `params`, or None with `out["hf_missing"]` saying why."""
    if not hf_available():
        out["hf_missing"] = "transformers is not installed (pip install -e .[oracle])"
        return None
    say("building Hugging Face's model from the same weights")
    return hf_model(params, cfg)


def hf_generate(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Hugging Face's greedy generation as its users call it (its own no_grad, default cache)."""
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                          do_sample=False)


def _prefill_seconds(params, cfg, prompt, *, repeats: int) -> float:
    """The reference's prefill alone (cache allocation included), fastest repeat."""
    def call():
        with torch.inference_mode():
            cache = gen.KVCache(cfg, 1, prompt.shape[1] + 1)
            gen.forward_with_cache(prompt, params, cfg, cache, 0, last_only=True)
    return best(call, repeats=repeats)


def _hf_prefill_seconds(model, prompt, *, repeats: int) -> float:
    def call():
        with torch.no_grad():
            model(prompt, attention_mask=torch.ones_like(prompt), use_cache=True,
                  logits_to_keep=1)
    return best(call, repeats=repeats)


def decode_bytes_total(cfg: ModelConfig, prompt_len: int, n: int, bytes_per_elem: int = 4) -> int:
    """Bytes the n - 1 decode steps of an n-token generation must read: every weight once per
    step, and the cache as it stands (the step at position P + s reads P + s + 1 positions)."""
    return sum(roofline.decode_bytes(cfg, 1, prompt_len + s, bytes_per_elem)
               for s in range(n - 1))


def run_generate(params, cfg, plan: Plan, model, say, after_each=None,
                 prompt: torch.Tensor | None = None) -> list[dict]:
    """Both implementations at every length (alternating, the order swapped every round); the
    reference's prefill timed on its own to take it out of the decode time. `after_each()` runs
    after each length (the bandwidth is sampled there, under the same conditions). The prompt
    is random tokens of `plan.prompt_len` unless given."""
    if prompt is None:
        prompt = prompt_tokens(cfg, plan.prompt_len)
    ours = lambda n: gen.generate(params, cfg, prompt, n)              # noqa: E731
    theirs = (lambda n: hf_generate(model, prompt, n)) if model is not None else None
    ours(4)                                                              # warm-up
    if theirs:
        theirs(4)
    prefill = _prefill_seconds(params, cfg, prompt, repeats=5)
    hf_prefill = _hf_prefill_seconds(model, prompt, repeats=5) if model is not None else None
    rows = []
    for n in plan.lengths:
        say(f"generate: {n} new tokens")
        times = {"ours": [], "hf": []}
        tokens = {}
        for r in range(plan.repeats):
            order = [("ours", ours), ("hf", theirs)]
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                if fn is None:
                    continue
                start = time.perf_counter()
                tokens[name] = fn(n)
                times[name].append(time.perf_counter() - start)
        row = {"new_tokens": n, "prompt_len": prompt.shape[1], "ours_seconds": times["ours"],
               "ours_tokens_per_s": n / min(times["ours"]), "ours_prefill_seconds": prefill}
        nbytes = decode_bytes_total(cfg, prompt.shape[1], n)
        row["decode_bytes_per_step"] = nbytes / max(n - 1, 1)
        decode = max(min(times["ours"]) - prefill, 1e-9)
        row["ours_decode_bytes_per_s"] = nbytes / decode
        row["ours_decode_tokens_per_s"] = (n - 1) / decode
        if theirs:
            row.update(hf_seconds=times["hf"], hf_tokens_per_s=n / min(times["hf"]),
                       hf_prefill_seconds=hf_prefill)
            row["ratio"] = row["ours_tokens_per_s"] / row["hf_tokens_per_s"]
            row["paired_ratios"] = [h / o for o, h in zip(times["ours"], times["hf"])]
            diff = first_difference(tokens["ours"], tokens["hf"])
            row["identical_tokens"] = diff is None
            row["first_difference"] = diff
            hf_decode = max(min(times["hf"]) - hf_prefill, 1e-9)
            row["hf_decode_bytes_per_s"] = nbytes / hf_decode
        rows.append(row)
        if after_each:
            after_each()
    return rows


def hf_cells(r: dict) -> str:
    """A generation row's Hugging Face columns: tok/s, ours/HF, same tokens ('-' without HF)."""
    if "hf_tokens_per_s" not in r:
        return f"{'-':>10}{'-':>9}{'-':>13}"
    same = "yes" if r["identical_tokens"] else "NO @" + str(r["first_difference"])
    return f"{r['hf_tokens_per_s']:>10.1f}{r['ratio']:>8.2f}x{same:>13}"


def format_generate(result: dict) -> list[str]:
    """Table (a)."""
    rows = result.get("generate")
    if not rows:
        return []
    p = result["plan"]
    lines = ["", f"(a) greedy generation, batch 1, {p['prompt_len']}-token prompt, best of "
                 f"{p['repeats']} alternating runs: the reference (KV cache) vs Hugging "
                 "Face generate (eager, DynamicCache)"]
    if result.get("hf_missing"):
        lines.append(f"    Hugging Face skipped: {result['hf_missing']}")
    lines.append(f"{'new tokens':>12}{'ours tok/s':>12}{'HF tok/s':>10}{'ours/HF':>9}"
                 f"{'same tokens':>13}")
    for r in rows:
        lines.append(f"{r['new_tokens']:>12}{r['ours_tokens_per_s']:>12.1f}{hf_cells(r)}")
    return lines
