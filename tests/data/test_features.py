"""Features: values against naive per-row references, causality, statistics."""

import dataclasses

import numpy as np
import pytest
from conftest import random_bars

from tftjax.data import build_features
from tftjax.data.features import (
    FAMILIES,
    HISTORICAL_NAMES,
    KNOWN_NAMES,
    WARMUP,
    WINDOWS,
    FeatureStats,
    historical_raw,
    known_features,
)


@pytest.fixture(scope="module")
def bars():
    return random_bars(1200, seed=7)


@pytest.fixture(scope="module")
def raw(bars):
    return historical_raw(bars)


def col(name):
    return HISTORICAL_NAMES.index(name)


def test_layout():
    assert len(HISTORICAL_NAMES) == 210 == len(FAMILIES) * len(WINDOWS)
    assert len(set(HISTORICAL_NAMES)) == 210 and len(KNOWN_NAMES) == 10
    assert WARMUP == max(WINDOWS)


def test_finite_after_warmup(raw):
    assert np.isfinite(raw[WARMUP:]).all()
    # The longest look-back is incomplete one row earlier.
    assert np.isnan(raw[WARMUP - 1, col("ret_120")])


def _reference(bars, t, family, L):
    """Naive per-row computation of one feature at row t (float64)."""
    c, o, h, lo, v = bars.close, bars.open, bars.high, bars.low, bars.volume
    sl = slice(t - L + 1, t + 1)
    r = np.log(c[sl] / np.concatenate([c[t - L : t]]))
    if family == "ret":
        return np.log(c[t] / c[t - L])
    if family == "rvol":
        return np.sqrt(np.mean(r**2))
    if family == "range":
        return np.mean(np.log(h[sl] / lo[sl]))
    if family == "clv":
        hi, lw = np.log(h[sl].max()), np.log(lo[sl].min())
        return (np.log(c[t]) - lw) / (hi - lw) - 0.5
    if family == "vz":
        lv = np.log1p(v[sl])
        return (lv[-1] - lv.mean()) / (lv.std() + 1e-3)
    if family == "rsi":
        return np.maximum(r, 0).sum() / np.abs(r).sum() - 0.5
    if family == "sma":
        return np.log(c[t]) - np.mean(np.log(c[sl]))
    if family == "vwap":
        tp = (h[sl] + lo[sl] + c[sl]) / 3
        return np.log(c[t] / (np.sum(tp * v[sl]) / np.sum(v[sl])))
    if family == "absr":
        return np.mean(np.abs(r)) / np.sqrt(np.mean(r**2))
    if family == "tstat":
        return np.log(c[t] / c[t - L]) / (np.sqrt(np.mean(r**2)) * np.sqrt(L))
    if family == "dhigh":
        return np.log(c[t] / h[sl].max())
    if family == "dlow":
        return np.log(c[t] / lo[sl].min())
    if family == "miss":  # bars missing from the 1-minute grid among the last L steps
        elapsed_min = (bars.ts[t] - bars.ts[t - L]) // (60 * 10**9)
        return np.log1p(max(elapsed_min - L, 0))
    if family == "body":
        return np.mean((c[sl] - o[sl]) / (h[sl] - lo[sl]))
    if family == "gap":
        return np.sum(np.log(o[sl] / c[t - L : t]))
    raise KeyError(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_matches_naive_reference(bars, raw, family):
    rng = np.random.default_rng(0)
    for L in WINDOWS:
        for t in rng.integers(WARMUP, len(bars), size=4):
            want = _reference(bars, int(t), family, L)
            got = raw[t, col(f"{family}_{L}")]
            np.testing.assert_allclose(
                got, want, rtol=2e-4, atol=2e-6, err_msg=f"{family}_{L} at row {t}"
            )


def test_known_features_by_hand():
    ts = np.array(
        [
            np.datetime64("2013-09-02T12:00"),
            np.datetime64("2013-09-02T12:01"),
            np.datetime64("2013-09-02T18:00"),
            np.datetime64("2013-09-03T06:00"),
        ],
        dtype="datetime64[ns]",
    ).astype(np.int64)
    k = known_features(ts)
    # Monday noon: time of day 0.5, day of week (0 + 0.5) / 7.
    np.testing.assert_allclose(k[0, :4], [0, -1, np.sin(np.pi / 7), np.cos(np.pi / 7)], atol=1e-6)
    doy = 244 / 365.25  # 2013-09-02 is day 244 (0-based) of the year
    np.testing.assert_allclose(
        k[0, 4:6], [np.sin(2 * np.pi * doy), np.cos(2 * np.pi * doy)], atol=1e-6
    )
    assert k[0, 6] == pytest.approx(1 / 30 - 0.5)
    # No calendar: no session inputs (what the bars' own gaps show is a historical input).
    np.testing.assert_array_equal(k[:, 7:], 0)


@pytest.mark.parametrize("t", [WARMUP, 400, 777, 1198])
def test_causal_changing_later_bars_leaves_rows_up_to_t_unchanged(bars, t):
    stats = build_features(bars, train_rows=(0, 600)).stats
    rng = np.random.default_rng(t)
    n = len(bars)
    k = n - t - 1
    later = lambda x, f: np.concatenate([x[: t + 1], f(x[t + 1 :])])
    scale = np.exp(rng.normal(0, 0.05, k))
    changed = bars.replace(
        close=later(bars.close, lambda x: x * scale),
        open=later(bars.open, lambda x: x * scale * 1.01),
        high=later(bars.high, lambda x: x * scale * 1.02),
        low=later(bars.low, lambda x: x * scale * 0.99),
        volume=later(bars.volume, lambda x: x[::-1] * 3 + 1),
        ts=later(bars.ts, lambda x: x + np.cumsum(rng.integers(0, 10**12, k))),
    )
    a = build_features(bars, stats=stats)
    b = build_features(changed, stats=stats)
    np.testing.assert_array_equal(a.historical[: t + 1], b.historical[: t + 1])
    np.testing.assert_array_equal(a.known[: t + 1], b.known[: t + 1])
    np.testing.assert_array_equal(a.future[: t + 1], b.future[: t + 1])
    np.testing.assert_array_equal(a.target[: t + 1], b.target[: t + 1])
    assert not np.array_equal(a.historical[t + 1 :], b.historical[t + 1 :])


def test_statistics_come_from_train_rows_only(bars):
    train = (0, 700)
    a = build_features(bars, train_rows=train).stats
    wild = bars.replace(volume=np.concatenate([bars.volume[:700], bars.volume[700:] * 50]))
    b = build_features(wild, train_rows=train).stats
    np.testing.assert_array_equal(a.hist_mean, b.hist_mean)
    np.testing.assert_array_equal(a.static, b.static)
    c = build_features(wild, train_rows=(0, 1200)).stats
    assert not np.array_equal(a.hist_mean, c.hist_mean)


def test_normalised_train_rows_are_standardised(bars):
    fs = build_features(bars, train_rows=(0, 900))
    block = fs.historical[WARMUP:900].astype(np.float64)
    # Clipping at ±10 moves heavy-tailed columns a little off 0/1.
    assert np.abs(block.mean(0)).max() < 0.05
    assert np.all(block.std(0) < 1.0 + 1e-3) and np.median(block.std(0)) > 0.95
    assert np.abs(fs.historical).max() <= 10.0
    assert np.all(fs.historical[: WARMUP - 1].std(0) >= 0) and fs.historical.dtype == np.float32
    r = np.diff(np.log(bars.close))[WARMUP - 1 : 899]
    srt = np.sort(r)  # winsorised: 0.1% tails, at least the 5 most extreme values of each
    lo, hi = srt[5], srt[-6]
    assert fs.stats.target_scale == pytest.approx(np.clip(r, lo, hi).std(), rel=1e-9)
    assert fs.stats.target_scale == pytest.approx(r.std(), rel=0.02)
    np.testing.assert_allclose(
        fs.target[1:] * fs.stats.target_scale, np.diff(np.log(bars.close)), rtol=1e-6, atol=1e-12
    )


def test_stats_json_roundtrip(bars, tmp_path):
    stats = build_features(bars, train_rows=(0, 800)).stats
    stats.save(tmp_path / "s.json")
    back = FeatureStats.load(tmp_path / "s.json")
    for f in dataclasses.fields(FeatureStats):
        np.testing.assert_array_equal(getattr(back, f.name), getattr(stats, f.name))
    a = build_features(bars, stats=stats)
    b = build_features(bars, stats=back)
    np.testing.assert_array_equal(a.historical, b.historical)
