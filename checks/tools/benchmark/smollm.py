"""Section `smollm`: the real model, SmolLM2-135M-Instruct (`checks.smollm`; skipped with a note
when it is not installed): `generate`'s measurement on it, from its chat prompt, at 128 and 512
new tokens (fp32, batch 1), with decode's share of the measured read bandwidth.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import torch

from ...reference import roofline
from .common import Plan, gb
from .generate import hf_cells, hf_model_if_available, run_generate


SMOLLM_QUESTION = "What is the capital of France?"


def run_smollm(plan: Plan, say, after_each=None) -> dict:
    """The `generate` section's measurement on SmolLM2-135M-Instruct (`checks.smollm`, fp32,
    memory-mapped from its cache) from its chat prompt: the reference against Hugging Face's
    `generate` on the same weights (converted by `checks.reference.hf`, eager attention, no
    end-of-sequence token, so both generate every token asked for)."""
    from ... import smollm

    if not smollm.available():
        return {"missing": str(smollm.ModelUnavailable())}
    say("SmolLM2-135M-Instruct: loading")
    params, cfg = smollm.load()
    prompt = torch.tensor([smollm.tokenizer().chat_prompt(SMOLLM_QUESTION)])
    out = {"config": asdict(cfg), "prompt": smollm.chat_text(SMOLLM_QUESTION),
           "weight_bytes": roofline.weight_bytes(cfg, 4)}
    model = hf_model_if_available(params, cfg, out,
                                   lambda text: say(f"SmolLM2-135M-Instruct: {text}"))
    smollm_plan = replace(plan, lengths=plan.smollm_lengths)
    out["generate"] = run_generate(params, cfg, smollm_plan, model,
                                   lambda text: say(f"SmolLM2-135M-Instruct {text}"),
                                   after_each=after_each, prompt=prompt)
    return out


def format_smollm(result: dict) -> list[str]:
    """Table (g): the real model's generations (nothing when the section was skipped)."""
    s = result.get("smollm")
    if not s:
        return []
    head = "(g) the real model, SmolLM2-135M-Instruct"
    if "missing" in s:
        return ["", f"{head}: skipped, {s['missing']}"]
    rows = s["generate"]
    lines = ["", f"{head} (fp32, {s['weight_bytes'] / 1e6:.0f} MB of weights read per decode "
                 f"step): greedy generation at batch 1 from its {rows[0]['prompt_len']}-token "
                 f"chat prompt, best of {result['plan']['repeats']} alternating runs; the "
                 "reference (KV cache) vs Hugging Face generate (eager, DynamicCache) on the same "
                 "weights; target: ours/HF >= 1.5x"]
    if s.get("hf_missing"):
        lines.append(f"    Hugging Face skipped: {s['hf_missing']}")
    lines.append(f"{'new tokens':>12}{'ours tok/s':>12}{'HF tok/s':>10}{'ours/HF':>9}"
                 f"{'same tokens':>13}{'ours decode':>13}{'HF decode':>11}")
    for r in rows:
        lines.append(f"{r['new_tokens']:>12}{r['ours_tokens_per_s']:>12.1f}{hf_cells(r)}"
                     f"{_decode_cell(r, 'ours'):>13}{_decode_cell(r, 'hf'):>11}")
    lines.append("    decode: weights + KV cache read per decode step x decode steps/s (prefill "
                 "timed apart), as a share of the read bandwidth above (GB/s without it)")
    return lines


def _decode_cell(r: dict, who: str) -> str:
    key = f"{who}_bandwidth_fraction"
    if key in r:
        return f"{100 * r[key]:.0f}% BW"
    if f"{who}_decode_bytes_per_s" in r:
        return f"{gb(r[f'{who}_decode_bytes_per_s'])} GB/s"
    return "-"
