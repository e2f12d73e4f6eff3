"""Fits kept by their inputs' content: a dataset's summary asks for the same baseline fit
several times (every split's table, the pooled one and each series' own, fit on the same
training rows), and a CAViaR or GJR fit is a numerical optimisation worth ~0.1 s each. The
fits are deterministic functions of their arrays, so a repeat returns the kept result."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

Fit = TypeVar("Fit", bound=Callable[..., Any])


def by_content(kept: int) -> Callable[[Fit], Fit]:
    """Keep the last ``kept`` results of a function of arrays and numbers, keyed by each
    argument's dtype, shape and bytes (a hash), the least recently used dropped first. The
    results are shared: callers read them and never write to them."""

    def wrap(fit: Fit) -> Fit:
        cache: dict[tuple, Any] = {}

        @functools.wraps(fit)
        def cached(*args):
            key = tuple(content_key(a) for a in args)
            if key in cache:
                result = cache.pop(key)  # put back last: the most recently used
            else:
                result = fit(*args)
                while len(cache) >= kept:
                    cache.pop(next(iter(cache)))
            cache[key] = result
            return result

        cached.cache_clear = cache.clear  # type: ignore[attr-defined]
        return cached  # type: ignore[return-value]

    return wrap


def content_key(value) -> tuple:
    """``(dtype, shape, a 128-bit hash of the bytes)`` of ``value`` as a numpy array."""
    a = np.ascontiguousarray(np.asarray(value))
    return (a.dtype.str, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest())
