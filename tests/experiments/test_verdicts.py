"""experiments/verdicts.py over pre-registered runs: the Holm family is the recipes', a set
not yet run counts as p = 1, and runs that disagree on the family are refused in one line."""

import importlib.util

import pytest
from conftest import REPO

FAMILY = [
    "a: TFT vs chosen",
    "a: combination vs best pair",
    "b: TFT vs chosen",
    "b: combination vs best pair",
]


def _load():
    spec = importlib.util.spec_from_file_location("verdicts", REPO / "experiments" / "verdicts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


verdicts = _load()


def _vs(p: float, diff: float) -> dict:
    half = 0.001 if p < 0.05 else 0.01  # an interval that excludes 0 exactly when p is small
    return {
        "dm_p90": {"stat": -3.0 if diff < 0 else 1.0, "p": p, "lags": 4},
        "p90_diff": diff,
        "p90_diff_ci95": [diff - half, diff + half],
    }


def _run(key: str, p_tft: float, p_combo: float, family=FAMILY) -> tuple[str, dict]:
    test = {"q_risk_90": 0.45}
    out = {
        "pooled": {
            "tft": {"test": {"q_risk_90": 0.44}},
            "chosen": {"test": test, "vs": _vs(p_tft, -0.01)},
            "qr": {"test": {"q_risk_90": 0.43}},
        },
        "combination": {
            "combination": {"q_risk_90": 0.42},
            "pair": {"q_risk_90": 0.43},
            "vs_pair": _vs(p_combo, -0.01),
        },
        "preregistration": {
            "path": f"experiments/preregistered/{key}.json",
            "set": f"set {key}",
            "holm_family": family,
        },
    }
    return key, out


def test_holm_runs_over_the_recipes_family_with_unrun_rows_at_one():
    rows, text = verdicts.preregistered([_run("a", 0.004, 0.3)])
    assert [r["row"] for r in rows] == FAMILY
    # Holm by hand over (0.004, 0.3, 1, 1): sorted, times 4, 3, 2, 1, running max, capped at 1
    assert rows[0]["p_holm"] == pytest.approx(0.016)
    assert rows[1]["p_holm"] == pytest.approx(0.9)
    assert [r.get("verdict") for r in rows] == ["beats", "level", None, None]
    assert "2 not yet run" in text and "| b: TFT vs chosen | not yet run |" in text
    assert "set a: the TFT beats the baseline chosen per fold (Holm p 0.016)" in text
    # the same run beside a second set: the family is full and the first p is now 0.004 * 4
    rows, _ = verdicts.preregistered([_run("a", 0.004, 0.3), _run("b", 0.02, 0.5)])
    assert [r["p_holm"] for r in rows] == pytest.approx([0.016, 0.6, 0.06, 0.6])
    assert rows[2]["verdict"] == "level"  # p 0.02 alone, 0.06 after Holm


def test_runs_of_different_families_or_mixed_with_unregistered_ones_are_refused(tmp_path, capsys):
    import json

    from tftjax.cli import main as cli_main
    from tftjax.errors import DataError

    with pytest.raises(DataError, match="holm_family differs"):
        verdicts.preregistered([_run("a", 0.1, 0.1), _run("b", 0.1, 0.1, FAMILY[:2])])
    with pytest.raises(DataError, match="a row is 'SET: TFT vs chosen'"):
        verdicts.preregistered([_run("a", 0.1, 0.1, ["a: TFT vs the moon"])])
    paths = []
    for key, out in (_run("a", 0.1, 0.1), _run("b", 0.1, 0.1)):
        out |= {"chosen_per_fold": ["qr"], "verdict": "level"}
        if key == "b":
            del out["preregistration"]
        (tmp_path / key).mkdir()
        (tmp_path / key / "backtest.json").write_text(json.dumps(out))
        paths.append(str(tmp_path / key / "backtest.json"))
    assert cli_main(verdicts.main, paths) == 2
    err = capsys.readouterr().err
    assert "give pre-registered runs alone" in err and err.count("\n") == 1
