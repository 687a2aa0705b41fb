"""What a grading worker sends back, encoded so that the grader can decode it safely.

The grader treats every byte from the worker as hostile (`checks.grader.worker`). A message is a
JSON header describing the value, followed by the raw bytes of the tensors' storages:

    [4-byte big-endian header length] [JSON header] [storage bytes ...]

(the 8-byte frame length in front is `checks.grader.channel`'s). Decoding never runs pickle or any
code of the sender, and checks every size before anything is allocated:

- plain types only: None, bool, int, float, complex, str, bytes, list, tuple, dict, torch.dtype,
  torch.Size and plain CPU tensors; dict keys are strings, small integers, booleans, None, or
  short tuples of these (other keys could be made to collide in the hash table); anything else
  the worker returned arrives as an opaque handle (`RemoteRef`) or `Unsendable`;
- a tensor is a view (offset, shape, strides) of a storage whose bytes are in the message: it must
  lie inside that storage and may neither overlap itself nor be expanded (stride 0), so no tensor
  is ever larger than the bytes that were sent; element counts are capped per message;
- the header's size, the number of values, their nesting and the time spent decoding are bounded.

Storages are identified by the worker's storage id, so tensors that share memory in the worker
share memory in the grader too (a KV cache's `update` returns views of its buffer): the grader
keeps one storage per id for the duration of a test (`storages`), updated in place.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import time
from typing import Any, Callable

MAX_HEADER = 8 * 2**20  # bytes of JSON in one message
MAX_NODES = 400_000  # values in one message
MAX_DEPTH = 40  # nesting of lists, tuples and dicts
MAX_ELEMENTS = 2**25  # tensor elements in one message (all views together)
MAX_DIMS = 12
MAX_KEY_INT = 2**62  # integer dict keys: larger ones could be chosen to collide
MAX_KEY_TUPLE = 16
DECODE_SECONDS = 5.0
SHARE_LIMIT = 16 * 2**20  # worker side: storages up to this size travel whole (views kept)

DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int64",
          "int32", "int16", "int8", "uint8", "bool")


class ProtocolError(Exception):
    """The message is not what the protocol allows. The grader ends the worker."""


class Unsendable:
    """Stands in for a value the worker could not send as plain data. Equal to nothing."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} object (not plain data)>"

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__


class RemoteRef:
    """A reference to an object that stays in the worker (decoded; `checks.grader.remote` turns it
    into a proxy)."""

    def __init__(self, handle: int, type_name: str):
        self.handle = handle
        self.type_name = type_name


# --------------------------------------------------------------------------------------------
# Encoding (the worker's side: best effort, never trusted)


def encode(value: Any, register: Callable[[Any], int] | None = None) -> bytes:
    """`value` as a message. Objects that are not plain data become handles when `register`
    (object -> handle) is given, else `Unsendable` markers."""
    encoder = _Encoder(register)
    tree = encoder.node(value, 0)
    header = json.dumps({"v": tree, "s": encoder.table}, separators=(",", ":"),
                        allow_nan=True).encode()
    return struct.pack(">I", len(header)) + header + b"".join(encoder.blobs)


