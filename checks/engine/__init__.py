"""The comparison engine behind every self-check, one module per job.

A checker opens a `Check` (check.py), feeds the learner's function inputs through `Check.call`,
and compares what comes back with `expect_tensor` / `expect_equal`. Comparisons go shape and
dtype first, then values (compare.py); when values disagree, the wrong output is compared with
known-wrong variants so that the failure can name the likely mistake. Failures are `CheckFailure`
(an `AssertionError`, failures.py) and render as one short red block in Jupyter instead of a
traceback. While the learner's function runs, forbidden library calls fail the check
(forbid.py), inputs it writes into are caught (in_place.py), and the earlier exercises it calls
are recorded so that a knock-on failure names its root (calls.py). state.py holds what the
engine knows while a check runs (context variables: the exercise calling, quiet, seeds).

This face re-exports what the chapters, the grader and the tests use.
"""

from .calls import CallRecord, builds_on, earlier_failures, fix_first_text
from .check import Check
from .compare import (describe, matches, mismatch_text, numbers_apart, tolerance,
                      values_close)
from .failures import SEED_LINE, CheckFailure, ForbiddenCall, LearnerError, NotStarted
from .forbid import _Forbid, as_mistake
from .in_place import IN_PLACE, changed_inputs, in_place_failure, snapshot_inputs
from .state import _open_checks, calling, fresh_seed, is_remote, quiet, writes_back

__all__ = ["CallRecord", "builds_on", "earlier_failures", "fix_first_text", "Check", "describe",
           "matches", "mismatch_text", "numbers_apart", "tolerance", "values_close", "SEED_LINE",
           "CheckFailure", "ForbiddenCall", "LearnerError", "NotStarted", "_Forbid",
           "as_mistake", "IN_PLACE", "changed_inputs", "in_place_failure", "snapshot_inputs",
           "_open_checks", "calling", "fresh_seed", "is_remote", "quiet", "writes_back"]
