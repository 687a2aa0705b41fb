"""`python -m checks.smollm --prepare|--info`: make the conversion cache (setup runs it), or print
what the model file holds. Errors are one line on stderr and exit status 1."""

from __future__ import annotations


import argparse
import sys
import time


from .cache import cache_file, load, prepare
from .file import ModelFileError, ModelUnavailable, fingerprint, model_file
from .tokens import tokenizer


def _info() -> str:
    path = model_file()
    size, sha = fingerprint(path)
    params, cfg = load()
    tok = tokenizer()
    n_params = sum(t.numel() for t in [params["embed"], params["final_norm"],
                                       *(t for layer in params["layers"] for t in layer.values())])
    target = cache_file(path)
    return "\n".join([
        f"model file   {path} ({size:,} bytes, sha256 {sha[:16]}...)",
        f"cache        {target} ({'present' if target.is_file() else 'not written'})",
        f"config       {cfg}",
        f"parameters   {n_params:,} (LM head tied to the embedding: lm_head is embed.T)",
        f"tokenizer    {tok.vocab_size:,} tokens, {len(tok.merges):,} merges, "
        f"{len(tok.special_ids)} special tokens (<|im_start|> = {tok.im_start_id}, "
        f"<|im_end|> = {tok.im_end_id})",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks.smollm",
        description="SmolLM2-135M-Instruct for the course: convert and cache the weights, or "
                    "show what the model file holds.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prepare", action="store_true",
                      help="convert the weights once into the cache (setup runs this)")
    what.add_argument("--info", action="store_true", help="print the model's facts")
    args = parser.parse_args(argv)
    try:
        if args.prepare:
            start = time.perf_counter()
            fresh = not cache_file().is_file()
            target = prepare()
            verb = "converted and cached" if fresh else "cached"
            print(f"SmolLM2-135M-Instruct {verb} in {time.perf_counter() - start:.1f} s: {target}")
        else:
            print(_info())
    except (ModelUnavailable, ModelFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
