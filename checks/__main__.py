"""`python -m checks`: see `checks.grader.cli`."""

import sys

from .grader.cli import main

sys.exit(main())
