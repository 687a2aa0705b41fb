"""A demonstration cell's file never lands in the course's folders (chapter 14 saves its model):
in memory under a grader, in a fresh temporary folder for a learner."""

import io
import os
import tempfile
from pathlib import Path

from checks import context
from checks.environment import GRADING_ENV


def test_under_a_grader_the_file_is_in_memory(monkeypatch):
    monkeypatch.setenv(GRADING_ENV, "1")
    assert isinstance(context.demo_file("model.pt"), io.BytesIO)


def test_a_learners_file_goes_to_a_fresh_temporary_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(GRADING_ENV, raising=False)
    monkeypatch.setattr(context, "grading", lambda: False)
    monkeypatch.chdir(tmp_path)
    first, second = context.demo_file("model.pt"), context.demo_file("model.pt")
    assert first.name == "model.pt" and first.parent != second.parent
    assert Path(tempfile.gettempdir()) in first.parents and first.parent.is_dir()
    assert tmp_path not in first.parents and not os.listdir(tmp_path)
