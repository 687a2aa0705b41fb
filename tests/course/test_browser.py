"""The learner's day in a real browser: JupyterLab, chapter 04, Run All, then a wrong and a right
answer; in the English release (notebooks/) and in the Chinese one (notebooks-zh/), whose blocks
must read in Chinese.

`jupyter lab` serves a temporary copy of the release (no token, on a free local port); Debian's
Chromium, driven by Playwright, opens chapter 04 and chooses Run > Run All Cells. Every
unstarted exercise must show its yellow "not started" block and the run must reach the last cell.
Then a wrong `project_qkv` goes into its answer cell: its self-check shows the red ✗ with the
diagnosis the checker gives for that mistake; a right one shows the green ✓.

The newest chapters, 15 (English) and 16 (Chinese), get Run All alone: every cell runs, none fails,
and each unstarted exercise shows its block.

Screenshots go to build/test-artifacts/browser/ (the Chinese run's to its zh/ folder). Needs the
`playwright` Python package (the `test` extra) and Debian's `chromium` (`make test` installs it
with apt-get when run as root); without them the test is skipped and says why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from checks import i18n, nb04
from checks.environment import LANG_ENV
from checks.engine import CheckFailure
from checks.exercises import SYLLABUS

from .test_release_notebooks_run import RELEASE, kernel_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "test-artifacts" / "browser"
RELEASES = {"en": RELEASE, "zh": ROOT / "notebooks-zh"}
# What each language's blocks say (the catalogue's words for "likely mistake: " and "passed").
WORDS = {"en": {"mistake": "likely mistake: ", "passed": "passed",
                "not_started": "not started yet"},
         "zh": {"mistake": "可能的错误：", "passed": "通过", "not_started": "尚未开始"}}
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]
CHAPTER = "04_self_attention"
SERVER_START_TIMEOUT = 90  # seconds for jupyter lab to answer
RUN_ALL_TIMEOUT = 300  # seconds for Run All on chapter 04 (about 30 s on 2 cores, more under load)
# The newest chapters, Run All only: 15 in English, 16 in Chinese (their learner-mode runs on
# SmolLM2 take one to two minutes each on 2 cores, more while other tests run).
# The two newest chapters of the syllabus (15 and 16 today), one in each release's language.
NEWEST = list(zip((chapter.folder for chapter in SYLLABUS[-2:]), ("en", "zh")))
NEWEST_RUN_ALL_TIMEOUT = 900
CELL_TIMEOUT = 60  # seconds for one cell and its rendered output

# The answers typed into the answer cell (the indentation is the cell's own).
WRONG = ("def project_qkv(x, w_q, w_k, w_v):\n"
         "    return x @ w_q, x @ w_v, x @ w_k\n")
RIGHT = ("def project_qkv(x, w_q, w_k, w_v):\n"
         "    return x @ w_q, x @ w_k, x @ w_v\n")

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the browser test needs the playwright package: "
    "pip install -e '.[test]' (make test does)")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"the browser test needs Debian's chromium at {CHROMIUM} "
                "(make test installs it with apt-get when run as root)", allow_module_level=True)


def _expected_diagnosis(lang: str) -> str:
    """What the checker says about WRONG in `lang`: the ✗ block must show this very hint."""
    namespace: dict = {}
    exec(WRONG, namespace)
    saved = os.environ.pop(LANG_ENV, None)
    try:
        with i18n.using(lang):
            nb04.check_project_qkv(namespace["project_qkv"], seed=0)
    except CheckFailure as failure:
        assert failure.hint, "the checker should name this mistake"
        with i18n.using(lang):
            return i18n._(failure.hint)
    finally:
        if saved is not None:
            os.environ[LANG_ENV] = saved
    raise AssertionError("the wrong answer passed its check")


def _exercises(lang: str, chapter: str = CHAPTER) -> list[str]:
    """The chapter's exercises (its answer cells' grade ids), in notebook order."""
    release = RELEASES[lang] / chapter / f"{chapter}.ipynb"
    nb = json.loads(release.read_text(encoding="utf-8"))
    meta = [cell["metadata"].get("nbgrader", {}) for cell in nb["cells"]]
    return [m["grade_id"] for m in meta if m.get("solution") and not m.get("grade")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _lab_settings(folder: Path) -> Path:
    """JupyterLab user settings of the learner's, less the news pop-up (no network here)."""
    path = folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return folder


