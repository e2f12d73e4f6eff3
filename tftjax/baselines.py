"""Baseline forecasters a quant already has, on the same windows and targets as the TFT.

Every baseline gives, for a window whose last encoder bar is row ``T``, the
quantiles of the next ``D`` one-bar returns (in target scales, the TFT's own
units) from returns at rows ``<= T`` only:

- ``zero``: every quantile 0 (the P50 of a random walk);
- ``train_quantiles``: the unconditional quantiles of the training targets;
- ``rolling``: the empirical quantiles of the last ``window`` returns;
- ``ewma_gauss``: RiskMetrics volatility, ``σ²_{t+1} = λ σ²_t + (1-λ) r_t²``
  (``λ = 0.94``, started from the training rows' mean square), Gaussian
  quantiles ``z_q σ_{T+1}``;
- ``ewma_empirical``: the same ``σ_{T+1}`` times the empirical quantiles of the
  standardised residuals ``r_t / σ_t`` of the training rows (fat tails, skew);
- with the bars' ranges (:func:`range_variance`, what a desk's vol model sees):
  ``range_ewma``, the EWMA of the Parkinson variance plus the squared opening gap,
  ``v_t = λ v_{t-1} + (1-λ) (g_t² + ln(h_t/l_t)² / (4 ln 2))``, times the empirical
  standardised-residual quantiles; and for daily and coarser bars ``har``, Corsi's HAR-RV
  on the same range variance, ``RV_{t+1} = β₀ + β_d RV_t + β_w RV^{(5)}_t + β_m RV^{(22)}_t``
  (OLS on the training rows; steps ``h > 1`` iterate it on its own forecasts), times the
  empirical quantiles of the training returns standardised by its fitted one-step forecasts;
- with the TFT's own features (:func:`quantile_regression`): ``qr``, a linear quantile
  regression of every decoder step's target on the encoder features at the origin (their
  first 16 principal components on the training rows), fitted on the training windows.

Horizon: the targets are one-bar returns at steps ``1..D``; RiskMetrics'
``h``-step forecast of a one-bar variance is ``σ²_{T+1}`` for every ``h`` (no
mean reversion), so the EWMA quantiles are the same at every step (a
cumulative ``h``-bar return would scale them by ``√h``). GARCH(1,1), whose
forecasts revert to the long-run variance with ``h``, is in
``experiments/forecast_skill.py`` (``arch`` package, not a core dependency).
"""

from __future__ import annotations

import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy.signal import lfilter
from scipy.stats import norm

LAMBDA = 0.94
ROLLING_WINDOW = 250

NAMES = {
    "zero": "naive: zero return",
    "train_quantiles": "naive: train quantiles",
    "rolling": f"rolling {ROLLING_WINDOW}-bar quantiles",
    "ewma_gauss": "EWMA vol (0.94), Gaussian",
    "ewma_empirical": "EWMA vol (0.94), empirical",
    "range_ewma": "range EWMA (Parkinson+gap)",
    "har": "HAR-RV (range), daily",
    "qr": "linear quantile regression (features)",
}
QR_COMPONENTS = 16
QR_STEPS = 400
HAR_LAGS = (1, 5, 22)


def ewma_variance(r: np.ndarray, lam: float = LAMBDA, init: float | None = None) -> np.ndarray:
    """``v[t]``: the RiskMetrics variance forecast of ``r[t+1]`` made at ``t`` (uses
    ``r[0..t]``): ``v[t] = λ v[t-1] + (1-λ) r[t]²``, ``v[-1] = init`` (default ``r[0]²``)."""
    r = np.asarray(r, np.float64)
    init = float(r[0] ** 2) if init is None else float(init)
    v, _ = lfilter([1.0 - lam], [1.0, -lam], r * r, zi=[lam * init])
    return v


SCALE_FLOOR = 1e-3


def ewma_scale(target: np.ndarray, lam: float = LAMBDA) -> np.ndarray:
    """``σ[t]``: the RiskMetrics volatility forecast of ``target[t+1]`` made at ``t``, in target
    units (float32, at least :data:`SCALE_FLOOR`), started from 1 (the training targets' scale
    by construction). The per-window scale of a volatility-style target (``--vol-target``):
    a window whose last encoder row is ``T`` uses ``σ[T]``, a function of rows ``<= T``."""
    v = ewma_variance(target, lam, init=1.0)
    return np.maximum(np.sqrt(v), SCALE_FLOOR).astype(np.float32)


