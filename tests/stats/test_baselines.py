"""Baselines against hand computations on a short series."""

import numpy as np
import pytest
from conftest import REPO
from scipy.stats import norm

from tftjax.stats import baselines, losses

QS = (0.1, 0.5, 0.9)


@pytest.fixture(scope="module")
def series():
    return np.random.default_rng(3).standard_t(4, size=400) * 0.7


def _ewma_by_hand(r, lam, init):
    v, prev = [], init
    for x in r:
        prev = lam * prev + (1 - lam) * x * x
        v.append(prev)
    return np.array(v)


def test_ewma_variance_by_hand():
    r = np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    v = baselines.ewma_variance(r, 0.94, init=2.0)
    # v0 = 0.94*2 + 0.06*1 = 1.94; v1 = 0.94*1.94 + 0.06*4 = 2.0636
    assert v[0] == pytest.approx(1.94) and v[1] == pytest.approx(2.0636)
    np.testing.assert_allclose(v, _ewma_by_hand(r, 0.94, 2.0), rtol=1e-12)


def test_every_baseline_by_hand(series):
    r, train, horizon = series, (0, 200), 3
    origins = np.array([210, 250, 399 - horizon])
    got = baselines.forecasts(r, origins, horizon, QS, train, window=50)
    assert set(got) == {
        "zero",
        "train_quantiles",
        "rolling",
        "ewma_gauss",
        "ewma_empirical",
        "gjr_fhs",  # tests/stats/test_garch.py
        "caviar",  # tests/stats/test_caviar.py
    }
    for p in got.values():
        assert p.shape == (3, horizon, 3)
    init = np.mean(r[:200] ** 2)
    v = _ewma_by_hand(r, 0.94, init)
    z = [norm.ppf(q) for q in QS]
    resid = np.array([r[t] / np.sqrt(v[t - 1]) for t in range(1, 200)])
    for i, T in enumerate(origins):
        sigma = np.sqrt(v[T])  # uses r[0..T] only
        for k in range(horizon):  # RiskMetrics: the same one-bar variance at every step
            np.testing.assert_allclose(got["ewma_gauss"][i, k], sigma * np.array(z), rtol=1e-9)
            np.testing.assert_allclose(
                got["ewma_empirical"][i, k], sigma * np.quantile(resid, QS), rtol=1e-9
            )
            np.testing.assert_allclose(
                got["rolling"][i, k], np.quantile(r[T - 49 : T + 1], QS), rtol=1e-12
            )
            np.testing.assert_allclose(got["train_quantiles"][i, k], np.quantile(r[:200], QS))
    np.testing.assert_array_equal(got["zero"], 0)


def test_baselines_are_causal(series):
    from tftjax.stats.seasonal import hour_of_week

    r = series.copy()
    origins = np.array([230, 260])
    ranges = r * r + 0.1
    hours = hour_of_week(np.arange(r.size) * 3_600_000_000_000)
    future = hours[:, None] + np.arange(1, 5)  # hour slots are known in advance
    decoder = np.stack([np.roll(r, -k) for k in range(1, 5)], axis=1)
    decoder[-4:] = np.nan

    def every(r, ranges, decoder):
        return baselines.forecasts(
            r,
            origins,
            4,
            QS,
            (0, 200),
            ranges=ranges,
            decoder_target=decoder,
            hours=(hours, future % 168),
        )

    a = every(r, ranges, decoder)
    assert {"caviar", "range_ewma_how", "qr_har"} <= set(a)
    r[261:], ranges[261:] = 100.0, 7.0  # everything after the last origin
    decoder[200:] = 50.0  # targets past the training rows (the fits read [0, 200) only)
    b = every(r, ranges, decoder)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_the_fixed_qr_inputs_are_the_har_means_and_the_last_return():
    r = np.array([0.1, -0.2, 0.3, 0.4, -0.5, 0.6])
    rv = np.array([1.0, 4.0, 9.0, 16.0, 25.0, 36.0])
    x = baselines.har_inputs(r, rv)
    assert x.shape == (6, 4)
    np.testing.assert_allclose(x[5], [6.0, np.sqrt(90 / 5), np.sqrt(91 / 6), 0.6])
    np.testing.assert_allclose(baselines.har_inputs(r)[1, :2], [0.2, np.sqrt(0.05 / 2)])


