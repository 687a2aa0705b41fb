"""environment.yml (conda) and pyproject.toml (pip) must install the same packages."""

import pathlib
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pyproject_deps() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return data["project"]["dependencies"]


def _conda_pip_deps() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip section"
    return [d for d in pip_sections[0] if not d.startswith("-e")]


def test_same_runtime_packages():
    assert sorted(_conda_pip_deps()) == sorted(_pyproject_deps())


def test_conda_installs_the_course_package():
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip


def test_torch_is_pinned_exactly():
    # An unpinned torch pulls a multi-GB CUDA build on machines that have the CPU wheel on disk.
    torch_specs = [d for d in _pyproject_deps() if d.startswith("torch")]
    assert torch_specs == ["torch==2.13.0"]


def test_nbgrader_pins_match_its_lab_extension():
    # nbgrader 0.9.6's JupyterLab extension is built against @jupyterlab/application ^4.4 and
    # @jupyter-notebook/application ^7.4; older servers load it with errors.
    deps = " ".join(_pyproject_deps())
    assert "jupyterlab>=4.4,<5" in deps and "notebook>=7.4,<8" in deps
