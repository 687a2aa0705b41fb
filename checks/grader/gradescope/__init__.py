"""Gradescope: `python -m checks gradescope CHAPTER -o autograder.zip` builds an autograder for
Gradescope (a fresh container per submission), for classes that outgrow one machine.

- build.py      the command: which chapters, the zip (the course's package, the chapters' source
                notebooks, the templates below)
- autograde.py  what run_autograder runs inside the container: `python -m checks grade` on the
                submission, then results.json in Gradescope's format (one test per exercise)
- templates/    setup.sh, run_autograder and the instructor's README, as they go into the zip
"""
