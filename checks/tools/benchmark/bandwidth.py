"""Section `bandwidth`: this machine's memory read bandwidth, measured several ways on an array far
larger than the caches (a sum, and a matrix-vector product each way round), sampled at the start,
after each generation length and after each decode-path context length; the best sample counts
(the memory bus is shared with whatever else runs: the samples move by a quarter). Decode's
achieved bandwidth, table (b), is the bytes each decode step must read over its time, against it.
"""

from __future__ import annotations

import torch

from .common import MiB, best, gb
from .decode_path import REFERENCE_STEP


def measure_read_bandwidth(nbytes: int, *, repeats: int = 5) -> dict:
    """Bytes/s of reading one float32 array of `nbytes` (far larger than the caches), three ways:
    a sum, a vector-matrix product v @ A (decode's x @ W) and a matrix-vector product A @ u; each
    reads the array once. The fastest repeat of each way; the best way counts."""
    n = nbytes // 4
    cols = 4096 if n >= 4096 * 16 else 64
    rows = n // cols
    a = torch.ones(rows, cols)
    flat = a.view(-1)
    v, u = torch.ones(rows), torch.ones(cols)
    size = a.numel() * 4
    ways = {"sum": lambda: flat.sum(),
            "vector @ matrix": lambda: torch.matmul(v, a),
            "matrix @ vector": lambda: torch.mv(a, u)}
    with torch.inference_mode():
        measured = {name: size / best(fn, repeats=repeats) for name, fn in ways.items()}
    way = max(measured, key=measured.get)
    return {"bytes": size, "ways": measured, "best_way": way, "bytes_per_s": measured[way]}


def attach_bandwidth(result: dict, samples: list[dict]) -> None:
    """The machine's read bandwidth: the best sample of the run (at the start, after each
    generation length and after each decode-path context), so that decode is compared with the
    best the memory gave while this ran; every decode measurement gets its share of it."""
    top = max(samples, key=lambda s: s["bytes_per_s"])
    result["bandwidth"] = {**top, "samples_bytes_per_s": [s["bytes_per_s"] for s in samples]}
    for row in result.get("generate", []) + result.get("smollm", {}).get("generate", []):
        for who in ("ours", "hf"):
            if f"{who}_decode_bytes_per_s" in row:
                row[f"{who}_bandwidth_fraction"] = (row[f"{who}_decode_bytes_per_s"]
                                                    / top["bytes_per_s"])
    for c in result.get("decode_path", {}).get("contexts", []):
        c["reference_bytes_per_s"] = c["decode_bytes"] / c["step_seconds"][REFERENCE_STEP]
        c["reference_bandwidth_fraction"] = c["reference_bytes_per_s"] / top["bytes_per_s"]


def format_bandwidth(result: dict) -> list[str]:
    bw = result.get("bandwidth")
    if not bw:
        return []
    ways = ", ".join(f"{name} {gb(v)}" for name, v in bw["ways"].items())
    got = bw["samples_bytes_per_s"]
    return ["", f"memory read bandwidth ({bw['bytes'] // MiB} MiB array): "
                f"{gb(bw['bytes_per_s'])} GB/s, the best of {len(got)} samples "
                f"({gb(min(got))}-{gb(max(got))} GB/s) taken through the run; its "
                f"ways: {ways} GB/s"]


def format_decode_bandwidth(result: dict) -> list[str]:
    """Table (b): decode's achieved bandwidth in the generations of (a), and in the reference's
    single decode steps of (f)."""
    lines = []
    rows = result.get("generate")
    if rows:
        lines += ["", "(b) decode's achieved bandwidth: bytes of weights + KV read per decode "
                      "step x decode steps/s, against the read bandwidth above",
                  "    in the generations of (a) (prefill timed apart and taken out):",
                  f"{'new tokens':>12}{'MB/step':>9}{'ours GB/s':>11}{'% of read BW':>14}"
                  f"{'HF GB/s':>9}{'% of read BW':>14}"]
        for r in rows:
            frac = (f"{100 * r['ours_bandwidth_fraction']:>13.0f}%"
                    if "ours_bandwidth_fraction" in r else f"{'-':>14}")
            hf = ""
            if "hf_decode_bytes_per_s" in r:
                hf = f"{gb(r['hf_decode_bytes_per_s']):>9}" + (
                    f"{100 * r['hf_bandwidth_fraction']:>13.0f}%"
                    if "hf_bandwidth_fraction" in r else f"{'-':>14}")
            lines.append(f"{r['new_tokens']:>12}{r['decode_bytes_per_step'] / 1e6:>9.1f}"
                         f"{gb(r['ours_decode_bytes_per_s']):>11}{frac}{hf}")
    contexts = result.get("decode_path", {}).get("contexts", [])
    if contexts and "reference_bytes_per_s" in contexts[0]:
        lines += ["    one decode step of the reference after C cached positions (fastest of the "
                  "interleaved rounds of (f)):",
                  f"{'C':>12}{'MB/step':>9}{'ours GB/s':>11}{'% of read BW':>14}"]
        for c in contexts:
            lines.append(f"{c['context']:>12}{c['decode_bytes'] / 1e6:>9.1f}"
                         f"{gb(c['reference_bytes_per_s']):>11}"
                         f"{100 * c['reference_bandwidth_fraction']:>13.0f}%")
    return lines
