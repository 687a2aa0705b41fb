"""`python -m checks`: `doctor` (what a bug report needs: `checks.doctor`), else the grader's
commands, `status` and `grade` (`checks.grader.cli`), and `gradescope` (an autograder zip:
`checks.grader.gradescope.build`). The grader is imported only for those:
`doctor` must run where the grader's own needs are missing."""

import sys

if sys.argv[1:2] == ["doctor"]:
    from .doctor import main as doctor

    sys.exit(doctor(sys.argv[2:]))

if sys.argv[1:2] == ["gradescope"]:
    from .grader.gradescope.build import main as gradescope

    sys.exit(gradescope(sys.argv[2:]))

from .grader.cli import main

sys.exit(main())
