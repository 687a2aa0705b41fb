"""What an object holds in tensors: each distinct storage once (chapter 13's `tensor_nbytes`, what
a KV cache costs, and the KVCache check's test that `update` returns views of the cache's own
buffers). A module of its own, imported by chapter 13's checks and the notebook alike, so that
the grader's worker has it whichever chapter it grades."""

from __future__ import annotations

import torch


def storages(obj, depth: int = 0, seen: set | None = None) -> dict[int, torch.Tensor]:
    """The floating-point tensors reachable from obj's attributes, one per distinct storage."""
    seen = set() if seen is None else seen
    found: dict[int, torch.Tensor] = {}
    if id(obj) in seen or depth > 5:
        return found
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            found[obj.untyped_storage().data_ptr()] = obj
        return found
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and \
            type(obj).__module__.split(".")[0] not in ("torch", "builtins"):
        items = list(vars(obj).values())
    else:
        return found
    for item in items:
        found.update(storages(item, depth + 1, seen))
    return found


def numbers_held(held: dict[int, torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() // t.element_size() for t in held.values())


def tensor_nbytes(obj) -> int:
    """Bytes of memory held by the floating-point tensors reachable from obj's attributes (lists,
    tuples and dicts included), each underlying storage counted once: what a cache object costs."""
    return sum(t.untyped_storage().nbytes() for t in storages(obj).values())
