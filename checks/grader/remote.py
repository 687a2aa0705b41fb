"""The learner's code, seen from the grader: `RemoteFunction` (a learner's function or class,
called in the worker), `RemoteObject` (an object that stays in the worker: attributes and methods
are fetched and called there), the rebuilding of a decoded reply into those, and the rebuilding of
the learner's exceptions as plain exceptions of the grader (never a BaseException, never a
`CheckFailure`). A test cell's exercise names are `RemoteFunction`s; what they return crosses as
data that `wire` decodes without running any of the worker's code.

`Worker` (in `worker.py`) is only named here: these proxies call its `call`, `getattr` and
`vars`."""

from __future__ import annotations

import builtins
from typing import Any

from . import wire
from .tensors import map_leaves
from .wire import RemoteRef

MAX_TEXT = 64 * 1024  # characters of any text the grader keeps from one reply
QUOTED = 300  # characters of a learner's exception text a diagnosis quotes


def capped_text(value: Any, limit: int) -> str:
    """A text from the worker, at most `limit` characters; anything else reads as ""."""
    return value[:limit] if isinstance(value, str) else ""


def grader_value(value: Any, worker: "Worker") -> Any:  # noqa: F821 - named, not imported
    """A decoded value with the worker's object references turned into `RemoteObject`s."""
    def leaf(x):
        if isinstance(x, RemoteRef):
            return RemoteObject(worker, x.handle, x.type_name, worker.session.deadline,
                                worker.scope)
        return x

    return map_leaves(value, leaf, wire.MAX_DEPTH + 2)


class RemoteFunction:
    """A learner's function (or class) living in the worker, callable from the grader."""

    _checks_remote = True  # checks.engine.is_remote

    def __init__(self, worker: "Worker", name: str, deadline: float):  # noqa: F821 - named, not imported
        self._worker = worker
        self._name = name
        self.deadline = deadline
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self._worker.call(("name", self._name), args, kwargs, self.deadline)

    def __repr__(self) -> str:
        return f"<your function {self._name}>"


class RemoteObject:
    """An object that lives in the worker (an instance of the learner's class, a bound method):
    attribute reads and calls go to the worker; equal only to itself."""

    __slots__ = ("_worker", "_handle", "_type", "_deadline", "_scope")

    def __init__(self, worker: "Worker", handle: int, type_name: str, deadline: float,  # noqa: F821 - named, not imported
                 scope: tuple[int, ...] = ()):
        object.__setattr__(self, "_worker", worker)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_deadline", deadline)
        object.__setattr__(self, "_scope", scope)  # the blocks of hidden tests it was made in

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._worker.check_scope(self._scope)
        return self._worker.getattr(self._handle, name, self._deadline)

    def __setattr__(self, name, value):
        raise AttributeError("objects in the worker are read-only from the grader")

    @property
    def __dict__(self):
        self._worker.check_scope(self._scope)
        return self._worker.vars(self._handle, self._deadline)

    def __call__(self, *args, **kwargs):
        self._worker.check_scope(self._scope)
        return self._worker.call(("object", self._handle), args, kwargs, self._deadline)

    def __repr__(self) -> str:
        return f"<{self._type} object in the worker>"

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return id(self)

    def __bool__(self):
        return True


_EXCEPTIONS: dict[str, type] = {}


def _quoted(text: str) -> str:
    """At most QUOTED characters of the learner's text: what it says is theirs to choose (a
    submission that read something it should not have could raise it as a message)."""
    return text if len(text) <= QUOTED else text[:QUOTED - 1] + "…"


def _carried_init(self, *args):
    self.args = args  # never the built-in class's own __init__: its arguments may differ


def _carried_str(self) -> str:
    return self._checks_text


def rebuild_exception(error: Any) -> Exception:
    """The learner's exception as type name and message, never re-instantiated from its
    arguments (UnicodeDecodeError takes five; OSError picks a subclass by errno): an instance
    of a class named as the learner's, a subclass of the built-in one when it is one
    (ValueError, KeyError, UnicodeDecodeError ...; so `except KeyError` still catches it), else
    of Exception; its str() is the text the worker read. Never a BaseException or a
    CheckFailure."""
    if not isinstance(error, dict):
        return RuntimeError("an error the grader could not read")
    name = capped_text(error.get("type"), 100) or "Exception"
    args = error.get("args") if isinstance(error.get("args"), tuple) else ()
    args = tuple(_quoted(a) if isinstance(a, str) else a if type(a) in (int, float, bool)
                 or a is None else "?" for a in args[:4])
    if isinstance(error.get("text"), str):
        text = _quoted(error["text"])
    else:  # an older worker: the text as BaseException makes it from the arguments
        text = _quoted(str(args[0]) if len(args) == 1 else str(args) if args else "")
    base = getattr(builtins, name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)) or name in (
            "StopIteration", "StopAsyncIteration"):
        base = Exception
    key = name if name.isidentifier() else "LearnerException"
    cls = _EXCEPTIONS.get(key)
    if cls is None:
        cls = _EXCEPTIONS[key] = type(key, (base,), {
            "__init__": _carried_init, "__str__": _carried_str, "__module__":
            "builtins" if base is not Exception else "learner"})
    exc = cls(*args)
    exc._checks_text = text
    where = capped_text(error.get("where"), 300)
    if where:
        exc.add_note(f"at {where}")
    return exc