def test_ewma_beats_constant_quantiles_on_volatility_clusters():
    # GARCH-like series: a volatility model must beat the unconditional quantiles
    rng = np.random.default_rng(0)
    n, v, r = 6000, 1.0, np.empty(6000)
    for t in range(n):
        v = 0.01 + 0.2 * (r[t - 1] ** 2 if t else 1.0) + 0.79 * v
        r[t] = np.sqrt(v) * rng.standard_normal()
    origins = np.arange(3100, n - 5)
    y = r[origins[:, None] + 1 + np.arange(5)]
    preds = baselines.forecasts(r, origins, 5, QS, (0, 3000))
    m = {k: losses.numpy_metrics(y, p, QS) for k, p in preds.items()}
    assert m["ewma_gauss"]["loss"] < 0.97 * m["train_quantiles"]["loss"]
    assert abs(m["ewma_gauss"]["coverage_80"] - 0.8) < 0.03


def test_garch_baseline_follows_the_garch_recursion_by_hand():
    pytest.importorskip("arch")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "forecast_skill", REPO / "experiments" / "forecast_skill.py"
    )
    fs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fs)
    rng = np.random.default_rng(5)
    n, v, r = 1500, 1.0, np.empty(1500)
    for t in range(n):
        v = 0.05 + 0.1 * (r[t - 1] ** 2 if t else 1.0) + 0.85 * v
        r[t] = np.sqrt(v) * rng.standard_normal()
    origins = np.arange(1100, 1200)
    q = fs.garch_forecasts(r, origins, 4, QS, (0, 1000))  # [N, 4, Q]
    var = (q[..., 2] / norm.ppf(0.9)) ** 2  # Gaussian: q = z sigma
    from arch import arch_model

    p = (
        arch_model(r, mean="Zero", vol="GARCH", p=1, q=1, rescale=False)
        .fit(last_obs=1000, disp="off")
        .params
    )
    w, a, b = p["omega"], p["alpha[1]"], p["beta[1]"]
    # one step ahead: origin T uses r[T] and the previous origin's one-step variance
    np.testing.assert_allclose(var[1:, 0], w + a * r[origins[1:]] ** 2 + b * var[:-1, 0], rtol=1e-6)
    # h steps ahead: mean reversion at rate alpha + beta
    np.testing.assert_allclose(var[:, 1:], w + (a + b) * var[:, :-1], rtol=1e-6)
    np.testing.assert_allclose(q[..., 0], -q[..., 2], rtol=1e-9)


