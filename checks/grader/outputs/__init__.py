"""What `python -m checks grade` writes besides its table, each as results come in:

- store.py     the JSON report: rewritten atomically after each notebook, merged with the
               previous run's (a re-run grades only new or changed submissions), output paths
               checked before grading starts
- late.py      submission times (nbgrader's timestamp.txt of the assignment folder, read as
               untrusted data) against each assignment's due time (`--assignments`, its
               extensions, `--due`), and late penalties
- roster.py    `--roster`: the students' LMS ids, names and sections for the gradebook
- gradebook.py the CSVs: one row per student, a column per chapter (an LMS import) or per exercise
- feedback.py  one HTML page per student and chapter: points and diagnoses, nothing hidden
- summary.py   the class summary: per exercise, how many passed and the commonest diagnoses
- headlines.py a mistake told by the registry's message for its id, in the language asked for
               (the summary, the class report, feedback and Gradescope show it)

Every function here takes the JSON report's records (dicts), so that results kept from an
earlier run and results graded now are written the same way.
"""
