"""Volatility forecasts a quant already has, and the anchors the TFT's head can start from.

- :func:`ewma_variance`: RiskMetrics, ``v[t] = λ v[t-1] + (1-λ) r[t]²``;
- :func:`range_variance`: the per-bar Parkinson variance plus the squared opening gap;
- :func:`har_fit`, :func:`har_features`, :func:`har_forecasts`: Corsi's HAR-RV on it;
  :func:`har_direct_fit`: HAR with a regression per forecast step;
- :func:`anchor`: one volatility model as an **anchor**, ``σ[t, k]`` (its forecast, made at
  row ``t`` from rows ``<= t``, of the scale of the target ``k`` steps ahead) and ``z``
  (the empirical quantiles of the training rows' targets standardised by its one-step
  forecasts). ``σ[T, k] · z`` are exactly that baseline's quantile forecasts
  (:func:`tftjax.stats.baselines.forecasts`), and the TFT's anchored head
  (``--anchor``) forecasts ``σ[T, k] · exp(s) · (z + Δ)`` around them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.signal import lfilter

LAMBDA = 0.94
HAR_LAGS = (1, 5, 22)
ANCHORS = ("ewma_empirical", "range_ewma", "har")
"""The volatility baselines that can anchor the TFT (``range_ewma`` needs the bars' ranges,
``har`` also daily or coarser bars)."""


def ewma_variance(r: np.ndarray, lam: float = LAMBDA, init: float | None = None) -> np.ndarray:
    """``v[t]``: the RiskMetrics variance forecast of ``r[t+1]`` made at ``t`` (uses
    ``r[0..t]``): ``v[t] = λ v[t-1] + (1-λ) r[t]²``, ``v[-1] = init`` (default ``r[0]²``)."""
    r = np.asarray(r, np.float64)
    init = float(r[0] ** 2) if init is None else float(init)
    v, _ = lfilter([1.0 - lam], [1.0, -lam], r * r, zi=[lam * init])
    return v


def range_variance(
    open_: np.ndarray, high: np.ndarray, low: np.ndarray, close: np.ndarray
) -> np.ndarray:
    """Per-bar variance proxy of the close-to-close log return from the bar's range and its
    opening gap: ``ln(o_t / c_{t-1})² + ln(h_t / l_t)² / (4 ln 2)`` (Parkinson plus the gap;
    row 0 has no gap)."""
    gap = np.zeros(close.shape[0])
    gap[1:] = np.log(open_[1:] / close[:-1])
    return gap * gap + np.log(high / low) ** 2 / (4.0 * np.log(2.0))


def har_fit(rv: np.ndarray, a: int, b: int) -> np.ndarray:
    """OLS ``β`` of ``RV_{t+1}`` on ``[1, RV_t, RV^{(5)}_t, RV^{(22)}_t]`` over ``t`` in the
    training rows ``[a, b)`` (from the 22nd)."""
    X = har_features(rv)
    t = np.arange(max(a, HAR_LAGS[-1] - 1), b - 1)
    beta, *_ = np.linalg.lstsq(X[t], rv[t + 1], rcond=None)
    return beta


def har_direct_fit(rv: np.ndarray, a: int, b: int, horizon: int) -> np.ndarray:
    """``[horizon, 4]``: for each step ``h``, the OLS ``β_h`` of ``RV_{t+h}`` on
    ``[1, RV_t, RV^{(5)}_t, RV^{(22)}_t]`` over ``t`` in the training rows ``[a, b)`` with
    ``t + h`` in them too (from the 22nd): a direct forecast per step, where :func:`har_fit`
    iterates the one-step model on its own forecasts."""
    X = har_features(rv)
    betas = []
    for h in range(1, horizon + 1):
        t = np.arange(max(a, HAR_LAGS[-1] - 1), b - h)
        beta, *_ = np.linalg.lstsq(X[t], rv[t + h], rcond=None)
        betas.append(beta)
    return np.stack(betas)


def har_features(rv: np.ndarray) -> np.ndarray:
    """``[n, 4]``: 1 and the means of the last 1, 5 and 22 values ending at each row (fewer at
    the start)."""
    cs = np.concatenate([[0.0], np.cumsum(rv)])
    t = np.arange(rv.size)
    cols = [np.ones(rv.size)]
    for L in HAR_LAGS:
        lo = np.maximum(t + 1 - L, 0)
        cols.append((cs[t + 1] - cs[lo]) / (t + 1 - lo))
    return np.stack(cols, axis=1)


def har_forecasts(
    rv: np.ndarray, beta: np.ndarray, origins: np.ndarray, horizon: int, floor: float
) -> np.ndarray:
    """``[N, horizon]`` HAR forecasts of ``RV_{T+h}``: step 1 from the data, later steps on
    the forecasts before them (at least ``floor``)."""
    m = HAR_LAGS[-1]
    pad = np.concatenate([np.full(m - 1, np.nan), rv])
    hist = np.lib.stride_tricks.sliding_window_view(pad, m)[origins].copy()  # [N, 22]
    out = np.empty((origins.size, horizon))
    for h in range(horizon):
        x = [np.ones(origins.size)] + [np.nanmean(hist[:, -L:], axis=1) for L in HAR_LAGS]
        f = np.maximum(np.stack(x, axis=1) @ beta, floor)
        out[:, h] = f
        hist = np.concatenate([hist[:, 1:], f[:, None]], axis=1)
    return out


@dataclasses.dataclass(frozen=True)
class Anchor:
    """A volatility model's forecasts as an anchor: ``sigma [n, D]`` (row ``t``'s forecast
    of the scale of the target ``k`` steps ahead, ``k = 1..D``, in target units) and ``z
    [Q]`` (standardised quantiles of the training rows)."""

    name: str
    sigma: np.ndarray
    z: np.ndarray
    fit: dict
    """What was fitted on the training rows (``name``, ``z``, and ``init``: the EWMA's
    starting variance, or ``beta`` and ``floor``: HAR's); :func:`anchor` takes it back to
    forecast other rows of the series, or another file of it, alike."""
    residuals: np.ndarray | None = None
    """The training rows' targets standardised by the one-step forecasts (``z``'s source;
    None where ``z`` came with a ``fit``): what a panel pools for its late starters."""

    def quantiles(self, origins: np.ndarray) -> np.ndarray:
        """``[N, D, Q]``: the anchor's own quantile forecasts at ``origins``."""
        return self.sigma[origins][..., None] * self.z[None, None, :]


