"""The grader: instructors only, never imported by a notebook.

`python -m checks status|grade` (`cli`), the grading pipeline (read a submission, identify its
chapter, rebuild it from the source's test cells, run it in a walled-in worker, score it), and the
trust boundary around the worker (`sandbox`, `wire`, `jail`). It may import the learner-facing core
and the model loader, never `checks.tools`. Only the worker-side pieces listed in
`sandbox.WORKER_GRADER_MODULES` are copied into a worker's library.
"""
