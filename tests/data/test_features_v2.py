"""``--features v2`` (the winners' volatility inputs, the volatility families in logs) and
``--normalise expanding|rolling``: values against hand recursions, causality, and the
statistics that carry them."""

import dataclasses

import numpy as np
import pytest
from conftest import random_bars

from tftjax.config import ConfigError, DataConfig, preset
from tftjax.data import build_features
from tftjax.data.features import WARMUP, FeatureStats, historical_names, historical_raw

V2 = historical_names("v2")


@pytest.fixture(scope="module")
def bars():
    return random_bars(600, seed=11)


@pytest.fixture(scope="module")
def raw(bars):
    return historical_raw(bars, features="v2").astype(np.float64)


def _pv(bars):
    """The per-bar Parkinson + gap² variance, row by row."""
    o, h, lo, c = bars.open, bars.high, bars.low, bars.close
    out = []
    for t in range(len(c)):
        gap = np.log(o[t] / c[t - 1]) if t else 0.0
        out.append(gap * gap + np.log(h[t] / lo[t]) ** 2 / (4 * np.log(2)))
    return np.array(out)


def test_layout_keeps_the_210_shape_and_names_what_it_swapped():
    assert len(V2) == 210 == len(set(V2))
    v1 = historical_names("v1")
    changed = {a.split("_")[0] + "→" + b.split("_")[0] for a, b in zip(v1, V2) if a != b}
    assert changed == {"rvol→lrvol", "range→lpv"}  # the rest in place, column for column
    assert {"lpv_1", "lpv_5", "lpv_22", "lpv_ewma", "lpv_rewma"} <= set(V2)


def test_the_new_inputs_match_hand_recursions(bars, raw):
    pv = _pv(bars)
    r = np.diff(np.log(bars.close))
    ewma, rewma = [np.nan], [pv[0]]  # the EWMA from r_1², the range EWMA from pv_0
    v = r[0] ** 2
    for t in range(1, len(bars)):
        v = 0.94 * v + 0.06 * r[t - 1] ** 2 if t > 1 else r[0] ** 2
        ewma.append(v)
        rewma.append(0.94 * rewma[-1] + 0.06 * pv[t])
    rewma[0] = 0.94 * pv[0] + 0.06 * pv[0]
    t = np.arange(WARMUP, len(bars))
    floor = lambda s: 1e-3 * np.array([pv[: s + 1].mean() for s in t])
    want = {
        "lpv_1": pv[t],
        "lpv_5": np.array([pv[s - 4 : s + 1].mean() for s in t]),
        "lpv_22": np.array([pv[s - 21 : s + 1].mean() for s in t]),
        "lpv_ewma": np.array(ewma)[t],
        "lpv_rewma": np.array(rewma)[t],
    }
    for name, x in want.items():  # float32 of logs near -10: 1e-6 of rounding, 1e-5 allowed
        np.testing.assert_allclose(
            raw[t, V2.index(name)], np.log(np.maximum(x, floor(0))), atol=1e-5, err_msg=name
        )
    rvol10 = np.array([np.sqrt(np.mean(r[s - 10 : s] ** 2)) for s in t])
    np.testing.assert_allclose(raw[t, V2.index("lrvol_10")], np.log(rvol10), atol=1e-5)


def _hand_z(x, t, window=None, min_rows=20):
    lo = 0 if window is None else max(t + 1 - window, 0)
    seen = x[lo : t + 1][np.isfinite(x[lo : t + 1])]
    if seen.size < min_rows:
        return 0.0
    return float(np.clip((x[t] - seen.mean()) / seen.std(), -10, 10))


@pytest.mark.parametrize("how,window", [("expanding", None), ("rolling", 50)])
def test_causal_normalisation_matches_a_per_row_z_score(bars, raw, how, window):
    cfg = dataclasses.replace(DataConfig(), features="v2", normalise=how, normalise_window=50)
    fs = build_features(bars, cfg, train_rows=(0, 400))
    assert (fs.stats.features, fs.stats.normalise, fs.stats.normalise_window) == ("v2", how, 50)
    for name in ("lpv_5", "ret_10", "dhigh_60", "lrvol_2"):
        j = V2.index(name)
        x = historical_raw(bars, features="v2")[:, j].astype(np.float64)
        for t in (WARMUP, 300, 599):
            assert fs.historical[t, j] == pytest.approx(_hand_z(x, t, window), abs=1e-4), name


@pytest.mark.parametrize("how", ["train", "expanding", "rolling"])
def test_causal_changing_later_bars_leaves_rows_up_to_t_unchanged(bars, how):
    cfg = dataclasses.replace(DataConfig(), features="v2", normalise=how)
    stats = build_features(bars, cfg, train_rows=(0, 400)).stats
    t = 350
    later = lambda x, f: np.concatenate([x[: t + 1], f(x[t + 1 :])])
    changed = bars.replace(
        high=later(bars.high, lambda x: x * 1.03), close=later(bars.close, lambda x: x * 1.01)
    )
    a = build_features(bars, stats=stats).historical
    b = build_features(changed, stats=stats).historical
    np.testing.assert_array_equal(a[: t + 1], b[: t + 1])
    assert not np.array_equal(a[t + 1 :], b[t + 1 :])


def test_statistics_carry_the_feature_set_and_its_normalisation(bars, tmp_path):
    cfg = dataclasses.replace(DataConfig(), features="v2", normalise="rolling", normalise_window=80)
    stats = build_features(bars, cfg, train_rows=(0, 400)).stats
    stats.save(tmp_path / "s.json")
    back = FeatureStats.load(tmp_path / "s.json")
    assert (back.features, back.normalise, back.normalise_window) == ("v2", "rolling", 80)
    # the saved set wins over the config given when statistics are reused (predict, evaluate)
    a = build_features(bars, DataConfig(), stats=back)
    np.testing.assert_array_equal(a.historical, build_features(bars, cfg, stats=stats).historical)


@pytest.mark.parametrize(
    "field,value,expect",
    [
        ("features", "v3", "--features must be one of v1, v2"),
        ("normalise", "zscore", "--normalise must be one of train, expanding, rolling"),
        ("normalise_window", 5, "--normalise-window must be >= 20 rows"),
    ],
)
def test_bad_feature_options_are_refused(field, value, expect):
    with pytest.raises(ConfigError, match=expect):
        preset("tiny", **{field: value})
