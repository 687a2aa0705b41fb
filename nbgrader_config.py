r"""nbgrader settings for this course (nbgrader 0.9.6).

Layout, relative to this file (nbgrader's `{nbgrader_step}/{student_id}/{assignment_id}`; the
source and release steps use the student id `.`):

    solutions/NN_slug/NN_slug.ipynb                       source: instructor notebooks
    notebooks/NN_slug/NN_slug.ipynb                       release: learner notebooks (committed)
    grading/submitted/STUDENT/NN_slug/NN_slug.ipynb       submissions you collected
    grading/autograded/STUDENT/NN_slug/...                written by `nbgrader autograde`
    grading/feedback/STUDENT/NN_slug/...                  written by `nbgrader generate_feedback`
    grading/gradebook.db                                  the sqlite gradebook

`grading/` is ignored by git. Run nbgrader from the repository root (this file is read from the
current directory), with the course environment's `bin/` on PATH: nbgrader runs the `alembic`
command to set up its database.

Release the learner notebooks with `make release` (python -m checks.tools.release), not with
`nbgrader generate_assignment --force` here: --force deletes notebooks/NN_slug first. Before
autograding a chapter, record it in the gradebook without touching notebooks/ (the notebook it
writes to grading/release/ is byte-identical to the committed release):

    nbgrader generate_assignment 01_notation --force \
        --CourseDirectory.release_directory=grading/release
    nbgrader autograde 01_notation        # every student under grading/submitted/
    nbgrader export --to grading/grades.csv
"""

import os

c = get_config()  # noqa: F821 (provided by traitlets when it reads this file)

HERE = os.path.dirname(os.path.abspath(__file__))

# --- where things live -------------------------------------------------------------------------
c.CourseDirectory.course_id = "llama-transformer"
c.CourseDirectory.root = HERE
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = os.path.join("grading", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("grading", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("grading", "feedback")
c.CourseDirectory.solution_directory = os.path.join("grading", "solution")
c.CourseDirectory.source_with_tests_directory = os.path.join("grading", "source_with_tests")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(HERE, "grading", "gradebook.db")
# A chapter's translations (solutions/NN_slug/NN_slug.zh.json, one per language of the table in
# checks.i18n) are sources of the translated releases (notebooks-zh/, made by `make release`),
# never files handed to students.
try:
    from checks.i18n import translated_languages
    _TRANSLATIONS = ["*" + lang.translation_suffix for lang in translated_languages()]
except ImportError:  # nbgrader run without the course installed: the one translation there is
    _TRANSLATIONS = ["*.zh.json"]
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback",
                            *_TRANSLATIONS]
# sqlite creates the database file but not its folder.
os.makedirs(os.path.join(HERE, "grading"), exist_ok=True)

# --- what the learner gets ---------------------------------------------------------------------
# The code between `### BEGIN SOLUTION` and `### END SOLUTION` becomes this stub. The checks package
# reads NotImplementedError as "not started".
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# --- autograding -------------------------------------------------------------------------------
# Per-cell time limit in seconds. A hidden test runs the thorough checks; on a slow laptop the
# heaviest chapters need a few seconds, so two minutes is generous and still stops an infinite loop.
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True
# A deleted test cell is put back (after the answer cell before it) and graded as usual. Edited
# locked cells are always restored from the gradebook, hidden tests included. (autograde then logs
# "Attribute 'checksum' for cell check_... has changed!" for each test cell with hidden tests: the
# gradebook's checksum is of the instructor's cell, the learner's copy never had the hidden part.)
c.OverwriteCells.add_missing_cells = True
# nbgrader 0.9.6's OverwriteCells crashes the whole submission (`KeyError: 'grade_id'`, export
# 0.0) when an answer cell was renamed, or deleted along with its test cell; this subclass puts the
# missing test cells back after the nearest cell the submission still has (checks/grader/).
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "checks.grader.nbgrader_plugins.RestoreMissingCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]

# --- feedback ----------------------------------------------------------------------------------
# The feedback students receive leaves the hidden tests out of the test cells (their one-line
# diagnosis still shows when one fails). HideTestCode first: an ordinary traceback in a test cell
# (a timeout's KeyboardInterrupt, a NameError) prints the lines around the failing one, hidden
# tests included, and the checker's frames; it keeps the exception's type and message and the
# frames in the learner's cells. The autograded notebook keeps the whole traceback.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "checks.grader.nbgrader_plugins.HideTestCode",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
