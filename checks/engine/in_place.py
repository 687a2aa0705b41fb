"""Inputs changed in place: copies of a call's arguments taken before it, and the failure of a
function that wrote into them."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable
from typing import Any

import torch

from ..i18n import _
from ..mistakes import INPUT_CHANGED_IN_PLACE as IN_PLACE
from ..mistakes import Mistake
from .failures import CheckFailure

def snapshot_inputs(args: tuple, kwargs: dict, fn: Any = None) -> list[tuple[str, Any, Any]]:
    """(label, input, copy) for the tensors, lists and dicts among a call's arguments (nested
    ones too), labelled by parameter name where `fn`'s signature tells it."""
    names: list[str] = []
    with contextlib.suppress(Exception):
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    found: list[tuple[str, Any, Any]] = []

    def walk(label: str, value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if value.layout == torch.strided and value.device.type != "meta":
                with torch._C.DisableTorchFunctionSubclass():
                    found.append((label, value, value.detach().clone()))
        elif isinstance(value, (list, tuple, dict)) and depth < 4:
            if isinstance(value, list):
                found.append((label, value, list(value)))
            elif isinstance(value, dict):
                found.append((label, value, dict(value)))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in list(items)[:10_000]:
                walk(f"{label}[{key!r}]", item, depth + 1)

    for i, value in enumerate(args):
        walk(f"`{names[i]}`" if i < len(names) else f"argument {i + 1}", value, 0)
    for key, value in kwargs.items():
        walk(f"`{key}`", value, 0)
    return found


def changed_inputs(snapshot: list[tuple[str, Any, Any]], allowed: Iterable[str] = ()) -> list[str]:
    """Labels of the inputs in `snapshot` that are no longer what they were."""
    allowed = {a.strip("`") for a in allowed}
    changed = []
    for label, value, copy in snapshot:
        if label.strip("`").split("[")[0] in allowed:
            continue
        if isinstance(value, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():
                same = value.shape == copy.shape and value.dtype == copy.dtype and (
                    value.numel() == 0 or torch.equal(value.detach().reshape(-1).view(torch.uint8),
                                                      copy.reshape(-1).view(torch.uint8)))
        elif isinstance(value, list):
            same = len(value) == len(copy) and all(a is b for a, b in zip(value, copy))
        else:
            same = value.keys() == copy.keys() and all(value[k] is copy[k] for k in copy)
        if not same:
            changed.append(label)
    return changed


def in_place_failure(exercise: str, changed: list[str], seed: int | None = None,
                     hint: Mistake = IN_PLACE) -> "CheckFailure":
    """The failure of a function that changed its inputs: `hint` is the chapter's own mistake
    for it (`Check(..., in_place=...)`) or the engine's generic one."""
    what = ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")
    return CheckFailure(exercise, _("changed its input {inputs} in place.").format(inputs=what),
                        hint=hint, seed=seed)

