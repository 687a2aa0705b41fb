"""The grader: instructors only, never imported by a notebook. It may import the learner-facing
core and the model loader, never `checks.tools`.

The modules, in the order a notebook meets them (`python -m checks grade`):

- `cli`: `python -m checks status|grade`: the arguments onto the options, the library's call.
- `api`: grading as a library (`grade_folder`, `grade_notebook`, `status`), what the commands do:
  finding the notebooks, grading them N at a time, the outputs written, the lines printed.
- `options`: the library's options (`GradeOptions`, `OutputOptions`); the flags map onto them.
- `visible`: `status` where the course has no source notebooks (a wheel): the learner's own
  notebooks' visible checks.
- `grading`: `grade_notebook`, the pipeline: the five stages below, in order, and the tripwire.
- `read`: stage 1, a notebook file -> a tree of nodes (or one readable line); cells' metadata.
- `identify`: stage 2, which chapter (and student) a notebook is; its source notebook.
- `build`: stage 3, the submission's code cells + the source's test cells -> the notebook to run.
- `run`: stage 4, its cells in a worker; each test cell decided here, on the worker's functions.
- `score`: stage 5, nbgrader's rule for each test cell -> exercise results.
- `results`: what grading produces (exercise and notebook results, errors, incidents).
- `tripwire`: the files no notebook may change, hashed before and compared after each notebook.
- `worker`: the grader's side of one worker process: starting it, the protocol, closing it.
- `remote`: the learner's functions and objects as the grader sees them; their exceptions.
- `library`: the worker's copy of `checks` (an allow-list; answers and checkers withheld).
- `isolation`: the walls (namespaces, the worker's user, environment, view of the files).
- `memory`: the worker's memory limit (a cgroup, or a watch on resident memory).
- `limits`: the worker's budgets (time, CPU, output, threads) and resource limits.
- `zygote`: a torch-loaded process that forks walled-in workers quickly.
- `jail`: the walled-in worker's start, standard library only (run as a script).
- `batch`, `report`: many notebooks `--jobs` at a time; the tables, progress and incident lines.
- `outputs/`: what a run leaves for the instructor, written as each notebook finishes: the JSON
  (atomic, merged with an earlier run), the gradebook CSVs, feedback HTML, the class summary,
  lateness.
- `gradescope/`: `python -m checks gradescope`: the autograder zip and what runs inside it.
- `nbgrader_plugins`: the preprocessors nbgrader_config.py adds to nbgrader's autograde and
  feedback steps (hidden tests out of feedback; renamed or deleted cells survived).

In the worker's library, and only these of grader/ (`library.WORKER_GRADER_MODULES`):

- `worker_side`: the worker's main loop; the graded chapter's check stubs (`echo_check`).
- `channel`: framing between the two processes; `WorkerGone`.
- `wire`: the worker's replies, encoded so that the grader can decode them safely.
- `tensors`: tensors and gradients across the channel (both sides).
- `audit`: the audit hook of a worker without walls.

Nothing here imports a module outside these lists' order of trust: the worker-side modules import
only each other and the learner-facing core.
"""
