"""Forbidden shortcuts: a torch-function mode that fails the check when the learner's code calls a
library function the exercise asks them to write."""

from __future__ import annotations

from collections.abc import Mapping
from torch.overrides import TorchFunctionMode

from ..i18n import _
from ..mistakes import FORBIDDEN_CALL, Mistake
from .failures import ForbiddenCall

def as_mistake(hint: str | None, key: str) -> Mistake | None:
    """A hint as a declared mistake: itself when it is one, else under the engine's `key`."""
    if hint is None or isinstance(hint, Mistake):
        return hint
    return Mistake(key, hint)


class _Forbid(TorchFunctionMode):
    """Raise ForbiddenCall when the learner's code reaches a forbidden torch function.

    `forbidden` maps function names (`__name__`, e.g. "softmax") to the hint shown.

    A torch-function mode sees every torch API call however it was imported (`F.softmax`,
    `torch.softmax`, `x.softmax`), so renaming the import does not get around it.
    """

    def __init__(self, check, forbidden: Mapping[str, str]):  # check: the running Check
        super().__init__()
        self.check = check
        self.forbidden = forbidden

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        # `torch.ops.aten` operators carry an overload suffix ("softmax.int"): match the base too.
        key = name if name in self.forbidden else name.split(".")[0]
        if key in self.forbidden:
            raise ForbiddenCall(self.check.exercise, _("calls `{name}`, which this exercise asks "
                                "you to write yourself.").format(name=name),
                                hint=as_mistake(self.forbidden[key], FORBIDDEN_CALL))
        return func(*args, **(kwargs or {}))

