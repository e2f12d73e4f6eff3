"""``python -m tftjax.tune``: a search on validation that writes settings ``train --config``
reads, and the refusals."""

import json

import pytest
from conftest import call, short_es

from tftjax import train as train_cli
from tftjax import tune as tune_cli

pytest.importorskip("optuna")


def test_a_search_on_validation_writes_settings_that_train_reads(tmp_path, capsys, monkeypatch):
    """The search itself, with each trial's training replaced by a stand-in whose validation
    loss is a known function of the drawn settings (the training is tested elsewhere): the
    trials see no test windows, the best trial's settings are written, and train --config
    reads them."""
    import tftjax.training as training

    seen = []

    def fake_train(model, train, workdir, data, *, callback, **kw):
        seen.append(sum(s.splits.test.size for s in data.series))
        val = [
            abs(train.learning_rate - 3e-3) * 100 + model.model.dropout * (1 + e) for e in range(3)
        ]
        for epoch, v in enumerate(val, 1):
            callback(epoch, None, {"val_loss": v}, epoch == 3)
        return None, {
            "history": [{"val_loss": v} for v in val],
            "weights_epoch": 1,
            "model": {"val": {"q_risk_90": val[0]}},
        }

    monkeypatch.setattr(training, "train_and_evaluate", fake_train)
    import tftjax.training.search as search

    released = []
    monkeypatch.setattr(search, "release_compiled", lambda: released.append(1))
    assert (
        call(
            tune_cli.main,
            "--preset",
            "tiny",
            "--trials",
            "6",
            "--parquet-file",
            short_es(),
            "--workdir",
            tmp_path / "tune",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| trial | learning_rate | weight_decay | dropout | hidden |" in out
    assert seen and set(seen) == {0}  # validation only: no trial even has test windows
    assert len(released) == 6  # every trial's compiled programs let go (memory mappings)
    trials = json.loads((tmp_path / "tune" / "trials.json").read_text())
    done = [t for t in trials["trials"] if t["state"] == "complete"]
    chosen = min(done, key=lambda t: t["best_val_loss"])
    best = json.loads((tmp_path / "tune" / "best.json").read_text())
    assert best["train"]["learning_rate"] == chosen["learning_rate"]
    assert best["model"]["dropout"] == chosen["dropout"]
    assert best["model"]["hidden"] == chosen["hidden"]
    assert chosen["best_val_loss"] == pytest.approx(
        abs(chosen["learning_rate"] - 3e-3) * 100 + chosen["dropout"]
    )
    argv = [
        "--preset",
        "tiny",
        "--config",
        str(tmp_path / "tune" / "best.json"),
        "--dropout",
        "0.05",
    ]
    cfg, tc, _ = train_cli.configs(train_cli.COMMAND_LINE.parse(argv))
    assert cfg.model.hidden == best["model"]["hidden"]
    assert tc.learning_rate == best["train"]["learning_rate"]
    assert cfg.model.dropout == 0.05  # a flag after --config wins


def test_a_stopped_search_goes_on_with_resume(tmp_path, capsys, monkeypatch):
    """Two trials, a third cut off mid-run (left running in the journal), then --resume to 4:
    the cut-off trial is failed and run again, the sampler does not redraw the first
    settings, and every trial is in trials.json; a changed setting or a folder with no
    search is refused in one line."""
    import shutil
    from pathlib import Path

    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    import tftjax.training as training
    import tftjax.training.search as search

    def fake_train(model, train, workdir, data, *, callback, **kw):
        callback(1, None, {"val_loss": train.learning_rate}, True)
        return None, {
            "history": [{"val_loss": train.learning_rate}],
            "weights_epoch": 1,
            "model": {"val": {"q_risk_90": 0.5}},
        }

    monkeypatch.setattr(training, "train_and_evaluate", fake_train)
    monkeypatch.setattr(search, "release_compiled", lambda: None)
    wd = tmp_path / "tune"
    base = ["--preset", "tiny", "--parquet-file", short_es(), "--workdir", wd]
    assert call(tune_cli.main, *base, "--trials", "2") == 0
    storage = JournalStorage(JournalFileBackend(str(wd / "study.journal")))
    optuna.load_study(study_name="tftjax", storage=storage).ask()  # a trial cut off mid-run
    capsys.readouterr()
    assert call(tune_cli.main, *base, "--trials", "4") == 2  # not without --resume
    assert "--resume to go on" in capsys.readouterr().err
    assert call(tune_cli.main, *base, "--trials", "4", "--resume") == 0
    rows = json.loads((wd / "trials.json").read_text())["trials"]
    assert [r["state"] for r in rows] == ["complete", "complete", "fail", "complete", "complete"]
    lrs = [r["learning_rate"] for r in rows if r["state"] == "complete"]
    assert len(set(lrs)) == 4  # no settings drawn twice
    best = json.loads((wd / "best.json").read_text())
    assert best["train"]["learning_rate"] == min(lrs)
    other = tmp_path / "other.parquet"  # other bars under the same name
    shutil.copy(short_es(), other)
    assert (
        call(
            tune_cli.main,
            *base[:2],
            "--parquet-file",
            other,
            "--workdir",
            tmp_path / "o",
            "--trials",
            "1",
        )
        == 0
    )
    other.write_bytes(Path(short_es()).read_bytes()[:-1] + b"x")
    assert (
        call(
            tune_cli.main,
            *base[:2],
            "--parquet-file",
            other,
            "--workdir",
            tmp_path / "o",
            "--trials",
            "2",
            "--resume",
        )
        == 2
    )
    assert "data differ" in capsys.readouterr().err
    for extra, expect in (
        (["--dropout", "0.3"], "dropout differ"),
        (["--workdir", tmp_path / "none"], "holds no search"),
    ):
        assert call(tune_cli.main, *base, "--trials", "5", "--resume", *extra) == 2
        err = capsys.readouterr().err
        assert expect in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--trials", "0"], "--trials must be >= 1, got 0"),
        (["--config", "missing.json"], "--config missing.json: no such file"),
    ],
)
def test_bad_tune_input_exits_2_with_one_line(tmp_path, capsys, args, expect, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = call(
        tune_cli.main,
        "--preset",
        "tiny",
        "--parquet-file",
        short_es(),
        "--workdir",
        tmp_path / "t",
        *args,
    )
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1, err
    assert not (tmp_path / "t").exists()


def test_a_settings_file_with_an_unknown_field_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"hiddn": 8}}))
    rc = call(train_cli.main, "--config", bad, "--workdir", tmp_path / "r")
    err = capsys.readouterr().err
    assert rc == 2 and "unknown model setting 'hiddn'" in err, err


def test_release_compiled_empties_the_step_caches():
    # in a fresh process: clearing this worker's caches would make later tests recompile
    import subprocess
    import sys

    code = """
from tftjax.config import preset
from tftjax.training.optimizer import _optimizer
from tftjax.training.search import release_compiled
from tftjax.training.steps import make_eval_step
make_eval_step(preset("tiny"))
_optimizer(1e-3, 0.0, 1.0)
assert make_eval_step.cache_info().currsize > 0
release_compiled()
assert make_eval_step.cache_info().currsize == 0 and _optimizer.cache_info().currsize == 0
print("released")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "released" in p.stdout, p.stderr
