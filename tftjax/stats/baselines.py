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
  ``har_direct``, the same HAR with its own OLS regression for every step ``h`` (direct,
  not iterated);
- ``gjr_fhs``: GJR-GARCH(1,1) (a fall raises the next variance more than a rise), Gaussian
  QML on the training rows, with filtered historical simulation: the training rows'
  standardised residuals resampled into paths of the recursion, so that steps ``h > 1``
  revert to the long-run variance with the leverage effect (:mod:`tftjax.stats.garch`,
  tested against ``arch``);
- ``caviar``: Engle and Manganelli's symmetric-absolute-value CAViaR, each level's own
  recursion ``f_t = β₀ + β₁ f_{t-1} + β₂ |r_t|`` fitted on its pinball loss
  (:mod:`tftjax.stats.caviar`);
- for intraday bars with a timeline, ``range_ewma_how``: the range EWMA of the variance
  with its hour-of-week profile taken out, each step's forecast times the profile of that
  step's hour (:mod:`tftjax.stats.seasonal`);
- with the TFT's own features (:func:`quantile_regression`): ``qr``, a linear quantile
  regression of every decoder step's target on the encoder features at the origin (their
  first 16 principal components on the training rows), fitted on the training windows;
- ``qr_har``: the same regression on a **fixed** set of four inputs that does not move
  with the TFT's features (:func:`har_inputs`: the root of the mean range variance over
  the last 1, 5 and 22 bars, and the last return; Žikeš and Baruník's quantile HAR).

