"""Entry point of a grading worker process: `python -m checks._worker READ_FD WRITE_FD`
(see checks.sandbox)."""

import sys

from checks.sandbox import _worker_main

if __name__ == "__main__":
    _worker_main(int(sys.argv[1]), int(sys.argv[2]))
