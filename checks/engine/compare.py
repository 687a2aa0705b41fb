"""Comparing what the learner's function returned with what was expected: descriptions of values
for messages, tolerances per dtype, closeness with inf and nan equal to themselves, and the text
that says where two tensors differ."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from ..i18n import _

def describe(value: Any) -> str:
    """A short description of a value for messages: tensors by dtype and shape."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}[{', '.join(map(str, value.shape))}]"
    if isinstance(value, (list, tuple)):
        if len(value) > 6:
            inner = ", ".join(describe(v) for v in value[:3])
            return _("{kind} of {count} items [{first}, ...]").format(
                kind=type(value).__name__, count=len(value), first=inner)
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37] + "...")
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _shape_text(shape: Iterable[int], dims: Iterable[str] | None) -> str:
    shape = list(shape)
    if dims is None or len(list(dims)) != len(shape):
        return f"[{', '.join(map(str, shape))}]"
    return "[" + ", ".join(f"{d}={n}" for d, n in zip(dims, shape)) + "]"


# --------------------------------------------------------------------------------------------
# Tolerances

_TOLERANCES = {  # dtype: (atol, rtol)
    torch.float64: (1e-9, 1e-7),
    torch.float32: (2e-5, 2e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _TOLERANCES.get(dtype, (0.0, 0.0))


def values_close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> bool:
    """Elementwise |got - want| <= atol + rtol * |want|, with inf/nan equal to themselves."""
    if got.shape != want.shape:
        return False
    if not want.is_floating_point():
        return bool((got == want).all())
    got64, want64 = got.detach().double(), want.detach().double()
    same_special = (got64 == want64) | (got64.isnan() & want64.isnan())
    diff = (got64 - want64).abs()
    # A finite value is never "close" to an infinite one (inf <= inf would say it is).
    ok = same_special | (want64.isfinite() & (diff <= atol + rtol * want64.abs()))
    return bool(ok.all())



def matches(got: Any, value: Any, atol: float, rtol: float) -> bool:
    if isinstance(value, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != value.shape:
            return False
        tol_a, tol_r = tolerance(value.dtype)
        return values_close(got.to(value.dtype), value, max(atol, tol_a), max(rtol, tol_r))
    try:
        return bool(got == value) and type(got) is type(value)
    except Exception:  # noqa: BLE001 - a value without a plain equality
        return False


def mismatch_text(got, want, atol, rtol, dims) -> str:
    got64, want64 = got.detach().double(), want.detach().double()
    bad = ~(want64.isfinite() & ((got64 - want64).abs() <= atol + rtol * want64.abs()))
    bad &= ~((got64 == want64) | (got64.isnan() & want64.isnan()))
    index = tuple(int(i) for i in bad.nonzero()[0])
    where = ", ".join(f"{d}={i}" for d, i in zip(dims, index)) if dims and \
        len(dims) == len(index) else ", ".join(map(str, index))
    count = int(bad.sum())
    got_text, want_text = numbers_apart(float(got64[index]), float(want64[index]))
    return _("{count} of {total} entries differ; first at [{where}]: got {got}, expected "
             "{want}.").format(count=count, total=bad.numel(), where=where, got=got_text,
                               want=want_text)


def numbers_apart(got: float, want: float, digits: int = 6) -> tuple[str, str]:
    """Two numbers as a message shows them: `digits` significant digits, or as many more as it
    takes for two different numbers not to read the same ("0.0110004" against "0.011", never
    "0.011" against "0.011")."""
    def text(value: float, n: int) -> str:
        return repr(value) if math.isnan(value) or math.isinf(value) else f"{value:.{n}g}"

    for n in range(digits, 18):
        shown = text(got, n), text(want, n)
        if shown[0] != shown[1] or got == want:
            return shown
    return repr(got), repr(want)

