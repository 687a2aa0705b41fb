"""The red team's fifth round (issue 34), the attacks on the grader's execution side: each one
replayed against a real worker, with the line the grader answers it with.

- a function whose call ran out of time is not called again: the test cells after it that call it
  are skipped at once, saying why (not another full time limit each);
- the grader's own "… still grading" line never lands in a test's captured stderr (any stderr
  fails a test, nbgrader's rule): an honest but slow first call keeps its point.
"""

from __future__ import annotations

import time

import pytest

from checks.grader import report
from checks.grader.grading import grade_notebook
from checks.grader.limits import Limits

from ..support import adversarial
from ..support import submissions as sub

pytestmark = pytest.mark.grader_workers

CHAPTER_04 = adversarial.SOLUTIONS / "04_self_attention" / "04_self_attention.ipynb"


def graded(nb, tmp_path, **limits):
    path = sub.write(nb, tmp_path / "student" / "submission.ipynb")
    return grade_notebook(path, limits=Limits(**{"cell_timeout": 60, **limits}))


def test_a_function_that_hung_is_not_called_again(tmp_path):
    """attention_scores loops forever: its own test costs one time limit; attention's test,
    which calls it (through attention, and as the helper handed to the check), is skipped at
    once with one line saying why; masked_softmax, which does not, keeps its points."""
    nb = adversarial.answer(adversarial.sol("04_self_attention"), "attention_scores",
                            "def attention_scores(q, k):\n    while True:\n        pass")
    started = time.monotonic()
    result = graded(nb, tmp_path, cell_timeout=8)
    elapsed = time.monotonic() - started
    by_name = {e.name: e for e in result.exercises}
    assert by_name["masked_softmax"].status == "passed"
    assert by_name["project_qkv"].status == "passed"
    assert by_name["attention_scores"].points == 0 and by_name["attention"].points == 0
    why = by_name["attention"].message
    assert "`attention_scores`, which ran past the time limit in test cell " \
           "check_attention_scores; not called again" in why, why
    assert "test cell check_attention was skipped: it calls `attention_scores`" in result.error
    assert "\n" not in result.error
    assert elapsed < 2 * 8 + 20, elapsed  # one time limit, not two


def test_the_still_grading_line_never_reaches_a_test_s_stderr(tmp_path, capsys):
    """The progress watch prints its line while a one-job run grades in this process, where a
    test cell's run captures sys.stderr: the line goes to the terminal, the slow but honest
    answer keeps its point."""
    nb = sub.solution()
    sub.cell(nb, "head_dim").source = (
        "import time\n_first = []\n"
        "def head_dim(cfg):\n"
        "    if not _first:\n        _first.append(1)\n        time.sleep(4)\n"
        "    return cfg.head_dim")
    progress = report.Progress([tmp_path / "x.ipynb"], jobs=1, heartbeat=0.3).start()
    try:
        result = graded(nb, tmp_path)
    finally:
        progress.stop()
    head_dim = next(e for e in result.exercises if e.name == "head_dim")
    assert (head_dim.status, head_dim.points) == ("passed", 1), head_dim.message
    assert "still grading" in capsys.readouterr().err
