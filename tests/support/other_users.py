"""A Python that a user other than root may run, for the tests that grade as one: a normal user
made with useradd, or the worker's own user in a container without CAP_SYS_ADMIN ("user"
isolation).

This machine's and CI's interpreter is installed under /root (pyenv), a folder closed to other
users (mode 700), so those users cannot start the course's .venv/bin/python. Instead of opening
/root, `python_for_other_users` builds, in a temporary folder every user may enter, a virtual
environment (`-m venv --without-pip`: a few files, well under a second) on a Python of the same
version installed where every user may run it (/usr/bin/python3.11 on Debian), whose one .pth
file adds the course environment's site-packages (torch, nbformat, ...; their own .pth files
too). Nothing outside that folder is changed, and the folder is removed when the test ends.

Where that cannot work (no such Python, no venv module, or the course's packages themselves in a
folder other users cannot enter) the test is skipped with one line saying which."""

from __future__ import annotations

import contextlib
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

from checks.grader.isolation import readable_by_others

# Where a system's own Python lives; then whatever PATH finds (pyenv's shims under /root are
# filtered out by readable_by_others).
SYSTEM_BINS = ("/usr/local/bin", "/usr/bin", "/bin")


class NoPythonForOtherUsers(Exception):
    """Why no Python other users may run can be had here (the test skips with it)."""


def _course_packages() -> list[str]:
    """The site-packages folders this interpreter imports the course's needs from."""
    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def _runs_as_is() -> bool:
    """Whether other users can already run this interpreter with its packages."""
    return all(readable_by_others(p) for p in [
        sys.executable, os.path.realpath(sys.executable), sys.prefix, *_course_packages()])


def _abi(python: str) -> str | None:
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c",
             "import sysconfig; print(sysconfig.get_config_var('SOABI'))"],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _same_python_elsewhere() -> str:
    """A Python of this one's version and extension ABI, installed where every user may run
    it (its compiled packages, torch's included, load in it)."""
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    own = sysconfig.get_config_var("SOABI")
    path = os.pathsep.join([*SYSTEM_BINS, os.environ.get("PATH", "")])
    seen = set()
    for folder in path.split(os.pathsep):
        found = shutil.which(name, path=folder) if folder else None
        if not found or os.path.realpath(found) in seen:
            continue
        seen.add(os.path.realpath(found))
        if readable_by_others(os.path.realpath(found)) and _abi(found) == own:
            return found
    raise NoPythonForOtherUsers(
        f"no {name} (ABI {own}) that other users may run is installed (this one, "
        f"{os.path.realpath(sys.executable)}, is in a folder they cannot enter)")


def _open_temp_folder() -> Path:
    """A new folder every user may enter (pytest's own tmp_path is closed to other users)."""
    for parent in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
        if os.path.isdir(parent) and readable_by_others(parent):
            folder = Path(tempfile.mkdtemp(prefix="checks-python-", dir=parent))
            os.chmod(folder, 0o755)
            return folder
    raise NoPythonForOtherUsers("no temporary folder other users may enter")


def _venv_with_course_packages(base: str, folder: Path) -> str:
    packages = _course_packages()
    closed = [p for p in packages if not readable_by_others(p)]
    if closed:
        raise NoPythonForOtherUsers(
            f"the course's packages ({closed[0]}) are in a folder other users cannot enter")
    venv = folder / "venv"
    done = subprocess.run([base, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise NoPythonForOtherUsers(
            f"{base} -m venv failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    python = venv / "bin" / "python"
    target = subprocess.run([str(python), "-I", "-c", "import site; "
                             "print(site.getsitepackages()[0])"],
                            capture_output=True, text=True, timeout=30).stdout.strip()
    # addsitedir, not a bare path: the course environment's own .pth files (an editable
    # install of the course) are read too, as in .venv itself.
    (Path(target) / "_course_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in packages))
    return str(python)


@contextlib.contextmanager
def python_for_other_users() -> Iterator[str]:
    """The path of a Python that other users may run and that imports what this one does:
    this interpreter when they already may, else one built for the length of the `with`.
    Raises NoPythonForOtherUsers saying why there can be none."""
    if _runs_as_is():
        yield sys.executable
        return
    base = _same_python_elsewhere()
    folder = _open_temp_folder()
    try:
        yield _venv_with_course_packages(base, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
