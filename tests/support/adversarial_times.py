"""The catalogue's cases of submission times (issue 26): every file the grader reads from a
submission is untrusted, nbgrader's `timestamp.txt` as much as the notebook. Each case is a
student's folder `folder/<case>/01_notation/` in nbgrader's layout (the assignment folder), with a
timestamp.txt that attacks the grader: a time past what UTC can hold (OverflowError ended the
whole class's run), a link to /proc/kmsg (a read that never ends, as root), 192 MiB (the parse
error repeated the text: 2 GiB), binary garbage, a hard link, and a notebook one folder down
beside a forged on-time timestamp.txt of its own (believed: a late student marked on time).
Each notebook is a whole solution: full marks, and "submission time unknown" in one warning, or
the assignment folder's own time. `TIMES` join the catalogue (`adversarial.CATALOGUE`) with their
claim; `submitted_at` says which time a case's record must show."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import adversarial, submissions as sub
from .adversarial import Where, full, sol
from .adversarial_edges import EdgeCase

CLAIM = "submission-times"
PROTECTED = {
    CLAIM: "A submission's time is read only from nbgrader's own timestamp.txt of its assignment "
           "folder, as a regular file with one name and a few bytes: a link, a hard link, a "
           "large file, a time past what UTC holds or garbage means \"submission time unknown\" "
           "in one warning, and the class is graded on.",
}
ON_TIME = "2026-03-01 10:00:00.000000 UTC"
LATE = "2026-03-05 10:00:00.000000 UTC"
UNKNOWN = "submission time unknown"


@dataclass
class TimeCase(EdgeCase):
    submitted_at: str | None = None  # the record's submitted_at (ISO, UTC); None: unknown


def _with_stamp(make_stamp):
    """The solution in the assignment folder, and a timestamp.txt made by `make_stamp(path)`."""
    def make(where: Where, folder: Path) -> None:
        assignment = folder / "01_notation"
        sub.write(sol(), assignment / "01_notation.ipynb")
        make_stamp(assignment / "timestamp.txt")
    return make


def _text(text: str):
    return lambda path: path.write_text(text)


def _kmsg(path: Path) -> None:
    path.symlink_to("/proc/kmsg")


def _huge(path: Path) -> None:
    with open(path, "wb") as stream:  # sparse: 192 MiB to read, nothing on the disk
        stream.truncate(192 * 2**20)


def _garbage(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00" * 8)


def _hard_linked(path: Path) -> None:
    """An on-time time under two names (the other outside the class)."""
    other = path.parents[3] / "other_section" / "stamp.txt"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text(ON_TIME)
    os.link(other, path)


def _nested_forgery(where: Where, folder: Path) -> None:
    """nbgrader's timestamp.txt in the assignment folder says late; the notebook one folder down
    brings an on-time one of its own."""
    assignment = folder / "01_notation"
    assignment.mkdir(parents=True)
    (assignment / "timestamp.txt").write_text(LATE)
    sub.write(sol(), assignment / "mine" / "01_notation.ipynb")
    (assignment / "mine" / "timestamp.txt").write_text(ON_TIME)


TIMES: list[TimeCase] = [
    TimeCase("c10_stamp_overflow", _with_stamp(_text("9999-12-31T23:59:59-23:59")),
             "01_notation", full(), "a time past what UTC holds (OverflowError ended the run)",
             CLAIM, warning=UNKNOWN, student="c10_stamp_overflow"),
    TimeCase("c10_stamp_kmsg", _with_stamp(_kmsg), "01_notation", full(),
             "timestamp.txt linked to /proc/kmsg (a read that never ends, as root)", CLAIM,
             warning=UNKNOWN, student="c10_stamp_kmsg"),
    TimeCase("c10_stamp_192_mib", _with_stamp(_huge), "01_notation", full(),
             "a 192 MiB timestamp.txt (2 GiB in the grader)", CLAIM, warning=UNKNOWN,
             student="c10_stamp_192_mib"),
    TimeCase("c10_stamp_garbage", _with_stamp(_garbage), "01_notation", full(),
             "binary garbage", CLAIM, warning=UNKNOWN, student="c10_stamp_garbage"),
    TimeCase("c10_stamp_hard_link", _with_stamp(_hard_linked), "01_notation", full(),
             "an on-time timestamp.txt with two names", CLAIM, warning=UNKNOWN,
             student="c10_stamp_hard_link"),
    TimeCase("c10_stamp_nested_forgery", _nested_forgery, "01_notation", full(),
             "a notebook one folder down with an on-time timestamp.txt of its own: the "
             "assignment folder's (late) time is the one", CLAIM,
             warning="nested below its assignment folder", student="c10_stamp_nested_forgery",
             submitted_at="2026-03-05T10:00:00+00:00"),
    TimeCase("c10_zz_victim", _with_stamp(_text(ON_TIME)), "01_notation", full(),
             "an honest solution graded after the attacks, with nbgrader's time", CLAIM,
             student="c10_zz_victim", submitted_at="2026-03-01T10:00:00+00:00"),
]

if not any(case.name == TIMES[0].name for case in adversarial.CATALOGUE):
    adversarial.CATALOGUE += TIMES
    adversarial.PROTECTED.update(PROTECTED)
