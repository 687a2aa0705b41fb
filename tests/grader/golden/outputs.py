"""Grade the golden class as an instructor does and normalise what the grader writes; the golden
files (expected/) are this module's output, and tests/grader/test_golden_class.py compares a new
grading with them.

    PYTHONPATH=$PWD .venv/bin/python -m tests.grader.golden.outputs           # rewrite expected/
    PYTHONPATH=$PWD .venv/bin/python -m tests.grader.golden.outputs --twice   # grade twice, diff

Rewrite expected/ only for a change an instructor is meant to see (a new message, a new
diagnosis), and read its diff before committing it.

What is pinned (the same on every machine, so nothing to normalise):
- the checks' random inputs: CHECKS_SEED is set for the grader. The test cells run in the
  grading processes, which inherit it, so every failure's seed, random case and message is the
  same each run (without it each check draws a new seed and the messages' numbers change);
- torch's threads: the grader is given two CPUs, so `--jobs 2` runs each notebook on one thread,
  whatever the machine's cores (sums in another order could change a printed digit);
- the language: LLAMA_COURSE_LANG is removed, so the instructor's outputs are in English and each
  submission's diagnoses in its own release's language;
- lateness: the submissions' nbgrader timestamp.txt and `--due` are fixed, and the time zone the
  pages show times in (TZ=UTC);
- the students: a roster (`--roster`) names the five and a sixth, fay, who submitted nothing (the
  gradebook has her row, the report's student view lists her).

What legitimately varies, and is normalised (see VARYING and normalise_*):
- the class's temporary folder in every path (`<class>`);
- durations: each record's `seconds` and the table's "(3.6 s)";
- the machine: memory used (`grader_memory_mib`), how the workers were isolated (`isolation`:
  namespaces as root, none otherwise) and their user id (`worker_uid`);
- `grader`: a fingerprint of the scoring code, which any edit of the checkers changes by design
  (a restructure must change it; what the scoring does is compared, not its bytes);
- the report's charts: matplotlib's SVG carries the time it was drawn and random ids, and its
  geometry depends on the fonts installed; each chart is replaced by what it shows (its text:
  ticks, labels, percentages; its bars: colour and length relative to the longest).
JSON keys are sorted (their order is not something a reader of JSON sees); the order of the
records and of every list is kept.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import make_class

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected"
SEED = "20260301"
JOBS = 2
CPUS = 2
TIMEOUT = 900

# each output, named as in expected/ (not grades.json: .gitignore ignores that name anywhere)
OUTPUTS = ("class.json", "gradebook.csv", "class.html", "terminal.txt")

# keys of the JSON report (top level and records) whose value varies from run to run
VARYING = {"seconds": "<seconds>", "grader_memory_mib": "<MiB>", "isolation": "<isolation>",
           "worker_uid": "<uid>", "grader": "<fingerprint>"}
CLASS_ROOT = "<class>"
# the five students of the class, and fay, who submitted nothing
ROSTER = ("folder,id,name,section\n" + "".join(
    f"{s},{i},{s.capitalize()} (roster),{'AB'[i % 2]}\n"
    for i, s in enumerate([*make_class.STUDENTS, "fay"], 1)))


def _two_cpus() -> None:  # the grader's preexec_fn
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:CPUS])


def grade(workdir: Path) -> tuple[dict[str, str], subprocess.CompletedProcess]:
    """Copy the class to `workdir`/submitted, grade it as the golden files were, and return the
    normalised outputs ({name: text}) with the finished process."""
    root = workdir / "submitted"
    shutil.copytree(make_class.CLASS, root)
    out = workdir / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_COURSE_LANG", "CHECKS_SEED")}
    env.update(CHECKS_SEED=SEED, OMP_NUM_THREADS="1", TZ="UTC")
    roster = workdir / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "checks", "grade", str(root), "--json", str(out / "class.json"),
         "--report", str(out / "class.html"), "--csv", str(out / "gradebook.csv"),
         "--due", make_class.DUE, "--roster", str(roster), "--jobs", str(JOBS)],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=workdir,
        preexec_fn=_two_cpus if hasattr(os, "sched_setaffinity") else None)
    if done.returncode != 0:
        raise RuntimeError(f"checks grade exited with {done.returncode}:\n{done.stderr}")
    (out / "terminal.txt").write_text(done.stdout, encoding="utf-8")
    raw = {name: (out / name).read_text(encoding="utf-8") for name in OUTPUTS}
    return normalise(raw, root), done


def normalise(raw: dict[str, str], root: Path) -> dict[str, str]:
    """Each output ({name: text}) with what varies between runs replaced (see the docstring)."""
    def unrooted(text: str) -> str:
        for form in {str(root), str(root.resolve())}:
            text = text.replace(form, CLASS_ROOT)
        return text

    texts = {name: unrooted(text) for name, text in raw.items()}
    return {"class.json": normalise_json(texts["class.json"]),
            "gradebook.csv": texts["gradebook.csv"],
            "class.html": normalise_report(texts["class.html"]),
            "terminal.txt": normalise_terminal(texts["terminal.txt"])}


def normalise_json(text: str) -> str:
    data = json.loads(text)
    for record in [data, *data.get("notebooks", [])]:
        for key, placeholder in VARYING.items():
            if key in record:
                record[key] = placeholder
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


_DURATION = re.compile(r"\(\d+(?:\.\d+)? s\)")


def normalise_terminal(text: str) -> str:
    return _DURATION.sub("(<seconds>)", text)


_SVG = re.compile(r"<svg\b.*?</svg>", re.DOTALL)
_SVG_TEXT = re.compile(r"<!-- (.*?) -->", re.DOTALL)
# a rectangle as matplotlib writes a bar: M x0 y0 L x1 y0 L x1 y1 L x0 y1 z, and its fill
_BAR = re.compile(r'<path d="M ([-\d.]+) ([-\d.]+) \s*L ([-\d.]+) [-\d.]+ \s*L [-\d.]+ ([-\d.]+) '
                  r'\s*L [-\d.]+ [-\d.]+ \s*z\s*"(?: clip-path="[^"]*")? style="fill: (#[0-9a-f]+)')


def normalise_report(text: str) -> str:
    return _SVG.sub(lambda m: chart_summary(m.group(0)), text)


def chart_summary(svg: str) -> str:
    """What a chart shows, without matplotlib's ids, date and font geometry: its text in order,
    and its bars (the white background's left out) by colour, each as width x height relative to
    the widest and the tallest bar (3 decimals)."""
    labels = [label.strip() for label in _SVG_TEXT.findall(svg)]
    bars = [(abs(float(x1) - float(x0)), abs(float(y1) - float(y0)), fill)
            for x0, y0, x1, y1, fill in _BAR.findall(svg) if fill != "#ffffff"]
    widest = max((w for w, _h, _f in bars), default=0) or 1
    tallest = max((h for _w, h, _f in bars), default=0) or 1
    shown = " ".join(f"{fill}:{w / widest:.3f}x{h / tallest:.3f}" for w, h, fill in bars)
    return f"<svg><!-- text: {' | '.join(labels)} --><!-- bars: {shown} --></svg>"


def diff(expected: str, actual: str, name: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True),
                                        actual.splitlines(keepends=True),
                                        f"expected/{name}", f"graded now/{name}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--twice", action="store_true",
                        help="grade twice and show what differs; write nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        first, _done = grade(Path(tmp) / "1" if args.twice else Path(tmp))
        if not args.twice:
            EXPECTED.mkdir(exist_ok=True)
            for name, text in first.items():
                (EXPECTED / name).write_text(text, encoding="utf-8")
            print(f"wrote {', '.join(OUTPUTS)} in {EXPECTED}")
            return 0
        second, _done = grade(Path(tmp) / "2")
    differences = [diff(first[name], second[name], name) for name in OUTPUTS]
    print("".join(differences) or "the two gradings' normalised outputs are identical")
    return 1 if any(differences) else 0


if __name__ == "__main__":
    sys.exit(main())
