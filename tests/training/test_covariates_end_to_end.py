"""The covariates issue's panel fixture end to end (tests/covariate_panel.py: an observed real
with gaps, a known categorical, a static categorical and a static real): train, predict with
``--future`` (a level training never saw: noted), the Python API, an int8 export, and a
walk-forward of two folds; a forecast without the known values is refused in one line."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import call
from covariate_panel import (
    COVARIATE_FLAGS,
    DAYS,
    LONG_GAP,
    SERIES,
    business_days,
    events,
    write_panel,
)
from tiny import TINY_TFT

STEPS = ["--epochs", "1", "--max-steps-per-epoch", "2"]


def future_table(path, unseen: bool = False) -> str:
    """The known column for the 5 business days after the panel, per series."""
    days = business_days(DAYS + 5)[DAYS:]
    ev = events(business_days(DAYS + 5))[DAYS:].astype(str)
    if unseen:
        ev[2] = "fomc"
    n = len(SERIES)
    pq.write_table(
        pa.table(
            {
                "ts": np.tile(days.astype("datetime64[ns]"), n),
                "symbol": np.repeat(list(SERIES), 5),
                "event": np.tile(ev, n),
            }
        ),
        path,
    )
    return str(path)


@pytest.mark.slow
@pytest.mark.heavy
def test_the_panel_trains_forecasts_exports_and_walks_forward(tmp_path, capsys):
    from tftjax.backtest import main as backtest
    from tftjax.export import main as export
    from tftjax.predict import main as predict
    from tftjax.runner.checkpoints import read_meta
    from tftjax.serving.api import load
    from tftjax.train import main as train

    panel = write_panel(tmp_path / "panel.parquet")
    run = tmp_path / "run"
    rc = call(train, *TINY_TFT, *STEPS, *COVARIATE_FLAGS, "--parquet-file", panel, "--workdir", run)
    assert rc == 0, capsys.readouterr().err
    assert "plots not written" not in capsys.readouterr().out
    assert (run / "variable_importance.png").stat().st_size > 1000  # with your columns' names

    # no known values after the bars: refused, naming the column and the first step's time
    rc = call(predict, "--checkpoint", run, "--out", tmp_path / "f0.parquet")
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    first = f"{business_days(DAYS + 1)[DAYS]}T00:00:00 (no zone)"  # the day after the data
    assert f"no value of --known event for decoder step 1 at {first}" in err
    assert not (tmp_path / "f0.parquet").exists()

    # an origin whose encoder holds series c's stale flow (its 40-bar gap): refused too
    inside = str(business_days(DAYS)[LONG_GAP[1] - 5])
    rc = call(predict, "--checkpoint", run, "--as-of", inside, "--out", tmp_path / "f1.parquet")
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "panel.parquet[c]: column 'flow' has had no value since before" in err

    fut = future_table(tmp_path / "future.parquet", unseen=True)
    out = tmp_path / "f.parquet"
    rc = call(predict, "--checkpoint", run, "--future", fut, "--out", out)
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "level(s) fomc not seen in the training rows: served by its unknown bucket" in printed
    cli = pq.read_table(out)
    notes = json.loads(cli.schema.metadata[b"tftjax.notes"])
    assert any("fomc" in n for n in notes)

    model = load(run)  # the Python API: the same keyword, the same forecast
    df = model.forecast(future=fut)
    np.testing.assert_array_equal(df["q50"].to_numpy(), cli.column("q50").to_numpy())

    exp = tmp_path / "export"
    assert call(export, "--checkpoint", run, "--out", exp, "--calibrate", "2") == 0
    meta = json.loads((exp / "config.json").read_text())
    assert [c["name"] for c in meta["covariates"]] == ["sector", "beta", "flow", "event"]
    rc = call(predict, "--checkpoint", exp, "--int8", "--future", fut, "--out", tmp_path / "i.csv")
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()

    bt = tmp_path / "bt"
    argv = [*TINY_TFT, *STEPS, *COVARIATE_FLAGS, "--folds", "2", "--bootstrap", "50"]
    rc = call(backtest, *argv, "--parquet-file", panel, "--workdir", bt)
    assert rc == 0, capsys.readouterr().err
    record = json.loads((bt / "backtest.json").read_text())
    assert len(record["folds"]) == 2
    flow = []
    for k in (1, 2):  # each fold fitted its own schema on its own training rows
        ck = next((bt / f"fold_{k}" / "checkpoints").glob("tft_final_epoch*"))
        meta = read_meta(ck)
        cov = meta["covariates"]
        assert [c["levels"] for c in cov if c["name"] == "event"] == [["none", "opex", "qend"]]
        flow.append({s["name"]: s["feature_stats"]["covariates"] for s in meta["series"]})
    # the levels are the whole file's too; the observed real's statistics tell the fits
    # apart: fold 2 trains on more rows, so every series' mean and scale of flow move
    for name, fit in flow[0].items():
        later = flow[1][name]
        assert fit["mean"]["flow"] != later["mean"]["flow"], name
        assert fit["std"]["flow"] != later["std"]["flow"], name
