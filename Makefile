# The course's commands. Everything runs in the course environment .venv/ (see README.md).
PYTHON ?= python3
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ORACLE := $(VENV)/.installed-oracle

.PHONY: lab test release release-check

# Learners: set up .venv when missing, then open JupyterLab on the learner notebooks.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# Maintainers and CI: set up .venv when missing, then run the whole test suite: the checks
# package's tests, and every solution notebook executed top to bottom (nbval).
test: $(STAMP) $(ORACLE)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q tests
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q --nbval-lax -p no:cacheprovider solutions

# The environment, rebuilt only when missing or when pyproject.toml changed. torch is pinned in
# pyproject.toml, so pip installs the normal build for this platform once.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else \
	  "Python 3.10 or newer is needed (found " + sys.version.split()[0] + "); set PYTHON=...")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $(STAMP)

# The test-only extra: Hugging Face transformers for the oracle tests (no weights are downloaded).
$(ORACLE): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[oracle]"
	touch $(ORACLE)

# Regenerate the learner notebooks (notebooks/) from solutions/ with nbgrader, in a temporary
# course directory; chapters whose source is gone are removed from notebooks/.
release: $(STAMP)
	$(PY) -m checks.release

# Exit 1, naming the chapters, when the committed notebooks/ is out of date.
release-check: $(STAMP)
	$(PY) -m checks.release --check