def rolling_quantiles(r: np.ndarray, origins: np.ndarray, quantiles, window: int = ROLLING_WINDOW,
                      chunk: int = 8192) -> np.ndarray:
    """Empirical quantiles ``[N, Q]`` of ``r[T-window+1 .. T]`` for each origin ``T``
    (fewer values where the series is shorter)."""
    r = np.asarray(r, np.float64)
    out = np.empty((origins.size, len(quantiles)))
    pad = np.concatenate([np.full(window - 1, np.nan), r])
    view = np.lib.stride_tricks.sliding_window_view(pad, window)  # view[T] = r[T-w+1 .. T]
    for a in range(0, origins.size, chunk):
        block = view[origins[a : a + chunk]]
        out[a : a + chunk] = np.nanquantile(block, quantiles, axis=1).T
    return out


def range_variance(open_: np.ndarray, high: np.ndarray, low: np.ndarray,
                   close: np.ndarray) -> np.ndarray:
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


def har_forecasts(rv: np.ndarray, beta: np.ndarray, origins: np.ndarray, horizon: int,
                  floor: float) -> np.ndarray:
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


def forecasts(target: np.ndarray, origins: np.ndarray, horizon: int, quantiles,
              train_rows: tuple[int, int], *, lam: float = LAMBDA,
              window: int = ROLLING_WINDOW, ranges: np.ndarray | None = None,
              daily: bool = False, cumulative: bool = False,
              features: np.ndarray | None = None,
              decoder_target: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Quantile forecasts ``{name: [N, horizon, Q]}`` of every baseline.

    Args:
      target: the series' targets (one-bar returns in target scales) ``[n]``.
      origins: forecast origins ``T`` (last encoder rows) ``[N]``.
      horizon: decoder steps ``D``; quantiles: ``[Q]``.
      train_rows: ``[start, stop)`` of the training rows (fits the unconditional and the
        standardised-residual quantiles and the EWMA's starting variance).
      ranges: :func:`range_variance` of the bars in target units² (adds ``range_ewma``, and
        with ``daily`` ``har``).
      cumulative: forecast the k-bar cumulative return at step k (``--target cumulative``):
        the naive and rolling quantiles of k-bar sums, the volatility models' one-bar
        quantiles times ``√k`` (EWMA: a flat variance forecast) or, for HAR, the square root
        of its summed variance forecasts over the standardised residual quantiles.
      features, decoder_target: the encoder features ``[n, F]`` and every row's decoder
        targets ``[n, horizon]`` (NaN: missing) add ``qr`` (:func:`quantile_regression`).
    """
    qs = np.asarray(quantiles, np.float64)
    y = np.asarray(target, np.float64)
    a, b = train_rows
    train = y[a:b]
    v = ewma_variance(y, lam, init=float(np.mean(train * train)))
    sigma_next = np.sqrt(v)  # sigma_next[t]: forecast of |r[t+1]|'s scale, made at t
    # standardised residuals on the training rows: r[t] / sigma forecast made at t-1
    resid = y[a + 1 : b] / np.maximum(sigma_next[a : b - 1], 1e-12)
    per_origin = {
        "zero": np.zeros((origins.size, qs.size)),
        "train_quantiles": np.broadcast_to(np.quantile(train, qs), (origins.size, qs.size)),
        "rolling": rolling_quantiles(y, origins, qs, window),
        "ewma_gauss": sigma_next[origins, None] * norm.ppf(qs)[None, :],
        "ewma_empirical": sigma_next[origins, None] * np.quantile(resid, qs)[None, :],
    }
    out = {k: np.repeat(p[:, None, :], horizon, axis=1) for k, p in per_origin.items()}
    steps = np.arange(1, horizon + 1)
    if cumulative:
        root = np.sqrt(steps)[None, :, None]
        for k in ("ewma_gauss", "ewma_empirical"):
            out[k] = out[k] * root
        for h in steps[1:]:  # k-bar sums: their own empirical quantiles
            yk = np.convolve(y, np.ones(h))[: y.size]  # yk[t] = y[t-h+1] + … + y[t]
            out["train_quantiles"][:, h - 1] = np.quantile(yk[a + h - 1 : b], qs)
            out["rolling"][:, h - 1] = rolling_quantiles(yk, origins, qs, window)
    if ranges is not None:
        rv = np.asarray(ranges, np.float64)
        vr = np.sqrt(ewma_variance(rv ** 0.5, lam, init=float(np.mean(rv[a:b]))))
        res = y[a + 1 : b] / np.maximum(vr[a : b - 1], 1e-12)
        out["range_ewma"] = np.repeat((vr[origins, None] * np.quantile(res, qs)[None, :])
                                      [:, None, :], horizon, axis=1)
        if cumulative:
            out["range_ewma"] = out["range_ewma"] * np.sqrt(steps)[None, :, None]
        if daily:
            beta = har_fit(rv, a, b)
            floor = 1e-4 * float(np.mean(rv[a:b]))
            fit = np.sqrt(np.maximum(har_features(rv) @ beta, floor))  # of RV[t+1], at t
            res = y[a + 1 : b] / fit[a : b - 1]
            var = har_forecasts(rv, beta, origins, horizon, floor)
            sig = np.sqrt(np.cumsum(var, axis=1) if cumulative else var)
            out["har"] = sig[..., None] * np.quantile(res, qs)[None, None, :]
    if features is not None and decoder_target is not None:
        out["qr"] = quantile_regression(features, decoder_target, origins, qs, train_rows)
    return out


_QR_FITS: dict = {}


def quantile_regression(features: np.ndarray, decoder_target: np.ndarray, origins: np.ndarray,
                        quantiles, train_rows: tuple[int, int], *,
                        components: int = QR_COMPONENTS, steps: int = QR_STEPS) -> np.ndarray:
    """Linear quantile regression on the encoder features at the origin, ``[N, D, Q]``.

    Fitted on the training windows only: origins ``t`` with ``[t, t + D]`` inside
    ``train_rows``. The features of row ``t`` (built from bars ``<= t``) are centred and
    projected on their first ``components`` principal directions on those rows, scaled to
    unit variance (210 collinear columns would overfit the ~10³-10⁴ training windows); then
    for every decoder step ``k`` and level ``q`` a linear model ``z_t · w_{k,q} + c_{k,q}``
    minimises the mean pinball loss over the observed targets (a convex problem, solved by
    ``steps`` full-batch Adam steps from the unconditional quantiles, deterministic). The
    forecasts are sorted along the levels (rearrangement: it never raises the pinball loss).
    Each fit is kept for the same arrays, so the train, validation and test tables share it.
    """
    qs = np.asarray(quantiles, np.float64)
    a, b = train_rows
    d = decoder_target.shape[1]
    key = (id(features), features.shape, id(decoder_target), a, b, tuple(qs), components, steps)
    hit = _QR_FITS.get(key)
    if hit is None or hit[0]() is not features or hit[1]() is not decoder_target:
        x = np.asarray(features[a : b - d], np.float64)
        y = np.asarray(decoder_target[a : b - d], np.float64)
        mu = x.mean(axis=0)
        _, sv, vt = np.linalg.svd(x - mu, full_matrices=False)
        k = min(components, vt.shape[0])
        proj = vt[:k].T / np.maximum(sv[:k] / np.sqrt(x.shape[0]), 1e-12)
        z = (x - mu) @ proj
        rows = 1 << int(np.ceil(np.log2(max(z.shape[0], 2))))  # padded: few compiles
        zp = np.zeros((rows, k), np.float32)
        zp[: z.shape[0]] = z
        yp = np.full((rows, d), np.nan, np.float32)
        yp[: y.shape[0]] = y
        c0 = np.stack([np.nanquantile(y[:, j], qs) if np.isfinite(y[:, j]).any()
                       else np.zeros(qs.size) for j in range(d)]).astype(np.float32)
        w, c = _qr_solve(jnp.asarray(zp), jnp.asarray(yp), jnp.asarray(qs, jnp.float32),
                         jnp.asarray(c0), steps)
        hit = (weakref.ref(features), weakref.ref(decoder_target), mu, proj,
               np.asarray(w, np.float64), np.asarray(c, np.float64))
        _QR_FITS.clear()  # one fit kept: a dataset's tables come one after another
        _QR_FITS[key] = hit
    _, _, mu, proj, w, c = hit
    z = (np.asarray(features[origins], np.float64) - mu) @ proj
    return np.sort(np.einsum("nk,kdq->ndq", z, w) + c, axis=-1)


@functools.partial(jax.jit, static_argnums=4)
def _qr_solve(z, y, qs, c0, steps: int):
    """Minimise the mean observed pinball loss of ``z @ w + c`` (``[n, D, Q]``) by Adam
    (jitted once per padded shape)."""
    ok = jnp.isfinite(y)
    y0 = jnp.where(ok, y, 0.0)

    def loss(p):
        err = y0[..., None] - (jnp.einsum("nk,kdq->ndq", z, p[0]) + p[1])
        pin = jnp.maximum(qs * err, (qs - 1.0) * err) * ok[..., None]
        return pin.sum() / jnp.maximum(ok.sum() * qs.size, 1)

    opt = optax.adam(optax.cosine_decay_schedule(0.05, steps))
    p = (jnp.zeros((z.shape[1],) + c0.shape, jnp.float32), c0)

    def step(carry, _):
        p, s = carry
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return (optax.apply_updates(p, u), s), None

    (p, _), _ = jax.lax.scan(step, (p, opt.init(p)), None, length=steps)
    return p