def anchor(
    name: str,
    target: np.ndarray,
    horizon: int,
    quantiles,
    train_rows: tuple[int, int],
    *,
    ranges: np.ndarray | None = None,
    daily: bool = False,
    cumulative: bool = False,
    lam: float = LAMBDA,
    origins: np.ndarray | None = None,
    fit: dict | None = None,
    pool: np.ndarray | None = None,
) -> Anchor:
    """The anchor ``name`` (:data:`ANCHORS`) of one series at ``origins`` (default: every
    row): ``target`` the one-bar returns in target units, ``train_rows`` ``[a, b)`` the rows
    its fit and standardised quantiles come from, ``ranges`` :func:`range_variance` in target
    units², ``daily`` bars (HAR), ``cumulative`` the k-bar cumulative target (one-bar scales
    times ``√k``; HAR: the root of its summed variance forecasts).

    ``fit``: an earlier :attr:`Anchor.fit` of this anchor (``train_rows`` are then not read).
    ``pool``: standardised residuals to take ``z`` from instead of the series' own (a
    panel's late starter: every series' :attr:`Anchor.residuals` together).

    Raises:
      ValueError: an unknown name, ``range_ewma``/``har`` without ranges, ``har`` on bars
        finer than daily, a ``fit`` of another anchor.
    """
    if fit is not None and fit.get("name") != name:
        raise ValueError(f"a fit of the {fit.get('name')} anchor given for {name}")
    qs = np.asarray(quantiles, np.float64)
    y = np.asarray(target, np.float64)
    a, b = train_rows
    n = y.size
    origins = np.arange(n) if origins is None else np.asarray(origins)
    steps = np.arange(1, horizon + 1)
    if name == "ewma_empirical":
        init = fit["init"] if fit else float(np.mean(y[a:b] ** 2))
        sig1 = np.sqrt(ewma_variance(y, lam, init=init))
    elif name in ("range_ewma", "har"):
        if ranges is None:
            raise ValueError(f"the {name} anchor needs the bars' ranges")
        rv = np.asarray(ranges, np.float64)
        if name == "range_ewma":
            init = fit["init"] if fit else float(np.mean(rv[a:b]))
            sig1 = np.sqrt(ewma_variance(rv**0.5, lam, init=init))
        else:
            if not daily:
                raise ValueError("the har anchor is defined for daily or coarser bars only")
            beta = np.asarray(fit["beta"]) if fit else har_fit(rv, a, b)
            floor = fit["floor"] if fit else 1e-4 * float(np.mean(rv[a:b]))
            sig1 = np.sqrt(np.maximum(har_features(rv) @ beta, floor))  # of RV[t+1], at t
            e = None if fit else y[a + 1 : b] / sig1[a : b - 1]
            z = _standardised_quantiles(fit, e, pool, qs)
            var = har_forecasts(rv, beta, origins, horizon, floor)
            return Anchor(
                name,
                np.sqrt(np.cumsum(var, axis=1) if cumulative else var),
                z,
                {"name": name, "z": z.tolist(), "beta": beta.tolist(), "floor": floor},
                e,
            )
    else:
        raise ValueError(f"unknown anchor {name!r}: one of {', '.join(ANCHORS)}")
    # RiskMetrics-style: a flat one-bar variance forecast at every step
    e = None if fit else y[a + 1 : b] / np.maximum(sig1[a : b - 1], 1e-12)
    z = _standardised_quantiles(fit, e, pool, qs)
    sigma = np.repeat(sig1[origins, None], horizon, axis=1)
    if cumulative:
        sigma = sigma * np.sqrt(steps)[None, :]
    return Anchor(name, sigma, z, {"name": name, "z": z.tolist(), "init": init}, e)


def _standardised_quantiles(fit: dict | None, own, pool, qs) -> np.ndarray:
    """``z``: a saved fit's, else the empirical quantiles of the pool (a panel's late
    starter) or of the series' own standardised residuals."""
    if fit:
        return np.asarray(fit["z"])
    return np.quantile(np.asarray(own if pool is None else pool), qs)
