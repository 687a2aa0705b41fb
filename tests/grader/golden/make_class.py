"""Write the golden class (tests/grader/golden/class/): five students' submissions of chapters 11
to 14, as nbgrader collects them (`<student>/<chapter>/<chapter>.ipynb`, two with its
`timestamp.txt`).

Each submission is the chapter's release notebook (notebooks/, or notebooks-zh/ for the students
who took the Chinese release) with its answer cells filled in from the solution notebook
(solutions/), then the planted mistakes below: one line of an answer replaced by a wrong one
from the checkers' catalogues (tests/checkers/test_nb11.py .. test_nb14.py), each diagnosed as a
declared mistake id, or an answer left as released (not started). dee's are all correct. One
failure is not planted: eve's `evaluate` calls her wrong `get_batch` and fails with no mistake id
(what an instructor sees for a failure no diagnosis recognises).

    PYTHONPATH=$PWD .venv/bin/python -m tests.grader.golden.make_class

Deterministic: the same releases and solutions write the same bytes. The class is committed; run
this only to change it, then regrade the golden outputs (tests/grader/golden/outputs.py).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ...support import submissions as sub

HERE = Path(__file__).resolve().parent
CLASS = HERE / "class"

CH11, CH12, CH13, CH14 = ("11_decoder_block", "12_lm_head_logits", "13_generation_kv_cache",
                          "14_training")
RELEASES = {"en": sub.REPO / "notebooks", "zh": sub.REPO / "notebooks-zh"}
_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", re.MULTILINE)


@dataclass(frozen=True)
class Edit:
    """In the answer cell `answer`, the line `old` (once there) becomes `new`; the
    mistake id the grader must diagnose is kept for reading (and checked by the test)."""

    answer: str
    old: str
    new: str
    mistake: str | None  # None: the answer is left as released ("not started")


_FFN_RESIDUAL = '    return u + swiglu_ffn(mid, layer["w_gate"], layer["w_up"], layer["w_down"])'

# student: (release language, {chapter: [planted mistakes]}); an empty list is a correct notebook
STUDENTS: dict[str, tuple[str, dict[str, list[Edit]]]] = {
    "ada": ("en", {
        CH11: [Edit("decoder_block", _FFN_RESIDUAL, _FFN_RESIDUAL.replace("u +", "x +"),
                    "11.decoder_block.second_residual_adds_x")],
        CH12: [Edit("next_token_loss", "    return -picked.mean()", "    return -picked.sum()",
                    "12.next_token_loss.summed")],
    }),
    "bo": ("zh", {
        # the same mistake as ada's, in the Chinese release: one id, counted for both
        CH11: [Edit("decoder_block", _FFN_RESIDUAL, _FFN_RESIDUAL.replace("u +", "x +"),
                    "11.decoder_block.second_residual_adds_x"),
               Edit("block_param_count", "    norms = 2 * h", "    norms = 0",
                    "11.block_param_count.norms_left_out")],
        CH13: [Edit("prefill_flops",
                    "    return 2 * (cfg.n_layers * (tokens * weights + attention) + lm_head)",
                    "    return cfg.n_layers * (tokens * weights + attention) + lm_head",
                    "13.prefill_flops.multiply_add_as_one_flop")],
    }),
    "chen": ("zh", {
        CH12: [Edit("model_param_count", "    return embedding + blocks + final_norm + lm_head",
                    "    return embedding + blocks + final_norm",
                    "12.model_param_count.one_vxh_matrix_counted")],
        CH14: [Edit("lr_at", "        return max_lr * (step + 1) / warmup_steps",
                    "        return max_lr * step / warmup_steps", "14.lr_at.warmup_off_by_one")],
    }),
    "dee": ("en", {CH11: [], CH12: [], CH13: [], CH14: []}),
    "eve": ("en", {
        CH13: [Edit("KVCache", "        if start_pos < 0 or end > self.max_seq_len:",
                    "        if start_pos < 0 or end >= self.max_seq_len:",
                    "13.KVCache.raises_when_exactly_full")],
        CH14: [Edit("get_batch", "    y = torch.stack([data[i + 1:i + context_len + 1] "
                    "for i in starts.tolist()])", "    y = x.clone()",
                    "14.get_batch.targets_not_shifted"),
               Edit("clip_grad_norm", "    return norm", "    return norm ** 2",
                    "14.clip_grad_norm.forgot_square_root"),
               Edit("bits_per_byte", "", "", None)],
    }),
}

# nbgrader's timestamp.txt of a few submissions (the others have none: lateness unknown), and
# the deadline the golden outputs are graded with: chen's is on time, eve's late.
DUE = "2026-03-01T23:59+01:00"
TIMESTAMPS = {("chen", CH14): "2026-03-01 20:15:00.000000 UTC",
              ("eve", CH14): "2026-03-02 09:30:00.000000 UTC"}


def expected_mistakes() -> dict[tuple[str, str, str], str | None]:
    """(student, chapter, exercise): the mistake id planted there (None: not started)."""
    return {(student, chapter, edit.answer): edit.mistake
            for student, (_lang, chapters) in STUDENTS.items()
            for chapter, edits in chapters.items() for edit in edits}


def submission(chapter: str, lang: str, edits: list[Edit]):
    """The release notebook of `chapter` in `lang` with every answer filled in, then `edits`."""
    nb = nbformat.read(RELEASES[lang] / chapter / f"{chapter}.ipynb", as_version=4)
    solution = sub.solution(sub.REPO / "solutions" / chapter / f"{chapter}.ipynb")
    planted = {edit.answer: edit for edit in edits}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("solution"):
            continue
        name = meta["grade_id"]
        edit = planted.pop(name, None)
        if edit is not None and edit.mistake is None:
            assert "raise NotImplementedError()" in cell.source, name
            continue  # not started: as released
        source = _MARKER.sub("", sub.cell(solution, name).source)
        if edit is not None:
            lines = source.split("\n")
            assert lines.count(edit.old) == 1, f"{chapter}/{name}: no line {edit.old!r}"
            source = "\n".join(edit.new if line == edit.old else line for line in lines)
        cell.source = source
    assert not planted, f"{chapter}: no answer cell {sorted(planted)}"
    return nb


def write_class(root: Path = CLASS) -> Path:
    if root.exists():
        shutil.rmtree(root)
    for student, (lang, chapters) in STUDENTS.items():
        for chapter, edits in chapters.items():
            path = root / student / chapter / f"{chapter}.ipynb"
            sub.write(submission(chapter, lang, edits), path)
            stamp = TIMESTAMPS.get((student, chapter))
            if stamp:
                (path.parent / "timestamp.txt").write_text(stamp + "\n", encoding="utf-8")
    return root


if __name__ == "__main__":
    print(f"wrote {write_class().relative_to(sub.REPO)}")
