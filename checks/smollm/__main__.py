"""`python -m checks.smollm --prepare|--info`: see `checks.smollm.main`."""

import sys

from . import main

sys.exit(main())
