"""Entry point of a grading worker process: `python -m checks._worker READ_FD WRITE_FD`
(see checks.sandbox; the grader itself starts workers through checks/_jail.py or
`checks.sandbox.worker_main` directly)."""

import sys

from checks.sandbox import worker_main

if __name__ == "__main__":
    worker_main(int(sys.argv[1]), int(sys.argv[2]))