def test_range_baselines_by_hand():
    """Range EWMA and HAR-RV against plain loops on a short OHLC series."""
    rng = np.random.default_rng(7)
    n, lam, train, horizon = 120, 0.94, (0, 80), 3
    c = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    o = np.concatenate([[c[0]], c[:-1]]) * np.exp(rng.normal(0, 0.002, n))
    h = np.maximum(o, c) * np.exp(rng.exponential(0.004, n))
    lo = np.minimum(o, c) * np.exp(-rng.exponential(0.004, n))
    rv = [np.log(h[0] / lo[0]) ** 2 / (4 * np.log(2))]
    for t in range(1, n):
        rv.append(np.log(o[t] / c[t - 1]) ** 2 + np.log(h[t] / lo[t]) ** 2 / (4 * np.log(2)))
    rv = np.array(rv)
    np.testing.assert_allclose(baselines.range_variance(o, h, lo, c), rv, rtol=1e-12)
    r = np.concatenate([[0.0], np.diff(np.log(c))])
    origins = np.array([90, 100, 110])
    got = baselines.forecasts(r, origins, horizon, QS, train, ranges=rv, daily=True)
    # range EWMA: v_t = lam v_{t-1} + (1 - lam) rv_t from the training mean
    v, prev = [], np.mean(rv[:80])
    for x in rv:
        prev = lam * prev + (1 - lam) * x
        v.append(prev)
    sig = np.sqrt(v)
    res = [r[t] / sig[t - 1] for t in range(1, 80)]
    want = sig[origins][:, None] * np.quantile(res, QS)[None, :]
    np.testing.assert_allclose(got["range_ewma"][:, 0], want, rtol=1e-10)
    np.testing.assert_allclose(got["range_ewma"][:, 2], want, rtol=1e-10)

    # HAR: OLS of rv[t+1] on 1, rv[t], mean(rv[t-4..t]), mean(rv[t-21..t]), t in 21..78
    def x_at(series, t):
        return [1.0, series[t], np.mean(series[t - 4 : t + 1]), np.mean(series[t - 21 : t + 1])]

    X = np.array([x_at(rv, t) for t in range(21, 79)])
    beta = np.linalg.lstsq(X, rv[22:80], rcond=None)[0]
    floor = 1e-4 * np.mean(rv[:80])
    fit = [max(np.dot(x_at(rv, t), beta), floor) if t >= 21 else None for t in range(80)]
    har = baselines.har_features(rv) @ beta  # the first 21 rows: shorter means
    res = [
        r[t] / np.sqrt(fit[t - 1] if t - 1 >= 21 else max(har[t - 1], floor)) for t in range(1, 80)
    ]
    for j, T in enumerate(origins):
        path = list(rv[: T + 1])
        for k in range(horizon):
            f = max(np.dot(x_at(np.array(path), len(path) - 1), beta), floor)
            path.append(f)
            np.testing.assert_allclose(
                got["har"][j, k], np.sqrt(f) * np.quantile(res, QS), rtol=1e-9
            )
    assert "har" not in baselines.forecasts(r, origins, horizon, QS, train, ranges=rv)

    # the direct HAR: for each step k, OLS of rv[t+k] on the same regressors over t in
    # 21..79-k; its forecast at T is x(T) . beta_k (no iteration); the residuals are the
    # returns over the one-step regression's fit (beta_1 is the iterated HAR's beta)
    for k in range(1, horizon + 1):
        Xk = np.array([x_at(rv, t) for t in range(21, 80 - k)])
        bk = np.linalg.lstsq(Xk, rv[21 + k : 80], rcond=None)[0]
        if k == 1:
            np.testing.assert_allclose(bk, beta, rtol=1e-9)
        for j, T in enumerate(origins):
            f = max(np.dot(x_at(rv, T), bk), floor)
            np.testing.assert_allclose(
                got["har_direct"][j, k - 1], np.sqrt(f) * np.quantile(res, QS), rtol=1e-9
            )
    assert "har_direct" not in baselines.forecasts(r, origins, horizon, QS, train, ranges=rv)


def test_cumulative_baselines_by_hand(series):
    """``--target cumulative``: step k forecasts the k-bar sum."""
    r, train, horizon = series, (0, 200), 4
    origins = np.array([260, 300])
    bar = baselines.forecasts(r, origins, horizon, QS, train, window=50)
    cum = baselines.forecasts(r, origins, horizon, QS, train, window=50, cumulative=True)
    for k in range(1, horizon + 1):
        np.testing.assert_allclose(
            cum["ewma_gauss"][:, k - 1], np.sqrt(k) * bar["ewma_gauss"][:, 0]
        )
        sums = [r[t - k + 1 : t + 1].sum() for t in range(k - 1, 200)]
        np.testing.assert_allclose(cum["train_quantiles"][0, k - 1], np.quantile(sums, QS))
        for j, T in enumerate(origins):
            last = [r[t - k + 1 : t + 1].sum() for t in range(T - 49, T + 1)]
            np.testing.assert_allclose(cum["rolling"][j, k - 1], np.quantile(last, QS))
    np.testing.assert_array_equal(cum["zero"], 0.0)


def _pinball(y, p, q):
    e = y - p
    return np.maximum(q * e, (q - 1) * e).mean()


