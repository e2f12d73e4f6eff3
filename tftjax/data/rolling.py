"""Rolling sums, means and extremes over one series, vectorised (cumulative sums, and
log-doubling for extremes): the look-backs of :mod:`tftjax.data.features`."""

from __future__ import annotations

import numpy as np


class Rolling:
    """Rolling sums over one series from one cumulative sum (rows < L-1 → NaN)."""

    def __init__(self, x: np.ndarray):
        self.n = x.shape[0]
        finite = np.where(np.isfinite(x), x, 0.0)
        self.cs = np.concatenate([[0.0], np.cumsum(finite)])
        # Rows before the first finite value must stay NaN in every window.
        self.first_valid = int(np.argmax(np.isfinite(x))) if np.isfinite(x).any() else self.n

    def sum(self, L: int) -> np.ndarray:
        out = np.empty(self.n)
        start = min(L - 1 + self.first_valid, self.n)
        out[:start] = np.nan
        np.subtract(self.cs[start + 1 :], self.cs[start + 1 - L : self.n + 1 - L], out=out[start:])
        return out

    def mean(self, L: int) -> np.ndarray:
        return self.sum(L) / L


class Extreme:
    """Rolling max (or min) for any window by log-doubling: O(n log L)."""

    def __init__(self, x: np.ndarray, op, max_window: int):
        self.op = op
        self.levels = {1: x}
        w = 1
        while 2 * w <= max_window:
            m = self.levels[w]
            self.levels[2 * w] = op(m, shift(m, w))
            w *= 2

    def __call__(self, L: int) -> np.ndarray:
        w = 1 << (L.bit_length() - 1)  # largest power of two <= L
        m = self.levels[w]
        out = self.op(m, shift(m, L - w))
        out[: L - 1] = np.nan
        return out


def shift(x: np.ndarray, k: int) -> np.ndarray:
    """``y[t] = x[t-k]``; the first k rows repeat ``x[0]`` (masked by callers)."""
    if k == 0:
        return x
    y = np.empty_like(x)
    y[:k] = x[0]
    y[k:] = x[:-k]
    return y