Horizon: the targets are one-bar returns at steps ``1..D``; RiskMetrics'
``h``-step forecast of a one-bar variance is ``σ²_{T+1}`` for every ``h`` (no
mean reversion), so the EWMA quantiles are the same at every step (a
cumulative ``h``-bar return would scale them by ``√h``); GJR-GARCH's revert to the
long-run variance with ``h``.
"""

from __future__ import annotations

import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy.stats import norm

from tftjax.stats import caviar, garch, seasonal
from tftjax.stats.volatility import (  # noqa: F401
    HAR_LAGS,
    LAMBDA,
    anchor,
    ewma_variance,
    har_direct_fit,
    har_features,
    har_fit,
    har_forecasts,
    range_variance,
)

ROLLING_WINDOW = 250

NAMES = {
    "zero": "naive: zero return",
    "train_quantiles": "naive: train quantiles",
    "rolling": f"rolling {ROLLING_WINDOW}-bar quantiles",
    "ewma_gauss": "EWMA vol (0.94), Gaussian",
    "ewma_empirical": "EWMA vol (0.94), empirical",
    "range_ewma": "range EWMA (Parkinson+gap)",
    "range_ewma_how": "range EWMA, hour of week",
    "har": "HAR-RV (range), daily",
    "har_direct": "HAR-RV (range), a regression per step, daily",
    "gjr_fhs": "GJR-GARCH(1,1), FHS",
    "caviar": "CAViaR (symmetric abs.)",
    "qr": "linear quantile regression (features)",
    "qr_har": "quantile HAR (fixed inputs)",
    "last_value": "last value",
    "seasonal_naive": "seasonal naive (--season)",
}
QR_COMPONENTS = 16
QR_STEPS = 400


SCALE_FLOOR = 1e-3


def ewma_scale(target: np.ndarray, lam: float = LAMBDA) -> np.ndarray:
    """``σ[t]``: the RiskMetrics volatility forecast of ``target[t+1]`` made at ``t``, in target
    units (float32, at least :data:`SCALE_FLOOR`), started from 1 (the training targets' scale
    by construction). The per-window scale of a volatility-style target (``--vol-target``):
    a window whose last encoder row is ``T`` uses ``σ[T]``, a function of rows ``<= T``."""
    v = ewma_variance(target, lam, init=1.0)
    return np.maximum(np.sqrt(v), SCALE_FLOOR).astype(np.float32)


def rolling_quantiles(
    r: np.ndarray, origins: np.ndarray, quantiles, window: int = ROLLING_WINDOW, chunk: int = 8192
) -> np.ndarray:
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


def forecasts(  # noqa: PLR0913 - one keyword per optional input a baseline reads
    target: np.ndarray,
    origins: np.ndarray,
    horizon: int,
    quantiles,
    train_rows: tuple[int, int],
    *,
    window: int = ROLLING_WINDOW,
    ranges: np.ndarray | None = None,
    daily: bool = False,
    cumulative: bool = False,
    features: np.ndarray | None = None,
    decoder_target: np.ndarray | None = None,
    hours: tuple[np.ndarray, np.ndarray] | None = None,
    pools: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
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
        targets ``[n, horizon]`` (NaN: missing) add ``qr`` (:func:`quantile_regression`);
        ``decoder_target`` alone adds ``qr_har``.
      hours: intraday bars' hour of the week ``[n]`` and that of the ``k``-th calendar slot
        after each bar ``[n, horizon]`` (:func:`seasonal.hour_of_week`) add, with ``ranges``,
        ``range_ewma_how``.
      pools: for a panel's late starter, each volatility model's standardised residuals
        pooled over the panel's series (:func:`pooled_residuals`): its quantiles ``z`` come
        from them instead of the series' own few training rows.
    """
    qs = np.asarray(quantiles, np.float64)
    y = np.asarray(target, np.float64)
    a, b = train_rows
    train = y[a:b]
    v = ewma_variance(y, LAMBDA, init=float(np.mean(train * train)))
    sigma_next = np.sqrt(v)  # sigma_next[t]: forecast of |r[t+1]|'s scale, made at t
    per_origin = {
        "zero": np.zeros((origins.size, qs.size)),
        "train_quantiles": np.broadcast_to(np.quantile(train, qs), (origins.size, qs.size)),
        "rolling": rolling_quantiles(y, origins, qs, window),
        "ewma_gauss": sigma_next[origins, None] * norm.ppf(qs)[None, :],
    }
    out = {k: np.repeat(p[:, None, :], horizon, axis=1) for k, p in per_origin.items()}
    steps = np.arange(1, horizon + 1)
    if cumulative:
        out["ewma_gauss"] = out["ewma_gauss"] * np.sqrt(steps)[None, :, None]
        for h in steps[1:]:  # k-bar sums: their own empirical quantiles
            yk = np.convolve(y, np.ones(h))[: y.size]  # yk[t] = y[t-h+1] + … + y[t]
            out["train_quantiles"][:, h - 1] = np.quantile(yk[a + h - 1 : b], qs)
            out["rolling"][:, h - 1] = rolling_quantiles(yk, origins, qs, window)
    # the volatility models with empirical standardised quantiles (tftjax.stats.volatility.anchor)
    names = ["ewma_empirical"] + (
        ["range_ewma"] + (["har"] if daily else []) if ranges is not None else []
    )
    for name in names:
        out[name] = anchor(
            name,
            y,
            horizon,
            qs,
            train_rows,
            ranges=ranges,
            daily=daily,
            cumulative=cumulative,
            origins=origins,
            pool=(pools or {}).get(name),
        ).quantiles(np.arange(origins.size))
    if ranges is not None and daily:  # HAR with its own regression for every step
        out["har_direct"] = har_direct(
            y, np.asarray(ranges, np.float64), origins, horizon, qs, train_rows, cumulative
        )
    gjr = garch.fit(y[a:b])  # leverage: a fall raises the next variance more than a rise
    out["gjr_fhs"] = garch.fhs_quantiles(gjr, y, origins, horizon, qs, cumulative=cumulative)
    sav = caviar.fit(y[a:b], qs)
    out["caviar"] = caviar.quantiles(sav, y, origins, horizon, cumulative=cumulative)
    if ranges is not None and hours is not None:
        rv = np.asarray(ranges, np.float64)
        out["range_ewma_how"] = seasonal.quantiles(
            y, rv, *hours, origins, qs, train_rows, cumulative=cumulative
        )
    if features is not None and decoder_target is not None:
        out["qr"] = quantile_regression(features, decoder_target, origins, qs, train_rows)
    if decoder_target is not None:
        out["qr_har"] = quantile_regression(
            har_inputs(y, ranges), decoder_target, origins, qs, train_rows, components=4
        )
    return out