def test_quantile_regression_reaches_the_linear_programs_optimum():
    """The linear quantile regression baseline against the exact fit: the LP
    ``min Σ q u⁺ + (1-q) u⁻  s.t.  z·w + c + u⁺ - u⁻ = y`` (scipy's HiGHS) on the same
    principal-component scores, per step and level; and it is causal and train-only."""
    from scipy.optimize import linprog

    rng = np.random.default_rng(0)
    n, f, d = 600, 6, 2
    x = rng.normal(size=(n, f)).astype(np.float32)
    scale = np.exp(0.5 * x[:, 0])  # the features predict the spread of the next targets
    y = np.stack([scale * rng.standard_t(5, n), scale * rng.standard_t(5, n)], axis=1)
    dt = np.full((n, d), np.nan, np.float32)
    dt[:-1, 0], dt[:-2, 1] = y[1:, 0], y[2:, 1]  # row t's targets lie after t
    dt[100, 1] = np.nan  # a missing target is left out of the fit
    train = (0, 400)
    qs = np.array([0.1, 0.5, 0.9])
    origins = np.arange(0, 398)
    got = baselines.quantile_regression(x, dt, origins, qs, train, components=3)
    # the same scores by hand: centred, the first 3 principal directions, unit variance
    fit = x[: 400 - d].astype(np.float64)
    mu = fit.mean(0)
    _, sv, vt = np.linalg.svd(fit - mu, full_matrices=False)
    z = (fit - mu) @ (vt[:3].T / (sv[:3] / np.sqrt(len(fit))))
    zc = np.concatenate([z, np.ones((len(z), 1))], axis=1)
    for j in range(d):
        ok = np.isfinite(dt[: 400 - d, j])
        A, b = zc[ok], dt[: 400 - d, j][ok].astype(np.float64)
        m, p = A.shape
        for i, q in enumerate(qs):
            c = np.concatenate([np.zeros(p), np.full(m, q), np.full(m, 1 - q)])
            res = linprog(
                c,
                A_eq=np.hstack([A, np.eye(m), -np.eye(m)]),
                b_eq=b,
                bounds=[(None, None)] * p + [(0, None)] * (2 * m),
                method="highs",
            )
            exact = _pinball(b, A @ res.x[:p], q)
            ours = _pinball(b, got[: 400 - d][ok, j, i], q)
            assert exact <= ours <= exact * 1.01, (j, q, exact, ours)
    # causal: later features and targets change no forecast at earlier origins
    x2, dt2 = x.copy(), dt.copy()
    x2[450:] += 5
    dt2[420:] = 0
    again = baselines.quantile_regression(x2, dt2, origins[:440], qs, train, components=3)
    np.testing.assert_allclose(again, got[:440], rtol=1e-6, atol=1e-6)
    assert np.all(np.diff(got, axis=-1) >= 0)  # rearranged: no crossing


def test_a_late_starter_takes_the_pooled_standardised_quantiles():
    # a panel's series with 120 training rows: its EWMA's own sigma, and the 10/50/90%
    # quantiles of every series' standardised residuals together (by hand), not of its own
    rng = np.random.default_rng(11)
    long, short = rng.standard_t(4, 2000), 2.0 * rng.standard_t(4, 300)

    def resid(r, b):
        v = _ewma_by_hand(r, 0.94, np.mean(r[:b] ** 2))
        return np.array([r[t] / np.sqrt(v[t - 1]) for t in range(1, b)])

    inputs = [
        {"target": long, "train_rows": (0, 1500), "ranges": None, "daily": False},
        {"target": short, "train_rows": (0, 120), "ranges": None, "daily": False},
    ]
    pools = baselines.pooled_residuals(inputs)
    want = np.concatenate([resid(long, 1500), resid(short, 120)])
    np.testing.assert_allclose(pools["ewma_empirical"], want, rtol=1e-12)
    origins = np.array([150, 250])
    got = baselines.forecasts(short, origins, 2, QS, (0, 120), pools=pools)["ewma_empirical"]
    alone = baselines.forecasts(short, origins, 2, QS, (0, 120))["ewma_empirical"]
    v = _ewma_by_hand(short, 0.94, np.mean(short[:120] ** 2))
    for i, t in enumerate(origins):
        np.testing.assert_allclose(got[i, 0], np.sqrt(v[t]) * np.quantile(want, QS), rtol=1e-9)
        np.testing.assert_allclose(
            alone[i, 0], np.sqrt(v[t]) * np.quantile(resid(short, 120), QS), rtol=1e-9
        )