class _Encoder:
    def __init__(self, register):
        self.register = register
        self.table: list[list[int]] = []  # [storage id, nbytes] in blob order
        self.blobs: list[bytes] = []
        self.sent: set[int] = set()
        self.fresh = -1

    def node(self, value: Any, depth: int) -> Any:
        import torch

        if depth > MAX_DEPTH - 2:
            return {"n": "a too deeply nested value"}
        kind = type(value)
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            return value if abs(value) < 2**63 else {"n": "an integer beyond 64 bits"}
        if kind is float:
            return value if math.isfinite(value) else {"f": repr(value)}
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, bool):
            return bool(int.__int__(value))
        if isinstance(value, int):
            return self.node(int.__int__(value), depth)
        if isinstance(value, float):
            return self.node(float.__float__(value), depth)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, complex):
            return {"c": [self.node(complex.real.__get__(value), depth),
                          self.node(complex.imag.__get__(value), depth)]}
        if isinstance(value, (bytes, bytearray)):
            return {"b": base64.b64encode(bytes(value)).decode()}
        if isinstance(value, torch.dtype):
            return {"y": str(value).removeprefix("torch.")}
        if isinstance(value, torch.Size):
            return {"z": [int(n) for n in value]}
        if _numpy_scalar(value):
            return self.node(value.item(), depth)
        if isinstance(value, tuple):
            return {"t": [self.node(v, depth + 1) for v in tuple.__iter__(value)]}
        if isinstance(value, list):
            return [self.node(v, depth + 1) for v in list.__iter__(value)]
        if isinstance(value, dict):
            return {"d": [[self.node(k, depth + 1), self.node(v, depth + 1)]
                          for k, v in dict.items(value)]}
        name = f"{type(value).__module__}.{type(value).__qualname__}"
        if self.register is not None:
            return {"o": [self.register(value), name]}
        return {"n": name}

    def tensor(self, value) -> Any:
        import torch

        with torch._C.DisableTorchFunctionSubclass():
            t = torch.Tensor.as_subclass(value, torch.Tensor)
            grad = bool(t.requires_grad)
            t = t.detach()
            if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
                return {"n": f"a {t.layout} tensor"}
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.resolve_conj().resolve_neg()
            dtype = str(t.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                t, dtype = t.double(), "float64"
            storage = t.untyped_storage()
            whole = (storage.nbytes() <= SHARE_LIMIT and storage.data_ptr() != 0
                     and plain_layout(list(t.shape), list(t.stride())))
            if whole:
                sid = storage.data_ptr()
                offset, stride = t.storage_offset(), list(t.stride())
            else:
                t = t.contiguous().clone()
                storage = t.untyped_storage()
                sid, self.fresh = self.fresh, self.fresh - 1
                offset, stride = 0, list(t.stride())
            if sid not in self.sent:
                self.sent.add(sid)
                data = _storage_bytes(storage)
                self.table.append([sid, len(data)])
                self.blobs.append(data)
            return {"x": [sid, dtype, offset, list(t.shape), stride, grad]}


def _numpy_scalar(value) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "item") and \
        getattr(value, "shape", None) == ()


def _storage_bytes(storage) -> bytes:
    import torch

    if storage.nbytes() == 0:
        return b""
    raw = torch.empty(0, dtype=torch.uint8).set_(storage)
    return raw.numpy().tobytes()


def plain_layout(shape: list[int], stride: list[int]) -> bool:
    """No stride 0 over a dimension longer than 1 and no two indices on the same element."""
    dims = sorted((s, n) for n, s in zip(shape, stride) if n > 1)
    span = 1
    for s, n in dims:
        if s < span:
            return False
        span = s * n
    return True


# --------------------------------------------------------------------------------------------
# Decoding (the grader's side)


class Storages:
    """The grader's copies of the worker's storages during one test, by the worker's id (kept
    for the whole test, so that a storage id always means the same memory)."""

    def __init__(self, budget: int = 128 * 2**20):
        self.live: dict[int, Any] = {}
        self.budget = budget  # bytes of storage received per test

    def get(self, sid: int, data: memoryview):
        import torch

        self.budget -= len(data)
        if self.budget < 0:
            raise ProtocolError("more tensor data in one test than the grader accepts")
        root = self.live.get(sid)
        if root is None or root.numel() != len(data):
            root = self.live[sid] = torch.empty(len(data), dtype=torch.uint8)
        if len(data):
            root.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return root


def decode(data: bytes, storages: Storages | None = None,
           seconds: float = DECODE_SECONDS) -> Any:
    """The value in a message, as plain Python and torch objects. ProtocolError if the message
    is malformed or breaks a limit."""
    if len(data) < 4:
        raise ProtocolError("a message shorter than its header")
    (size,) = struct.unpack(">I", data[:4])
    if size > MAX_HEADER or 4 + size > len(data):
        raise ProtocolError(f"a header of {size} bytes")
    try:
        header = json.loads(data[4:4 + size])
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a header that is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict) or set(header) != {"v", "s"} or \
            not isinstance(header["s"], list):
        raise ProtocolError("a header without its value and storage table")
    decoder = _Decoder(memoryview(data)[4 + size:], header["s"], storages or Storages(),
                       time.monotonic() + seconds)
    return decoder.node(header["v"], 0)