def har_inputs(y: np.ndarray, ranges: np.ndarray | None = None) -> np.ndarray:
    """``[n, 4]``: ``qr_har``'s fixed inputs at each row, from rows ``<=`` it: the root of
    the mean range variance over the last 1, 5 and 22 bars (:data:`HAR_LAGS`; the squared
    returns without ``ranges``) and the last return."""
    y = np.asarray(y, np.float64)
    v = y * y if ranges is None else np.asarray(ranges, np.float64)
    return np.column_stack([np.sqrt(har_features(v)[:, 1:]), y])


LATE_ROWS = 500
"""A panel's series with fewer training rows than this takes its volatility models'
standardised quantiles from every series' residuals pooled (its own 2% and 98% quantiles
would rest on a handful of rows)."""


def pooled_residuals(series: list[dict]) -> dict[str, np.ndarray]:
    """``{model: residuals}``: the standardised training residuals of each volatility model
    (:data:`tftjax.stats.volatility.ANCHORS` that the series can have) of every series,
    together. ``series``: each one's :func:`anchor` inputs (``target``, ``train_rows``,
    ``ranges``, ``daily``)."""
    out: dict[str, list] = {}
    for s in series:
        a, b = s["train_rows"]
        if b - a < 3:  # no residual to give
            continue
        names = ["ewma_empirical"] + (
            ["range_ewma"] + (["har"] if s["daily"] else []) if s["ranges"] is not None else []
        )
        for name in names:
            fitted = anchor(
                name,
                s["target"],
                1,
                (0.5,),
                (a, b),
                ranges=s["ranges"],
                daily=s["daily"],
                origins=np.array([a]),
            )
            if fitted.residuals is not None:
                out.setdefault(name, []).append(fitted.residuals)
    return {k: np.concatenate(v) for k, v in out.items()}


def har_direct(
    y: np.ndarray,
    rv: np.ndarray,
    origins: np.ndarray,
    horizon: int,
    qs: np.ndarray,
    train_rows: tuple[int, int],
    cumulative: bool = False,
) -> np.ndarray:
    """``[N, horizon, Q]``: the direct HAR's variance forecast of each step
    (:func:`~tftjax.stats.volatility.har_direct_fit`, at least ``1e-4`` of the training
    rows' mean range variance), its root times the empirical quantiles of the training
    returns standardised by its one-step fit (``cumulative``: the root of the summed
    variances)."""
    a, b = train_rows
    betas = har_direct_fit(rv, a, b, horizon)
    floor = 1e-4 * float(np.mean(rv[a:b]))
    fitted = np.maximum(har_features(rv) @ betas.T, floor)  # [n, horizon]
    z = np.quantile(y[a + 1 : b] / np.sqrt(fitted[a : b - 1, 0]), qs)
    var = fitted[origins]
    sigma = np.sqrt(np.cumsum(var, axis=1) if cumulative else var)
    return sigma[..., None] * z[None, None, :]


_QR_FITS: dict = {}
QR_FITS_KEPT = 2
"""Fits kept (the features' and the fixed inputs'): a dataset's tables come one after
another, each asking for both."""


def quantile_regression(
    features: np.ndarray,
    decoder_target: np.ndarray,
    origins: np.ndarray,
    quantiles,
    train_rows: tuple[int, int],
    *,
    components: int = QR_COMPONENTS,
    steps: int = QR_STEPS,
) -> np.ndarray:
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
    hit = _QR_FITS.pop(key, None)  # put back last: the most recently used
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
        c0 = np.stack(
            [
                np.nanquantile(y[:, j], qs) if np.isfinite(y[:, j]).any() else np.zeros(qs.size)
                for j in range(d)
            ]
        ).astype(np.float32)
        w, c = _qr_solve(
            jnp.asarray(zp), jnp.asarray(yp), jnp.asarray(qs, jnp.float32), jnp.asarray(c0), steps
        )
        hit = (
            weakref.ref(features),
            weakref.ref(decoder_target),
            mu,
            proj,
            np.asarray(w, np.float64),
            np.asarray(c, np.float64),
        )
        while len(_QR_FITS) >= QR_FITS_KEPT:  # the least recently used goes
            _QR_FITS.pop(next(iter(_QR_FITS)))
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
