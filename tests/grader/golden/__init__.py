"""The golden class: a small fixed class of submissions (class/, written by make_class.py) and
what `python -m checks grade` made of it (expected/, written by outputs.py), normalised; the test
tests/grader/test_golden_class.py grades the class again and compares."""
