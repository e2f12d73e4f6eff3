"""Windows: splits with embargo, epochs that see every window once, gather vs numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.config import DataConfig
from tftjax.data import (DataError, build_features, epoch_batches, gather, load_dataset,
                         make_splits, to_device)
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
        np.testing.assert_array_equal(batch.target[i], fs.target[s + 50 : s + 60])
        np.testing.assert_array_equal(batch.static[i], fs.static)
    # The target of a window is the next 10 bars' log returns after its last encoder bar.
    s = int(starts[1])
    r = np.diff(np.log(dataset.bars.close[s + 49 : s + 60])) / fs.stats.target_scale
    np.testing.assert_allclose(batch.target[1], r, rtol=1e-5)


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
    col = next(c for c in table.column_names if c.lower() in ("ts", "ts_event", "timestamp",
                                                                 "datetime", "date"))
    times = table.column(col).to_pylist()
    want = []
    for s in starts:
        t = times[int(s) + cfg.encoder_steps]
        if isinstance(t, datetime.datetime) and t.tzinfo is not None:
            t = t.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        want.append(f"first forecast bar {t.strftime('%Y-%m-%dT%H:%M')}")
    assert window_titles(ds.bars.ts, starts, cfg.encoder_steps) == want


def test_cumulative_targets_are_the_k_bar_sums(dataset):
    """``--target cumulative``: decoder step k's target is the sum of the bars' 1-bar targets
    from the origin, on the device (the train and eval steps' gather) and on the host."""
    import dataclasses

    from tftjax.config import preset
    from tftjax.training.evaluation import window_targets
    from tftjax.training.steps import _gather_fn

    cfg = preset("tiny", target="cumulative")
    ds = dataclasses.replace(dataset, cfg=cfg.data)
    starts = dataset.splits.test[:7]
    e, d = cfg.encoder_steps, cfg.decoder_steps
    want = np.cumsum(dataset.features.target[starts[:, None] + e + np.arange(d)].astype(np.float64),
                     axis=1)
    got = _gather_fn(cfg, None)(to_device(dataset.features), jnp.asarray(starts)).target
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(window_targets(ds, starts), want, rtol=1e-6, atol=1e-6)
