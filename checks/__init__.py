"""Self-checks and grading for the decoder-only Transformer course.

`checks.ModelConfig` and `checks.LLAMA2_7B` are the shared configuration; `checks.nbNN` (a
package per chapter) holds one `check_<exercise>` per graded exercise of chapter NN;
`checks.reference` is the course's own reference implementation; docs/maintainer/architecture.md
draws the rest. `python -m checks --help` lists the command line.
"""

from . import context, reference
from .config import LLAMA2_7B, ModelConfig
from .borrow import use_if_passing
from .engine import CheckFailure, NotStarted

context.configure_threads()

__all__ = ["context", "reference", "LLAMA2_7B", "ModelConfig", "CheckFailure", "NotStarted",
           "use_if_passing"]
