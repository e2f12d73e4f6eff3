"""``python -m tftjax.tune``: a search on validation that writes settings ``train --config``
reads, and the refusals."""

import json

import pytest
from conftest import call, short_es
from test_runloop import TINY_TFT

from tftjax import train as train_cli
from tftjax import tune as tune_cli
from tftjax.cli import parse

pytest.importorskip("optuna")


@pytest.mark.xdist_group("tune")
def test_a_search_writes_settings_that_train_reads(tmp_path, capsys):
    assert call(tune_cli.main, *TINY_TFT, "--trials", "1", "--epochs", "2", "--parquet-file",
                short_es(), "--workdir", tmp_path / "tune") == 0
    out = capsys.readouterr().out
    assert "| trial | learning_rate | weight_decay | dropout | hidden |" in out
    trials = json.loads((tmp_path / "tune" / "trials.json").read_text())
    assert [t["trial"] for t in trials["trials"]] == [0]
    for t in trials["trials"]:  # validation only: no trial even evaluated the test windows
        summary = json.loads((tmp_path / "tune" / f"trial_{t['trial']:03d}" /
                              "summary.json").read_text())
        assert set(summary["model"]) == {"train", "val"}
    best = json.loads((tmp_path / "tune" / "best.json").read_text())
    chosen = min((t for t in trials["trials"] if "best_val_loss" in t),
                 key=lambda t: t["best_val_loss"])
    assert best["train"]["learning_rate"] == chosen["learning_rate"]
    assert best["model"]["hidden"] == chosen["hidden"]
    argv = ["--preset", "tiny", "--config", str(tmp_path / "tune" / "best.json"),
            "--dropout", "0.05"]
    a = parse(train_cli.Args, argv, train_cli.defaults(argv), "train", "")
    assert a.model.hidden == best["model"]["hidden"]
    assert a.train.learning_rate == best["train"]["learning_rate"]
    assert a.model.dropout == 0.05  # a flag after --config wins


@pytest.mark.parametrize("args,expect", [
    (["--trials", "0"], "--trials must be >= 1, got 0"),
    (["--config", "missing.json"], "--config missing.json: no such file"),
])
def test_bad_tune_input_exits_2_with_one_line(tmp_path, capsys, args, expect, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = call(tune_cli.main, "--preset", "tiny", "--parquet-file", short_es(), "--workdir",
              tmp_path / "t", *args)
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1, err
    assert not (tmp_path / "t").exists()


def test_a_settings_file_with_an_unknown_field_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"hiddn": 8}}))
    rc = call(train_cli.main, "--config", bad, "--workdir", tmp_path / "r")
    err = capsys.readouterr().err
    assert rc == 2 and "unknown setting(s) model.hiddn" in err, err