def _stop(proc: subprocess.Popen) -> None:
    """End jupyter lab and its kernels (they share its process group)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(params=list(RELEASES))
def lang(request) -> str:
    return request.param


@pytest.fixture
def served_chapter() -> str:
    """The chapter jupyter lab serves (a test parametrized by this name serves another)."""
    return CHAPTER


@pytest.fixture
def artifacts(lang, served_chapter) -> Path:
    """Where this run's screenshots go (pictures of an earlier run of it are removed)."""
    folder = ARTIFACTS if lang == "en" else ARTIFACTS / lang
    if served_chapter != CHAPTER:
        folder = folder / served_chapter
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    return folder


@pytest.fixture
def lab_url(tmp_path, lang, served_chapter):
    """A running `jupyter lab` on a temporary copy of a chapter's release (04 unless the test
    says) in `lang`; its base URL. The kernel inherits no LLAMA_COURSE_LANG: the notebook
    chooses its language itself."""
    served = tmp_path / "course"
    shutil.copytree(RELEASES[lang] / served_chapter, served / served_chapter,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    port = _free_port()
    env = kernel_env(JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
                     JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
                     JUPYTERLAB_SETTINGS_DIR=str(_lab_settings(tmp_path / "lab-settings")),
                     JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"))
    env.pop(LANG_ENV, None)
    log = (tmp_path / "jupyter.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
         "--ip=127.0.0.1", "--ServerApp.token=", "--ServerApp.password=",
         "--ServerApp.port_retries=0", f"--ServerApp.root_dir={served}",
         "--allow-root"],  # CI runs as root
        cwd=served, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                log = (tmp_path / "jupyter.log").read_text()[-3000:]
                pytest.fail("jupyter lab exited:\n" + log)
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within {SERVER_START_TIMEOUT} s")
            time.sleep(0.2)  # polling interval, not a wait for an outcome
        yield url
    finally:
        _stop(proc)
        log.close()


def _fonts_env(tmp_path: Path) -> dict[str, str]:
    """Chromium's environment, with the course's CJK font added to the system's fonts (a test
    machine may have none, and the Chinese blocks would show as boxes in the screenshots)."""
    from checks.figures import packaged_font_path

    font = packaged_font_path()
    if font is None:
        return dict(os.environ)
    conf = tmp_path / "fonts.conf"
    conf.write_text('<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd"><fontconfig>'
                    '<include ignore_missing="yes">/etc/fonts/fonts.conf</include>'
                    f'<dir>{font.parent}</dir></fontconfig>', encoding="utf-8")
    return dict(os.environ, FONTCONFIG_FILE=str(conf))


@pytest.fixture
def page(tmp_path, artifacts):
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000},
            env=_fonts_env(tmp_path))
        try:
            tab = context.pages[0] if context.pages else context.new_page()
            tab.set_default_timeout(CELL_TIMEOUT * 1000)
            yield tab
        finally:
            context.close()


