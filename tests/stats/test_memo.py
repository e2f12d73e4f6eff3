"""Fits kept by content (tftjax.stats.memo): a repeat is not refitted, any changed byte,
dtype or shape is, and the least recently used fit goes first."""

import numpy as np

from tftjax.stats import caviar
from tftjax.stats.memo import by_content


def test_a_repeat_returns_the_kept_result_and_a_change_refits():
    calls = []

    @by_content(kept=2)
    def fit(r, q):
        calls.append(1)
        return float(np.sum(r)) * q

    r = np.arange(5.0)
    assert fit(r, 0.5) == fit(r.copy(), 0.5) == 5.0 and len(calls) == 1  # content, not identity
    fit(r, 0.9)  # another level
    r2 = r.copy()
    r2[3] = np.nextafter(3.0, 4.0)  # one bit of one value
    fit(r2, 0.5)
    fit(r.astype(np.float32), 0.5)  # the same values in another dtype
    fit(r.reshape(5, 1), 0.5)  # and in another shape
    assert len(calls) == 5
    fit(r.reshape(5, 1), 0.5)  # kept (the last two)
    assert len(calls) == 5
    fit(r, 0.5)  # dropped: the least recently used of 2 kept
    assert len(calls) == 6


def test_caviar_fits_once_per_rows_and_levels():
    caviar.fit.cache_clear()
    r = np.random.default_rng(0).standard_normal(300)
    first = caviar.fit(r, (0.1, 0.9))
    assert caviar.fit(r.copy(), (0.1, 0.9)) is first
    other = caviar.fit(r[:-1], (0.1, 0.9))
    assert other is not first and not np.array_equal(other.init, first.init)
