"""Windows: splits with embargo, epochs that see every window once, gather vs numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.config import DataConfig
from tftjax.data import (
    DataError,
    build_features,
    epoch_batches,
    gather,
    load_dataset,
    make_splits,
    to_device,
)
from tftjax.data.features import WARMUP

CFG = DataConfig()


@pytest.fixture(scope="module")
def dataset():
    return load_dataset()  # the bundled ES bars


@pytest.fixture(scope="module")
def gather_jit():
    return jax.jit(gather, static_argnums=(2, 3))


def test_splits_are_ordered_with_a_full_window_embargo(dataset):
    s, W = dataset.splits, CFG.window
    assert s.train_rows[0] == WARMUP
    assert s.val_rows[0] - s.train_rows[1] == W and s.test_rows[0] - s.val_rows[1] == W
    assert s.test_rows[1] == len(dataset.bars)
    for name in ("train", "val", "test"):
        a, b = s.rows(name)
        starts = getattr(s, name)
        assert starts.size > 0
        assert starts.min() == a and starts.max() + W == b  # every complete window, no more
    # The last row of any train window and the first row of any val window are
    # at least one window apart; likewise val → test.
    assert s.val.min() - (s.train.max() + W - 1) > W
    assert s.test.min() - (s.val.max() + W - 1) > W


def test_statistics_fitted_on_train_rows(dataset):
    assert dataset.features.stats.train_rows == dataset.splits.train_rows


def test_too_little_data_for_splits_names_the_source():
    with pytest.raises(DataError, match=r"bars\.parquet: 400 rows leave the val split"):
        make_splits(400, CFG, source="bars.parquet")


def test_custom_embargo_and_fractions():
    s = make_splits(5000, DataConfig(train_fraction=0.5, val_fraction=0.25, embargo=7))
    assert s.val_rows[0] - s.train_rows[1] == 7
    assert s.train_rows[1] - s.train_rows[0] == int((5000 - WARMUP - 14) * 0.5)


@pytest.mark.parametrize("batch", [1, 64, 100, 2000])
def test_every_window_once_per_epoch(dataset, batch):
    starts = dataset.splits.train
    idx, mask = epoch_batches(starts, batch, seed=3, epoch=0)
    assert idx.shape == mask.shape and idx.shape[1] == batch
    assert idx.shape[0] == -(-starts.size // batch)
    seen = np.sort(idx[mask])
    np.testing.assert_array_equal(seen, starts)  # each exactly once
    assert mask.sum() == starts.size


def test_epochs_are_shuffled_and_seeded(dataset):
    starts = dataset.splits.train
    a, _ = epoch_batches(starts, 32, seed=1, epoch=0)
    b, _ = epoch_batches(starts, 32, seed=1, epoch=0)
    c, _ = epoch_batches(starts, 32, seed=1, epoch=1)
    d, _ = epoch_batches(starts, 32, seed=2, epoch=0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)
    e, _ = epoch_batches(starts, 32, seed=1, epoch=0, shuffle=False)
    np.testing.assert_array_equal(e.ravel()[: starts.size], starts)


def test_gather_shapes_and_values_equal_numpy_slices(dataset, gather_jit):
    fs = dataset.features
    data = to_device(fs)
    starts = np.array([dataset.splits.train[0], 300, dataset.splits.test[-1], 1000], np.int32)
    batch = gather_jit(data, jnp.asarray(starts), 50, 10)
    assert batch.static.shape == (4, 5)
    assert batch.historical.shape == (4, 50, 210)
    assert batch.known.shape == (4, 60, 10)
    assert batch.target.shape == (4, 10)
    for i, s in enumerate(starts):
        np.testing.assert_array_equal(batch.historical[i], fs.historical[s : s + 50])
        np.testing.assert_array_equal(batch.known[i, :50], fs.known[s : s + 50])
        # decoder steps: the calendar slots after the last encoder bar, not the later bars
        np.testing.assert_array_equal(batch.known[i, 50:], fs.future[s + 49])
        np.testing.assert_allclose(
            batch.target[i], grid_targets(dataset, s + 49, 10), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_array_equal(batch.static[i], fs.static)


def grid_targets(ds, origin: int, steps: int, cumulative: bool = False) -> np.ndarray:
    """By hand from the bars: step k's target is the bar stamped origin + k minutes (the
    bundled ES bars' grid without a calendar), its log return since the bar before it
    (cumulative: since the origin's close) in target scales; NaN where no bar has that time."""
    ts, close = ds.bars.ts.astype(np.int64), ds.bars.close.astype(np.float64)
    out = np.full(steps, np.nan)
    for k in range(1, steps + 1):
        j = np.flatnonzero(ts == ts[origin] + k * 60_000_000_000)
        if j.size:
            ref = origin if cumulative else j[0] - 1
            out[k - 1] = np.log(close[j[0]] / close[ref]) / ds.features.stats.target_scale
    return out


def test_decoder_targets_are_masked_at_the_bundled_es_gaps(dataset):
    """A missing minute is a missing target, not the next bar shifted into its step: at every
    window whose 10 decoder slots cross one of the ES file's gaps, the steps after the gap
    keep their own minutes' bars, and the loss and the metrics leave the missing ones out."""
    from tftjax.config import preset
    from tftjax.stats import losses, scoring
    from tftjax.training.evaluation import window_targets

    ts = dataset.bars.ts.astype(np.int64)
    gaps = np.flatnonzero(np.diff(ts) > 60_000_000_000)  # bar gaps[i] is followed by a gap
    gaps = gaps[(gaps > WARMUP + 60) & (gaps < len(ts) - 20)]
    assert gaps.size >= 5
    starts = np.concatenate([gaps - 49 - 3, gaps - 49 - 8]).astype(np.int32)  # gap after step 3/8
    y = window_targets(dataset, starts)
    for s, row in zip(starts, y):
        np.testing.assert_allclose(row, grid_targets(dataset, s + 49, 10), rtol=1e-5, atol=1e-6)
    assert np.isnan(y).any() and np.isfinite(y).any()
    # the first gap: the step after it is missing where the shifted target was a bar's return
    first = y[0]
    assert np.isfinite(first[:3]).all() and np.isnan(first[3])
    # masked loss and metric sums against a numpy reference over the observed steps only
    qs = preset("tiny").head.quantiles
    rng = np.random.default_rng(0)
    pred = np.sort(rng.normal(size=y.shape + (len(qs),)), axis=-1).astype(np.float32)
    ok = np.isfinite(y)
    err = np.where(ok, y, 0)[..., None] - pred
    pin = np.maximum(np.asarray(qs) * err, (np.asarray(qs) - 1) * err) * ok[..., None]
    want = pin.mean(-1).sum(-1).mean() / y.shape[1]
    got = losses.quantile_loss(jnp.asarray(y), jnp.asarray(pred), qs)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    i90 = list(qs).index(0.9)
    q90 = 2 * pin[..., i90].sum() / np.abs(y[ok]).sum()
    m = losses.finalize(
        losses.metric_sums(jnp.asarray(y), jnp.asarray(pred), qs, jnp.ones(len(y), bool))
    )
    np.testing.assert_allclose(m["q_risk_90"], q90, rtol=1e-5)
    np.testing.assert_allclose(
        scoring.from_sums(scoring.window_sums(y, pred, qs))["q_risk_90"], q90, rtol=1e-6
    )
    np.testing.assert_allclose(losses.numpy_metrics(y, pred, qs)["q_risk_90"], q90, rtol=1e-6)
    assert scoring.window_sums(y, pred, qs)[:, 5].sum() == ok.sum()
    # and the gradient of the loss is finite (a NaN target must not poison the update)
    g = jax.grad(lambda p: losses.quantile_loss(jnp.asarray(y), p, qs))(jnp.asarray(pred))
    assert np.isfinite(np.asarray(g)).all()


def test_gather_runs_on_device_without_host_copies(dataset, gather_jit):
    data = to_device(dataset.features)
    starts = jax.device_put(jnp.asarray(dataset.splits.train[:8]))
    gather_jit(data, starts, 50, 10)  # compile
    with jax.transfer_guard("disallow"):
        batch = gather_jit(data, starts, 50, 10)
    assert batch.historical.shape == (8, 50, 210)


def test_features_of_a_small_config(small_bars):
    cfg = DataConfig(encoder_steps=8, decoder_steps=3)
    s = make_splits(len(small_bars), cfg)
    fs = build_features(small_bars, cfg, train_rows=s.train_rows)
    batch = gather(to_device(fs), jnp.asarray(s.val[:5]), 8, 3)
    assert batch.historical.shape == (5, 8, 210) and batch.known.shape == (5, 11, 10)


def test_fan_titles_show_the_bars_own_times():
    # the run's quantile fans title each window with its first forecast bar; checked against
    # the parquet file's own time column, read by pyarrow (a fresh clone once showed
    # "2620407105926-01-18T16:00": nanoseconds read as minutes)
    import datetime

    import pyarrow.parquet as pq
    from conftest import short_es

    from tftjax.config import preset
    from tftjax.data import load_dataset
    from tftjax.plots import window_titles

    cfg = preset("tiny")
    ds = load_dataset(short_es(), cfg.data)
    starts = ds.splits.test[[0, -1]]
    table = pq.read_table(short_es())
    col = next(
        c
        for c in table.column_names
        if c.lower() in ("ts", "ts_event", "timestamp", "datetime", "date")
    )
    times = table.column(col).to_pylist()
    want = []
    for s in starts:
        t = times[int(s) + cfg.data.encoder_steps]
        if isinstance(t, datetime.datetime) and t.tzinfo is not None:
            t = t.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        want.append(f"first forecast bar {t.strftime('%Y-%m-%dT%H:%M')}")
    assert window_titles(ds.bars.ts, starts, cfg.data.encoder_steps) == want


def test_cumulative_targets_are_the_k_bar_sums(dataset):
    """``--target cumulative``: decoder step k's target is the sum of the bars' 1-bar targets
    from the origin, on the device (the train and eval steps' gather) and on the host."""
    from tftjax.config import preset
    from tftjax.training.evaluation import window_targets
    from tftjax.training.steps import _gather_fn

    cfg = preset("tiny", target="cumulative")
    ds = load_dataset(None, cfg.data)
    e, d = cfg.data.encoder_steps, cfg.data.decoder_steps
    ts = ds.bars.ts.astype(np.int64)
    gap = int(np.flatnonzero(np.diff(ts) > 60_000_000_000)[5])
    starts = np.concatenate([ds.splits.test[:6], [gap - e - 2]]).astype(np.int32)  # + a gap
    want = np.stack([grid_targets(ds, s + e - 1, d, cumulative=True) for s in starts])
    assert np.isnan(want[-1]).any()
    got = _gather_fn(cfg, None)(to_device(ds.features), jnp.asarray(starts)).target
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(window_targets(ds, starts), want, rtol=1e-5, atol=1e-5)
    # without gaps, step k is the sum of the next k bars' own targets
    full = np.isfinite(want).all(axis=1)
    per_bar = ds.features.target[starts[full, None] + e + np.arange(d)].astype(np.float64)
    np.testing.assert_allclose(
        window_targets(ds, starts)[full], np.cumsum(per_bar, axis=1), rtol=1e-6, atol=1e-6
    )
