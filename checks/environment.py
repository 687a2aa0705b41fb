"""Every environment variable the course reads, in one table (`ENVIRONMENT`), and the names its
readers use (`GRADING_ENV`, `LANG_ENV`, ...). Its own module because both `checks.context` and
`checks.i18n` read these names, and `context` translates through `i18n`: the table imports
nothing of the course, so neither has to import the other back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One environment variable the course reads: what it means and who sets it."""

    name: str
    meaning: str
    set_by: str


# Every environment variable the course reads, in one table; each reader uses the names below.
ENVIRONMENT = (
    EnvVar("LLAMA_COURSE_GRADING", "a machine runs this notebook: demonstrations run their "
           "smallest size, borrowing uses the reference", "checks status|grade, the test suite"),
    EnvVar("LLAMA_COURSE_QUICK_DEMOS", "a learner's run (unstarted exercises show their line and "
           "Run All goes on) with every demonstration at the grader's smallest size: a quick "
           "look through a release", "the test that runs every release notebook; an instructor "
           "previewing a release"),
    EnvVar("NBGRADER_EXECUTION", "nbgrader is executing the notebook (counts as grading)",
           "nbgrader autograde/validate"),
    EnvVar("LLAMA_COURSE_THREADS", "torch threads for this process (a grader's share of the "
           "cores)", "checks grade --jobs; a learner who wants more threads"),
    EnvVar("LLAMA_COURSE_CACHE", "where the real model's converted weights are cached",
           "the learner or instructor (optional)"),
    EnvVar("LLAMA_COURSE_LANG",
           "the language of every message: a code of checks.i18n.LANGUAGES (en, zh)",
           "the Chinese release's notebooks; anyone to override"),
    EnvVar("LLAMA_COURSE_PIP", "what a notebook's install cell installs (a wheel, a git URL)",
           "tests, mirrors"),
    EnvVar("LLAMA_COURSE_NOTEBOOKS", "the folder that holds the learner's own notebooks, for a "
           "later chapter's borrowing (a notebook opened alone, as in Colab: a Drive folder)",
           "the learner (optional)"),
    EnvVar("CHECKS_SEED", "pins the checks' random seed, to reproduce a failure",
           "the learner (optional)"),
    EnvVar("CHECKS_AUDIT", "the worker installs its audit hook", "the grader, for its workers"),
    EnvVar("CHECKS_PROTECT", "paths the worker's audit hook refuses to change",
           "the grader, for its workers"),
    EnvVar("AUTOGRADER_ROOT", "the Gradescope layout's root (source/, submission/, results/); "
           "default /autograder", "tests emulating Gradescope"),
    EnvVar("CHECKS_PYTHON", "the Python that the Gradescope autograder runs the grader with; "
           "default python3", "tests, an instructor's container"),
    EnvVar("OMP_NUM_THREADS", "torch threads (when LLAMA_COURSE_THREADS is not set)",
           "the user, the test suite"),
)
ENV = {var.name: var for var in ENVIRONMENT}

GRADING_ENV = ENV["LLAMA_COURSE_GRADING"].name
THREADS_ENV = ENV["LLAMA_COURSE_THREADS"].name
QUICK_DEMOS_ENV = ENV["LLAMA_COURSE_QUICK_DEMOS"].name
CACHE_ENV = ENV["LLAMA_COURSE_CACHE"].name
LANG_ENV = ENV["LLAMA_COURSE_LANG"].name
PIP_ENV = ENV["LLAMA_COURSE_PIP"].name
NOTEBOOKS_ENV = ENV["LLAMA_COURSE_NOTEBOOKS"].name
SEED_ENV = ENV["CHECKS_SEED"].name
AUDIT_ENV = ENV["CHECKS_AUDIT"].name
PROTECT_ENV = ENV["CHECKS_PROTECT"].name
_NBGRADER_ENV = ENV["NBGRADER_EXECUTION"].name
