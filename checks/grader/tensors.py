"""Tensors across the channel, for both sides: the tensors in a nested value (in an order both
sides agree on), the value rebuilt around new ones, and gradients across the process boundary
(`attach_autograd`: outputs computed elsewhere become outputs of a local autograd node whose
backward pass asks the other side). `grad_leaf` and `as_is` are what the grader's pickles name
for the worker to call, so they live here, in the worker's library."""

from __future__ import annotations

from typing import Any

import torch

from . import wire


def flat_tensors(value: Any, out: list | None = None, depth: int = 0,
                 kind: type = torch.Tensor) -> list:
    """The tensors (or other objects of `kind`) in nested lists, tuples and dict values, in
    order (both sides agree)."""
    out = [] if out is None else out
    if depth > wire.MAX_DEPTH:
        return out
    if isinstance(value, kind):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            flat_tensors(v, out, depth + 1, kind)
    elif isinstance(value, dict):
        for v in value.values():
            flat_tensors(v, out, depth + 1, kind)
    return out


def generator_states(arguments: Any) -> list:
    """The states of the torch.Generators among a call's arguments, in order: the worker sends
    them back after the call, because a generator is state the caller keeps (two calls with one
    generator draw different numbers) and the worker only ever held a copy of it."""
    return [g.get_state() for g in flat_tensors(arguments, kind=torch.Generator)]


def set_generator_states(arguments: Any, states: Any) -> None:
    """Move the caller's generators on to where the worker's copies ended (`generator_states`);
    anything that is not one state per generator, as the generator's own kind of state, is
    ignored."""
    generators = flat_tensors(arguments, kind=torch.Generator)
    if not isinstance(states, list) or len(states) != len(generators):
        return
    for g, state in zip(generators, states):
        now = g.get_state()
        if type(state) is torch.Tensor and state.dtype == now.dtype and state.shape == now.shape:
            g.set_state(state.clone())


def map_leaves(value: Any, leaf, max_depth: int, depth: int = 0) -> Any:
    """`value` rebuilt with `leaf(x)` for everything that is not a plain list, tuple or dict
    (exact types: subclasses are leaves), front to back; below `max_depth`, left as it is."""
    if depth > max_depth:
        return value
    if type(value) is list:
        return [map_leaves(v, leaf, max_depth, depth + 1) for v in value]
    if type(value) is tuple:
        return tuple(map_leaves(v, leaf, max_depth, depth + 1) for v in value)
    if type(value) is dict:
        return {k: map_leaves(v, leaf, max_depth, depth + 1) for k, v in value.items()}
    return leaf(value)


def replace_tensors(value: Any, new: list) -> Any:
    """`value` with its tensors (in `flat_tensors` order) taken from `new`, front first."""
    return map_leaves(value, lambda x: new.pop(0) if isinstance(x, torch.Tensor) else x,
                       wire.MAX_DEPTH)


def grad_leaf(t):
    """Unpickling helper: a tensor that tracks gradients from here on (a leaf)."""
    return t.requires_grad_(True) if t.is_floating_point() else t


def attach_autograd(value: Any, flags: list[bool], leaves: list, backward) -> Any:
    """`value` whose flagged tensors become outputs of an autograd node over `leaves`, with
    `backward(grads of the flagged outputs) -> grads of the leaves` (computed elsewhere)."""
    outs = flat_tensors(value)
    wanted = [o for o, f in zip(outs, flags) if f]
    if not leaves or not wanted:
        return value

    class Remote(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.set_materialize_grads(False)
            return tuple(o.view_as(o) for o in wanted)

        @staticmethod
        def backward(ctx, *grads):
            got = backward(list(grads))
            if len(got) != len(leaves):
                raise RuntimeError("the gradients that came back do not match the inputs")
            checked = []
            for g, leaf in zip(got, leaves):
                if g is not None and (not isinstance(g, torch.Tensor) or g.shape != leaf.shape):
                    raise RuntimeError("a gradient that came back has the wrong shape")
                checked.append(None if g is None else g.to(leaf.dtype))
            return tuple(checked)

    attached = list(Remote.apply(*leaves))
    replaced = [attached.pop(0) if f else o for o, f in zip(outs, flags)]
    return replace_tensors(value, replaced)


def as_is(x):
    """Unpickling helper: the value itself (a tensor sent without its gradient tracking)."""
    return x




def write_back(local: Any, remote: Any, depth: int = 0) -> bool:
    """Make `local` (the grader's arguments) what `remote` (the same arguments as the worker
    left them, decoded) holds: tensors copied into in place (same shape and dtype), dicts and
    lists updated in place; False (nothing more changed) where the two do not fit together."""
    if depth > wire.MAX_DEPTH:
        return False
    if isinstance(remote, wire.Unsendable) or type(remote).__name__ == "RemoteObject":
        return True  # not plain data (a config, a generator): it stays the grader's own
    if isinstance(local, torch.Tensor):
        if not isinstance(remote, torch.Tensor) or remote.shape != local.shape:
            return False
        with torch.no_grad():
            local.copy_(remote.to(local.dtype))
        return True
    if isinstance(local, dict) and isinstance(remote, dict):
        for key in [k for k in local if k not in remote]:
            del local[key]
        for key, value in remote.items():
            if key in local and isinstance(local[key], (torch.Tensor, list, dict)) and \
                    type(local[key]) is type(value) and write_back(local[key], value, depth + 1):
                continue
            local[key] = value
        return True
    if isinstance(local, list) and isinstance(remote, list):
        if len(local) == len(remote):
            return all(write_back(a, b, depth + 1) or _set(local, i, b)
                       for i, (a, b) in enumerate(zip(local, remote)))
        local[:] = remote
        return True
    if isinstance(local, tuple) and isinstance(remote, tuple) and len(local) == len(remote):
        return all(write_back(a, b, depth + 1) or _same(a, b) for a, b in zip(local, remote))
    return _same(local, remote)


def _same(a: Any, b: Any) -> bool:
    """Equal plain values (never a tensor's elementwise ==)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value without a plain equality
        return False


def _set(items: list, index: int, value: Any) -> bool:
    items[index] = value
    return True
