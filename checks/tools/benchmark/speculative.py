"""Section `speculative`: chapter 16's measurement with the course's functions (the reference's
`generate` and `speculative_generate`): SmolLM2-135M-Instruct (fp32, batch 1) on the tasks of
`checks.speculation` (quote and edit a passage, where prompt lookup pays; open chat, where it does
not), prompt lookup at several k and the first 8 blocks as an early-exit draft; acceptance rate,
new tokens per forward pass, the speed-up over `generate`, and whether the tokens are identical.
Skipped with a note when the model is not installed. On a GPU, `python -m checks.gpu_check`
prints the same table.
"""

from __future__ import annotations

import torch

from ... import speculation
from ...reference import generation as gen
from ...reference import speculative as spec
from .common import Plan


def run_speculative(plan: Plan, say, device: str = "cpu") -> dict:
    from ... import smollm

    if not smollm.available():
        return {"missing": str(smollm.ModelUnavailable())}
    quick = plan.cfg.hidden_size <= 64
    new_tokens, ks = (4, (2,)) if quick else (64, (2, 4, 8))
    say("SmolLM2-135M-Instruct: speculative decoding")
    params, cfg = smollm.load(device=device)
    tok = smollm.tokenizer()
    sync = torch.cuda.synchronize if device == "cuda" else None
    rows = []
    for task, (message, _copies) in speculation.TASKS.items():
        say(f"speculative decoding: {task}")
        prompt = torch.tensor([tok.chat_prompt(message)], device=device)
        rows += speculation.measure(params, cfg, prompt, new_tokens,
                                    drafts={"lookup": speculation.lookup(spec.lookup_draft)},
                                    ks=ks, generate=gen.generate,
                                    speculative_generate=spec.speculative_generate, task=task,
                                    sync=sync)
    first = min(8, cfg.n_layers - 1)
    prompt = torch.tensor([tok.chat_prompt(speculation.TASKS["quote"][0])], device=device)
    rows += speculation.measure(params, cfg, prompt, min(new_tokens, 16),
                                drafts={f"first {first}": speculation.early_exit(
                                    spec.early_exit_draft, params, cfg, first)},
                                ks=(2,), generate=gen.generate,
                                speculative_generate=spec.speculative_generate, task="quote",
                                sync=sync)
    return {"device": device, "new_tokens": new_tokens, "rows": rows}


def format_speculative(result: dict) -> list[str]:
    """Table (g), chapter 16."""
    section = result.get("speculative")
    if not section:
        return []
    head = ["", "(g) chapter 16: speculative decoding on SmolLM2-135M-Instruct, batch 1, "
            "against generate (greedy)"]
    if "missing" in section:
        return head + [f"skipped: {section['missing']}"]
    return head + [f"{section['new_tokens']} new tokens on {section['device']}",
                   speculation.format_table(section["rows"])]


def main(argv: list[str] | None = None) -> int:
    """python -m checks.tools.benchmark.speculative [--quick] [--device cpu|cuda]"""
    import argparse

    from .common import FULL, QUICK

    parser = argparse.ArgumentParser(prog="python -m checks.tools.benchmark.speculative",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 new tokens, k = 2 only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    result = {"speculative": run_speculative(QUICK if args.quick else FULL,
                                             lambda text: print(text, flush=True), args.device)}
    print("\n".join(format_speculative(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
