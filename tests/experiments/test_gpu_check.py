"""The prepared GPU check (experiments/gpu_check.py), checked on the CPU: its dry run runs
every stage in order and writes every file; a row that runs out of time is killed with its
grandchildren; a bad ``--stages`` is one line and exit 2."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

ROOT = REPO


def _load():
    spec = importlib.util.spec_from_file_location(
        "gpu_check", ROOT / "experiments" / "gpu_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpu_check = _load()


def test_bad_stages_exit_2(tmp_path, capsys):
    assert gpu_check.main(["--stages", "nonsense", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--stages 'nonsense': not a stage: nonsense; choose from tests" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_the_targets_come_first():
    names = [name for _, name, _, _ in gpu_check.rows(Path("/o"), dry=False)]
    # the targets' order, each precision's Pallas VSN row beside its batch-256 row
    assert names[:7] == [
        "tests",
        "bf16_off_b256",
        "bf16_off_b256_pallas",
        "f32_off_b64",
        "f32_off_b256",
        "f32_off_b256_pallas",
        "bf16_off_b64",
    ]
    assert [s for s, *_ in gpu_check.rows(Path("/o"), dry=False)] == sorted(
        (s for s, *_ in gpu_check.rows(Path("/o"), dry=False)), key=gpu_check.STAGES.index
    )


def test_a_row_out_of_time_is_killed_with_its_grandchildren(tmp_path):
    pidfile = tmp_path / "grandchild"
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    t0 = time.perf_counter()
    r = gpu_check.run_row("x", "x", 3, [sys.executable, "-c", script], dict(os.environ))
    assert r["rc"] == "timed out" and time.perf_counter() - t0 < 30
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # reaped by init: gone, or a zombie for a moment
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        state = Path(f"/proc/{grandchild}/stat")
        if state.exists() and state.read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {grandchild} still runs")


def test_bad_rows_exit_2(tmp_path, capsys):
    assert (
        gpu_check.main(["--rows", "tests,f32_off_b9", "--dry-run", "--out", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert "--rows 'tests,f32_off_b9': not a row of these stages: f32_off_b9" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


# one row of every stage: every distinct kind of command (the other throughput rows differ
# from bf16_off_b16 in --remat, --precision and batch values only; the dry run's memory row
# runs two tiers, a GPU's every tier; the peer's row skips without the bench extra)
DRY_ROWS = ["tests", "bf16_off_b16", "peer_f32", "memory", "soak", "dqn"]


@pytest.mark.slow
@pytest.mark.heavy
def test_the_dry_run_runs_every_stage_and_writes_every_file(tmp_path):
    out = tmp_path / "check"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    p = subprocess.run(
        [
            sys.executable,
            "experiments/gpu_check.py",
            "--dry-run",
            "--out",
            str(out),
            "--rows",
            ",".join(DRY_ROWS),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    record = json.loads((out / "gpu_check.json").read_text())
    want = [name for _, name, _, _ in gpu_check.rows(out, dry=True) if name in DRY_ROWS]
    assert [r["row"] for r in record["rows"]] == want == DRY_ROWS
    assert {r["stage"] for r in record["rows"]} == set(gpu_check.STAGES)
    boxes = {name: sec for _, name, sec, _ in gpu_check.rows(out, dry=True)}
    for r in record["rows"]:  # a loaded CPU compiling gets DRY_BOX times the GPU's box
        assert r["box_s"] in (0, boxes[r["row"]] * gpu_check.DRY_BOX), r["row"]
    assert record["dry_run"] and record["device"] == "cpu"
    md = (out / "gpu_check.md").read_text()
    for r in record["rows"]:
        assert (out / "rows" / f"{r['row']}.row.json").exists(), r["row"]
        assert f"| {r['stage']} | {r['row']} |" in md
        if r["stage"] == "peer" and str(r["rc"]).startswith("skipped"):
            continue
        if r["stage"] == "soak":  # 1: it ran and measured growth (a finding, not a crash)
            assert r["rc"] in (0, 1) and (
                "no growth" in r["stdout_tail"] or "memory grew" in r["stdout_tail"]
            ), r
            continue
        assert r["rc"] == 0, (r["row"], r["rc"], r["stderr_tail"][-1500:])
    for name in want:
        if name.startswith(("bf16_", "f32_")):
            rows = json.loads((out / "rows" / f"{name}.json").read_text())["results"]
            assert len(rows) == 1 and rows[0]["samples_per_s"] > 0 and rows[0]["loss_finite"]
    assert (out / "rows" / "memory" / "memory.json").exists()
    assert (out / "rows" / "soak" / "soak.json").exists()
