"""The engine's state while a check runs: which exercise is calling the learner (for the grader's
worker), whether arguments are written back, whether checks are quiet, how many are open, and
fresh seeds. Everything here is a context variable: nested and concurrent checks keep their own."""

from __future__ import annotations

import contextlib
import contextvars
import os
import secrets

from ..environment import SEED_ENV


# (exercise, forbidden names and hints) of the Check calling the learner now. The grader's side of
# a worker (checks.grader.worker) reads it to apply the same guards to a call it forwards.
calling: contextvars.ContextVar = contextvars.ContextVar("checks_engine_calling", default=None)

# Set (to True) by a check whose exercise changes its arguments in place by design (chapter 14's
# clip_grad_norm, adamw_step, train_step): a call the grader forwards to the worker then brings the
# arguments back as the learner's function left them, and the grader puts them into its own
# objects (checks.grader.tensors.write_back) instead of failing as "changed its input in place".
writes_back: contextvars.ContextVar = contextvars.ContextVar("checks_writes_back", default=False)


def is_remote(f) -> bool:
    """Whether `f` runs elsewhere (a learner's function in the grader's worker), not in this
    process: such proxies say so with a true `_checks_remote` attribute."""
    return bool(getattr(f, "_checks_remote", False))

_quiet = contextvars.ContextVar("checks_quiet", default=False)
_open_checks = contextvars.ContextVar("checks_open", default=0)  # how many Checks are running


def fresh_seed() -> int:
    """A new seed per check, unless CHECKS_SEED pins one (for reproducing a failure)."""
    pinned = os.environ.get(SEED_ENV)
    return int(pinned) if pinned else secrets.randbelow(2**31)


@contextlib.contextmanager
def quiet():
    """Suppress the pass display (used when a check only decides which implementation to use)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)

