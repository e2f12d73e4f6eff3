"""Panels: the repository's real panel with its source recorded, series that start at
different dates in a walk-forward (each joins where it has data, and each fold names what
it scored), and the refusal of series that share no date."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, call
from tiny import TINY_TFT

from tftjax import backtest
from tftjax.config import WARMUP, preset
from tftjax.data import bundled_path, load_dataset, read_bars
from tftjax.data.bars import read_series
from tftjax.data.bundled import PANELS
from tftjax.data.windows import walk_forward_times

NS_YEAR = 365.25 * 86_400 * 10**9
CFG = preset("tiny").data


def test_the_us_daily_panel_loads_with_its_source_recorded(monkeypatch):
    import tftjax

    if REPO not in Path(tftjax.__file__).resolve().parents:  # installed, not from this clone
        monkeypatch.setenv("TFTJAX_DATA_DIR", str(REPO / "data"))
    path = bundled_path("us-daily")
    assert path == REPO / "data" / PANELS["us-daily"]  # in the repository, not the wheel
    series = read_series(path)
    years = {b.symbol: (b.ts[-1] - b.ts[0]) / NS_YEAR for b in series}
    assert len(series) == 12 and sum(y >= 10 for y in years.values()) >= 10
    assert len({str(np.datetime64(int(b.ts[0]), "ns"))[:4] for b in series}) >= 6  # late starts
    row = next(
        line
        for line in (REPO / "data" / "SOURCES.md").read_text().splitlines()
        if line.startswith("|") and PANELS["us-daily"] in line
    )
    assert "QuantConnect/Lean" in row and "Apache-2.0" in row
    assert f"{sum(len(b) for b in series):,}" in row  # the rows it records are the file's
    # split-adjusted: AAPL's 7:1 split took effect on 2014-06-09 (raw closes 645.57 on
    # Friday 2014-06-06, 93.70 on Monday: log(93.70 * 7 / 645.57) = +0.016); unadjusted, the
    # day's log return would be log(93.70 / 645.57) = -1.93
    aapl = next(b for b in series if b.symbol == "AAPL")
    day = int(np.searchsorted(aapl.ts, np.datetime64("2014-06-09", "ns").astype(np.int64)))
    assert abs(np.log(aapl.close[day] / aapl.close[day - 1]) - 0.016) < 0.002


def test_a_missing_panel_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TFTJAX_DATA_DIR", str(tmp_path))
    rc = call(backtest.main, *TINY_TFT, "--dataset", "us-daily", "--workdir", tmp_path / "bt")
    err = capsys.readouterr().err
    assert rc == 2 and "is kept in the repository's data/ folder" in err and err.count("\n") == 1


def _long_file(path, parts):
    """A long file (symbol column) of ``(symbol, bars)``, sorted by symbol."""
    tables = [
        pa.table(
            {
                "symbol": [s] * len(b),
                "ts": pa.array(b.ts // 1000).cast(pa.timestamp("us")),
                **{c: getattr(b, c) for c in ("open", "high", "low", "close", "volume")},
            }
        )
        for s, b in parts
    ]
    pq.write_table(pa.concat_tables(tables), path)
    return path


def _late_panel(tmp_path, rows=1400, c_start=700):
    """Three daily series: A from the start, B from row 300, C from row ``c_start`` (of A's
    dates; a series' first 120 rows are its warm-up)."""
    spx, ndx = read_bars(bundled_path("spx")), read_bars(bundled_path("nasdaq"))
    return _long_file(
        tmp_path / "panel.parquet",
        [("A", spx.slice(0, rows)), ("B", ndx.slice(300, rows)), ("C", spx.slice(c_start, rows))],
    )


def test_series_join_the_folds_where_they_have_data(tmp_path):
    path = _late_panel(tmp_path)
    ts = [b.ts for b in read_series(path)]
    times = walk_forward_times(ts, CFG, 3, 0.4)
    W, E = CFG.window, CFG.embargo_rows
    seen = []
    for fold in times:
        ds = load_dataset(path, CFG, fold=fold)
        assert set(ds.names) | set(ds.absent) == {"A", "B", "C"}
        assert ds.vocab == ds.names  # a fold's model knows only the series that train in it
        for s, first in zip("ABC", ts):
            # a series sits out exactly when it has fewer than W complete training windows
            # before the fold's validation stretch: counted here from its own dates
            before = int(np.searchsorted(first, fold[0])) - E - WARMUP
            assert (s in ds.absent) == (before - W + 1 < W), (s, before)
        for k, sr in enumerate(ds.series):
            o0, o1 = ds.offsets[k], ds.offsets[k + 1]
            for split in ("train", "val", "test"):
                st = getattr(ds.splits, split)
                mine = st[ds.series_of(st) == k]
                assert ((mine >= o0) & (mine + W <= o1)).all()  # never across a series
            t = sr.bars.ts
            assert t[sr.splits.train.max() + W - 1] < fold[0] if sr.splits.train.size else True
            if sr.splits.test.size:  # test targets inside the fold's test stretch
                assert t[sr.splits.test.min() + CFG.encoder_steps] >= fold[1]
        seen.append(ds.absent)
    assert seen[0] == ("C",) and seen[-1] == ()  # C joins a later fold


def test_series_that_share_no_date_are_refused_before_any_fold_trains(tmp_path, capsys):
    spx = read_bars(bundled_path("spx"))
    path = _long_file(
        tmp_path / "eras.parquet", [("A", spx.slice(3000, 3600)), ("B", spx.slice(0, 600))]
    )  # B: earlier
    rc = call(
        backtest.main,
        *TINY_TFT,
        "--parquet-file",
        path,
        "--workdir",
        tmp_path / "bt",
        "--folds",
        "2",
    )
    err = capsys.readouterr().err
    assert rc == 2 and "shares no date with the other series" in err and err.count("\n") == 1
    assert "'B'" in err or "'A'" in err
    assert not (tmp_path / "bt").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_base")
def test_a_walk_forward_over_series_that_start_at_different_dates(tmp_path, capsys):
    # two folds (each compiles its own steps: the panel's shape changes as C joins); C from
    # row 600 sits out the first and joins the second (rows 500 to 650 would all do)
    path = _late_panel(tmp_path, c_start=600)
    assert (
        call(
            backtest.main,
            *TINY_TFT,
            "--folds",
            "2",
            "--epochs",
            "1",
            "--parquet-file",
            path,
            "--workdir",
            tmp_path / "bt",
            "--bootstrap",
            "50",
        )
        == 0
    )
    out = json.loads((tmp_path / "bt" / "backtest.json").read_text())
    folds = out["folds"]
    assert folds[0]["sat_out"] == ["C"] and "C" not in folds[0]["series"]
    assert "C" in folds[-1]["series"] and folds[-1]["sat_out"] == []
    for f in folds:  # each fold names the series it scored
        assert f["series"] and not set(f["series"]) & set(f["sat_out"])
    scored = {s for f in folds for s in f["series"]}
    assert set(out["by_series"]) == scored
    for name, row in out["by_series"].items():  # each over the folds that scored it
        assert row["folds"] == sum(name in f["series"] for f in folds)
        assert row["verdict"] in ("beats", "level", "behind")
        assert "p_holm" in row["vs"]["dm_p90"]
    assert sum(r["windows"] for r in out["by_series"].values()) == sum(out["fold_windows"])
    # pooled inference over dates (issue 50): the series share dates, so fewer dates than
    # windows, and at least as many as the most windows one series has
    inf = out["inference"]
    most = max(r["windows"] for r in out["by_series"].values())
    assert inf["unit"] == "date" and most <= inf["dates"] < inf["windows"], inf
    assert "| C |" in capsys.readouterr().out
