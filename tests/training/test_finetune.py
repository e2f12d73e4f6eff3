"""Fine-tuning on new bars (tftjax.training.finetune): a fine-tune of 0 epochs forecasts
exactly as its parent on the new bars; the run records its lineage; data that ends before
the parent's, of another interval or with other columns is refused in one line."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import call
from tiny import TINY_TFT

ROWS, PARENT_ROWS = 640, 520


def daily(path, rows: int, step: int = 1, extra: dict | None = None) -> str:
    """One series of business-day bars (every ``step``-th of them), its first ``rows``."""
    days = np.arange(
        np.datetime64("2012-01-02"), np.datetime64("2018-01-01"), dtype="datetime64[D]"
    )
    days = days[np.is_busday(days)][: ROWS * step : step]
    rng = np.random.default_rng(7)
    close = 50 * np.exp(np.cumsum(rng.normal(0, 0.01, days.size)))
    cols = {
        "ts": days.astype("datetime64[ns]"),
        "open": close * np.exp(rng.normal(0, 1e-3, days.size)),
        "close": close,
        "volume": np.full(days.size, 1e5),
        **(extra or {}),
    }
    cols["high"] = np.maximum(cols["open"], close) * 1.005
    cols["low"] = np.minimum(cols["open"], close) * 0.995
    pq.write_table(pa.table({k: v[:rows] for k, v in cols.items()}), path)
    return str(path)


@pytest.mark.slow
def test_a_fine_tune_extends_its_parent_and_refuses_what_does_not(tmp_path, capsys):
    from tftjax.predict import main as predict
    from tftjax.runner.checkpoints import read_meta
    from tftjax.train import main as train
    from tftjax.training.restore import open_checkpoint

    old = daily(tmp_path / "old.parquet", PARENT_ROWS)
    new = daily(tmp_path / "new.parquet", ROWS)
    parent = tmp_path / "parent"
    steps = ["--epochs", "1", "--max-steps-per-epoch", "2"]
    assert call(train, *TINY_TFT, *steps, "--parquet-file", old, "--workdir", parent) == 0
    child = tmp_path / "child"
    # the parent's settings are the defaults: no preset named
    rc = call(
        train, "--init-from", parent, "--parquet-file", new, "--epochs", "0", "--no-progress",
        "--workdir", child,
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()

    def forecast(run, name):
        out = tmp_path / f"{name}.parquet"
        rc = call(predict, "--checkpoint", run, "--parquet-file", new, "--instrument", "old",
                  "--origins", "40", "--out", out)  # fmt: skip
        assert rc == 0, capsys.readouterr().err
        return pq.read_table(out)

    a, b = forecast(parent, "a"), forecast(child, "b")
    for q in ("q10", "q50", "q90"):  # the same weights, the parent's statistics: exactly
        np.testing.assert_array_equal(a.column(q).to_numpy(), b.column(q).to_numpy())

    meta = read_meta(open_checkpoint(child).path)
    first, second = meta["lineage"]
    assert first["init_from"] is None and second["init_from"] == str(parent)
    days = lambda ns: str(np.datetime64(ns, "ns").astype("datetime64[D]"))
    (was,), (now,) = first["data"].values(), second["data"].values()
    assert days(now["last"]) > days(was["last"]) and now["first"] == was["first"]
    assert meta["weights_epoch"] == 0

    # a chain: the child's own child, from a parent saved with --epochs 0
    grandchild = tmp_path / "grandchild"
    rc = call(train, "--init-from", child, "--parquet-file", new, "--epochs", "0",
              "--no-progress", "--workdir", grandchild)  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert len(read_meta(open_checkpoint(grandchild).path)["lineage"]) == 3

    short = daily(tmp_path / "short.parquet", PARENT_ROWS - 40)
    sparse = daily(tmp_path / "sparse.parquet", ROWS, step=2)
    flow = {"flow": np.random.default_rng(0).normal(size=ROWS)}
    other = daily(tmp_path / "other.parquet", ROWS, extra=flow)
    for data, flags, says in (
        (short, [], "is before the last bar --init-from"),
        (sparse, [], "was trained on bars of 1d"),
        (other, ["--observed", "flow"], "another model than this run's"),
    ):
        wd = tmp_path / f"bad_{len(flags)}_{data[-12:-8]}"
        rc = call(train, "--init-from", parent, "--parquet-file", data, "--workdir", wd, *flags)
        err = capsys.readouterr().err
        assert rc == 2 and says in err and err.count("\n") == 1, (data, err)
        assert not wd.exists()
    assert json.loads((parent / "summary.json").read_text())  # the parent untouched
