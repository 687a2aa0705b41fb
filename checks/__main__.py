"""`python -m checks`: see `checks.cli`."""

import sys

from .cli import main

sys.exit(main())