class _Decoder:
    def __init__(self, blob: memoryview, table: list, storages: Storages, deadline: float):
        self.storages = storages
        self.deadline = deadline
        self.nodes = 0
        self.elements = 0
        self.where: dict[int, memoryview] = {}
        self.roots: dict[int, Any] = {}
        at = 0
        if len(table) > MAX_NODES:
            raise ProtocolError("too many storages")
        for entry in table:
            if not (isinstance(entry, list) and len(entry) == 2
                    and all(type(v) is int for v in entry) and entry[1] >= 0):
                raise ProtocolError("a malformed storage entry")
            sid, nbytes = entry
            if sid in self.where or at + nbytes > len(blob):
                raise ProtocolError("storages that do not add up")
            self.where[sid] = blob[at:at + nbytes]
            at += nbytes
        if at != len(blob):
            raise ProtocolError("bytes after the last storage")

    def tick(self) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ProtocolError(f"more than {MAX_NODES} values in one message")
        if self.nodes % 1024 == 0 and time.monotonic() > self.deadline:
            raise ProtocolError("a message that takes too long to decode")

    def node(self, x: Any, depth: int) -> Any:
        self.tick()
        if depth > MAX_DEPTH:
            raise ProtocolError("values nested too deeply")
        kind = type(x)
        if x is None or kind in (bool, int, float, str):
            return x
        if kind is list:
            return [self.node(v, depth + 1) for v in x]
        if kind is not dict or len(x) != 1:
            raise ProtocolError("an unknown kind of value")
        (tag, body), = x.items()
        if tag == "t" and type(body) is list:
            return tuple(self.node(v, depth + 1) for v in body)
        if tag == "d" and type(body) is list:
            return self.mapping(body, depth)
        if tag == "x" and type(body) is list:
            return self.tensor(body)
        if tag == "f" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "c" and type(body) is list and len(body) == 2 and \
                all(type(v) in (int, float) for v in body):
            return complex(body[0], body[1])
        if tag == "b" and type(body) is str:
            if len(body) > MAX_HEADER:
                raise ProtocolError("bytes too long")
            try:
                return base64.b64decode(body, validate=True)
            except ValueError:
                raise ProtocolError("bytes that are not base64") from None
        if tag == "y" and body in DTYPES:
            import torch

            return getattr(torch, body)
        if tag == "z" and type(body) is list and len(body) <= MAX_DIMS and \
                all(type(n) is int and 0 <= n < 2**40 for n in body):
            import torch

            return torch.Size(body)
        if tag == "n" and type(body) is str:
            return Unsendable(body[:200])
        if tag == "o" and type(body) is list and len(body) == 2 and type(body[0]) is int \
                and type(body[1]) is str:
            return RemoteRef(body[0], body[1][:200])
        raise ProtocolError(f"an unknown kind of value ({str(tag)[:20]!r})")

    def mapping(self, pairs: list, depth: int) -> dict:
        out: dict = {}
        for pair in pairs:
            if type(pair) is not list or len(pair) != 2:
                raise ProtocolError("a malformed dict entry")
            key = self.node(pair[0], depth + 1)
            if not _safe_key(key):
                raise ProtocolError(f"a dict key of type {type(key).__name__}")
            out[key] = self.node(pair[1], depth + 1)
        return out

    def tensor(self, body: list):
        import torch

        if len(body) != 6:
            raise ProtocolError("a malformed tensor")
        sid, dtype, offset, shape, stride, grad = body
        if type(sid) is not int or sid not in self.where or dtype not in DTYPES or \
                type(offset) is not int or offset < 0 or type(grad) is not bool:
            raise ProtocolError("a malformed tensor")
        if not (type(shape) is list and type(stride) is list and len(shape) == len(stride)
                <= MAX_DIMS and all(type(n) is int and 0 <= n < 2**40 for n in shape)
                and all(type(s) is int and 0 <= s < 2**40 for s in stride)):
            raise ProtocolError("a tensor with a malformed shape or strides")
        if not plain_layout(shape, stride):
            raise ProtocolError("an expanded or self-overlapping tensor")
        numel = math.prod(shape)
        self.elements += numel
        if self.elements > MAX_ELEMENTS:
            raise ProtocolError(f"more than {MAX_ELEMENTS} tensor elements in one message")
        kind = getattr(torch, dtype)
        itemsize = torch.empty(0, dtype=kind).element_size()
        data = self.where[sid]
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride)) if numel else offset - 1
        if (last + 1) * itemsize > len(data):
            raise ProtocolError("a tensor outside its storage")
        if sid not in self.roots:
            self.roots[sid] = self.storages.get(sid, data)
        root = self.roots[sid]
        if numel == 0:
            out = torch.empty(shape, dtype=kind)
        else:
            out = torch.empty(0, dtype=kind).set_(root.untyped_storage(), offset, shape, stride)
        return out.requires_grad_(True) if grad and out.is_floating_point() else out


def _safe_key(key: Any, depth: int = 0) -> bool:
    if key is None or type(key) in (str, bool):
        return True
    if type(key) is int:
        return -MAX_KEY_INT < key < MAX_KEY_INT
    if type(key) is tuple and depth == 0 and len(key) <= MAX_KEY_TUPLE:
        return all(_safe_key(k, 1) for k in key)
    return False