def _code_cell(page, text: str):
    """The one code cell whose text contains `text`."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").filter(has_text=text)
    assert cell.count() == 1, f"{cell.count()} cells contain {text!r}"
    return cell


PROMPTS_JS = ("() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]"
              ".map(p => p.textContent.trim())")


def _run_all_done(page, artifacts: Path, timeout: float = RUN_ALL_TIMEOUT) -> None:
    """Wait until every code cell shows an execution count ([n]:, not [*]: or [ ]:). The first
    cell, the install cell, starts with its input collapsed: it shows no prompt at all."""
    done = "() => { const p = (" + PROMPTS_JS + ")().slice(1); " \
           r"return p.length > 0 && p.every(t => /^\[\d+\]:$/.test(t)); }"
    try:
        page.wait_for_function(done, timeout=timeout * 1000, polling=500)
    except sync_api.TimeoutError:
        page.screenshot(path=str(artifacts / "failed-run-all.png"))
        pytest.fail(f"Run All did not finish in {timeout} s; the prompts read "
                    f"{page.evaluate(PROMPTS_JS)}")


def _screenshot(cell, artifacts: Path, name: str) -> None:
    """Save a picture of a cell and its output (rendered once on screen: offscreen cells are
    skipped by the browser's content-visibility)."""
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-OutputArea-output").last.wait_for(state="visible")
    cell.screenshot(path=str(artifacts / name))


def _answer(page, answer_cell, test_cell, code: str, expected: str) -> None:
    """Replace the answer, run it and its self-check (Shift+Enter twice), wait for `expected`."""
    answer_cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(code)  # as pasted: no auto-indent or closing brackets
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    test_cell.locator(".jp-OutputArea-output", has_text=expected).wait_for()


def _wait_for_kernel(page, lab_url: str, chapter: str = CHAPTER) -> None:
    """Until the notebook's kernel is up: the server has an idle kernel for the notebook, and the
    status bar says so (Run All before that opens JupyterLab's "Select Kernel" dialog)."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while True:
        with urllib.request.urlopen(f"{lab_url}/api/sessions", timeout=5) as reply:
            sessions = json.load(reply)
        if any(s["path"].endswith(f"{chapter}.ipynb") and s.get("kernel")
               and s["kernel"].get("execution_state") == "idle" for s in sessions):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"no idle kernel for the notebook within {SERVER_START_TIMEOUT} s: "
                        f"{sessions}")
        time.sleep(0.2)  # polling interval, not a wait for an outcome
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$")).wait_for()


def test_run_all_then_a_wrong_and_a_right_answer(lab_url, page, lang, artifacts):
    diagnosis = _expected_diagnosis(lang)
    words = WORDS[lang]
    page.goto(f"{lab_url}/lab/tree/{CHAPTER}/{CHAPTER}.ipynb")
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for()
    _wait_for_kernel(page, lab_url)

    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    _run_all_done(page, artifacts)
    page.screenshot(path=str(artifacts / "01-run-all-done.png"))

    code_cells = page.locator(".jp-Notebook .jp-CodeCell")
    last = code_cells.nth(code_cells.count() - 1)
    _screenshot(last, artifacts, "02-last-cell.png")
    assert last.locator(".jp-OutputArea-output").count() > 0, "the last cell shows no output"
    assert page.locator(".jp-Notebook .jp-OutputArea-output[data-mime-type="
                        "'application/vnd.jupyter.stderr']").count() == 0, "a cell failed"

    not_started = page.locator(".jp-Notebook .llama-course-not-started")
    names = [text.split(":")[0].lstrip("… ").strip() for text in not_started.all_text_contents()]
    assert names == _exercises(lang), "one 'not started' block per exercise, in order"
    assert all(words["not_started"] in text for text in not_started.all_text_contents())

    answer_cell = _code_cell(page, "def project_qkv(")
    test_cell = _code_cell(page, "check_project_qkv(project_qkv)")
    _screenshot(test_cell, artifacts, "03-not-started.png")

    _answer(page, answer_cell, test_cell, WRONG, "✗ project_qkv")
    _screenshot(test_cell, artifacts, "04-wrong-answer.png")
    failure = test_cell.locator(".jp-OutputArea-output", has_text="✗ project_qkv").text_content()
    assert words["mistake"] + " ".join(diagnosis.split()) in " ".join(failure.split())
    if lang != "en":
        assert "likely mistake" not in failure and "random inputs" not in failure

    _answer(page, answer_cell, test_cell, RIGHT, "✓ project_qkv")
    _screenshot(test_cell, artifacts, "05-right-answer.png")
    assert words["passed"] in test_cell.locator(".jp-OutputArea-output").last.text_content()


def _run_all(page, lab_url: str, chapter: str, artifacts: Path, timeout: float) -> None:
    """Open `chapter`, wait for its kernel, choose Run > Run All Cells and wait for the end."""
    page.goto(f"{lab_url}/lab/tree/{chapter}/{chapter}.ipynb")
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for()
    _wait_for_kernel(page, lab_url, chapter)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    _run_all_done(page, artifacts, timeout)


@pytest.mark.parametrize("served_chapter, lang", NEWEST)
def test_run_all_reaches_the_end_of_the_newest_chapters(lab_url, page, lang, artifacts,
                                                         served_chapter):
    """A learner's Run All on a fresh release of a newest chapter: every cell runs, none fails
    (no stderr output), and each unstarted exercise shows its "not started" block, in order,
    in the release's language; the later cells use the course's reference instead."""
    _run_all(page, lab_url, served_chapter, artifacts, NEWEST_RUN_ALL_TIMEOUT)
    page.screenshot(path=str(artifacts / "01-run-all-done.png"))
    code_cells = page.locator(".jp-Notebook .jp-CodeCell")
    last = code_cells.nth(code_cells.count() - 1)
    _screenshot(last, artifacts, "02-last-cell.png")
    assert page.locator(".jp-Notebook .jp-OutputArea-output[data-mime-type="
                        "'application/vnd.jupyter.stderr']").count() == 0, "a cell failed"
    not_started = page.locator(".jp-Notebook .llama-course-not-started")
    names = [text.split(":")[0].lstrip("… ").strip() for text in not_started.all_text_contents()]
    assert names == _exercises(lang, served_chapter), "one 'not started' block per exercise"
    assert all(WORDS[lang]["not_started"] in text for text in not_started.all_text_contents())
