"""GJR-GARCH(1,1) with filtered historical simulation (issue 50's baselines) against the
``arch`` package and by-hand recursions."""

import numpy as np
import pytest

from tftjax.stats import garch

TRUE = {"omega": 0.05, "alpha": 0.05, "gamma": 0.10, "beta": 0.85}  # unit variance


def simulate(n: int, seed: int = 0) -> np.ndarray:
    """GJR returns with normal innovations, by hand (a Python loop)."""
    rng = np.random.default_rng(seed)
    w, a, g, b = TRUE.values()
    v = w / (1 - a - g / 2 - b)
    r = np.empty(n)
    for t in range(n):
        r[t] = np.sqrt(v) * rng.standard_normal()
        v = w + (a + g * (r[t] < 0)) * r[t] ** 2 + b * v
    return r


def test_the_variance_filter_is_the_recursion_by_hand():
    r = np.random.default_rng(1).standard_normal(50)
    w, a, g, b, init = 0.1, 0.05, 0.2, 0.7, 1.3
    want, v = [], init
    for x in r:
        v = w + (a + g * (x < 0)) * x * x + b * v
        want.append(v)
    np.testing.assert_allclose(garch.variance(r, w, a, g, b, init), want, rtol=1e-12)


@pytest.fixture(scope="module")
def fitted():
    from arch import arch_model

    r = simulate(4000)
    ours = garch.fit(r)
    theirs = arch_model(r, mean="Zero", vol="GARCH", p=1, o=1, q=1, dist="normal").fit(disp="off")
    return r, ours, theirs


def test_the_fit_is_archs_quasi_maximum_likelihood(fitted):
    # the same Gaussian likelihood, started differently (arch backcasts the first variance
    # from the first 75 returns, we take the mean square): over 4,000 returns the start
    # moves the optimum by O(1/(n (1 - beta))) ~ 2e-3, a tenth of the estimates' standard
    # errors (~0.01-0.02 here); 0.01 on the coefficients, 20% on omega (its error is larger)
    r, ours, theirs = fitted
    p = theirs.params
    assert ours.alpha == pytest.approx(p["alpha[1]"], abs=0.01)
    assert ours.gamma == pytest.approx(p["gamma[1]"], abs=0.01)
    assert ours.beta == pytest.approx(p["beta[1]"], abs=0.01)
    assert ours.omega == pytest.approx(p["omega"], rel=0.2)
    # and ours maximises our likelihood: at arch's estimates it is no higher
    mine = -garch._neg_loglik(
        np.array([ours.omega, ours.alpha, ours.gamma, ours.beta]) / [ours.init, 1, 1, 1],
        r / np.sqrt(ours.init),
        1.0,
    )
    at_arch = -garch._neg_loglik(
        np.array([p["omega"] / ours.init, p["alpha[1]"], p["gamma[1]"], p["beta[1]"]]),
        r / np.sqrt(ours.init),
        1.0,
    )
    assert mine >= at_arch - 1e-6


def test_step_one_is_archs_variance_forecast_times_the_residual_quantiles(fitted):
    # at arch's own estimates, the one-step variance forecast from the last return; the
    # start's weight after 4,000 returns is beta^4000 (nothing): equal to float64 rounding
    r, ours, theirs = fitted
    p = theirs.params
    at_arch = garch.GJR(p["omega"], p["alpha[1]"], p["gamma[1]"], p["beta[1]"], 1.0, ours.residuals)
    want = theirs.forecast(horizon=1, reindex=False).variance.to_numpy()[-1, 0]
    qs = np.array([0.1, 0.5, 0.9])
    got = garch.fhs_quantiles(at_arch, r, np.array([r.size - 1]), 3, qs)
    np.testing.assert_allclose(
        got[0, 0], np.sqrt(want) * np.quantile(ours.residuals, qs), rtol=1e-9
    )


def test_the_simulated_paths_run_the_recursion_by_hand():
    # three paths of three steps from one origin: the draws, the recursion and the
    # quantiles over paths by hand (numpy's default linear quantile)
    rng = np.random.default_rng(2)
    r = rng.standard_normal(30)
    m = garch.GJR(0.1, 0.05, 0.3, 0.6, 1.0, rng.standard_normal(20))
    qs = np.array([0.25, 0.75])
    got = garch.fhs_quantiles(m, r, np.array([29]), 3, qs, paths=3, seed=7)
    got_cum = garch.fhs_quantiles(m, r, np.array([29]), 3, qs, paths=3, seed=7, cumulative=True)
    draws = m.residuals[np.random.default_rng(7).integers(0, 20, size=(3, 3))]
    v0 = garch.variance(r, m.omega, m.alpha, m.gamma, m.beta, m.init)[29]
    steps = np.empty((3, 3))
    for p in range(3):
        v = v0
        for h in range(3):
            steps[p, h] = np.sqrt(v) * draws[p, h]
            x = steps[p, h]
            v = m.omega + (m.alpha + m.gamma * (x < 0)) * x * x + m.beta * v
    for h in (1, 2):
        np.testing.assert_allclose(got[0, h], np.quantile(steps[:, h], qs), rtol=1e-12)
        total = steps[:, : h + 1].sum(axis=1)
        np.testing.assert_allclose(got_cum[0, h], np.quantile(total, qs), rtol=1e-12)
    exact = np.sqrt(v0) * np.quantile(m.residuals, qs)
    np.testing.assert_allclose(got[0, 0], exact, rtol=1e-12)
    np.testing.assert_allclose(got_cum[0, 0], exact, rtol=1e-12)
