"""Memory: compiled analysis, the batch planner, auto tier choice, no growth across steps."""

import jax
import numpy as np
import pytest

from tftjax import memory
from tftjax.config import ConfigError, preset
from tftjax.data import epoch_batches, load_dataset, to_device
from tftjax.memory import planning
from tftjax.models import remat
from tftjax.training import Trainer, create_train_state

CFG = preset("tiny")
ROWS = 2264  # the bundled ES file's rows: the data arrays' size in the analysed steps


def test_parse_bytes():
    assert memory.parse_bytes("24GB") == 24e9
    assert memory.parse_bytes("16GiB") == 16 * 2**30
    assert memory.parse_bytes("512 MiB") == 512 * 2**20
    with pytest.raises(ValueError):
        memory.parse_bytes("lots")


def test_jax_flags_are_read_whether_or_not_they_have_a_context_manager():
    """``--target`` read ``jax_enable_compilation_cache`` with ``jax.config.read``, which jax
    0.10 refuses for flags with a context manager: a traceback on every ``--target`` run
    (issue 38), unseen where the CUDA plugin is missing. Both kinds, and a flip seen."""
    from tftjax.memory.analysis import flag

    was = flag("jax_enable_compilation_cache")
    assert isinstance(was, bool) and isinstance(flag("jax_disable_most_optimizations"), bool)
    jax.config.update("jax_enable_compilation_cache", not was)
    try:
        assert flag("jax_enable_compilation_cache") is (not was)
    finally:
        jax.config.update("jax_enable_compilation_cache", was)


def test_linear_fit_by_hand():
    pts = [memory.Compiled("off", b, 100, 10, 10, 1000 + 50 * b, 0) for b in (1, 8, 64)]
    a, b = memory.fit_linear(pts)
    assert a == pytest.approx(1100) and b == pytest.approx(50)


@pytest.fixture(scope="module")
def analysed():
    # Batch 32 of the tiny preset is also what test_train compiles: one shared compile.
    return {b: memory.analyse(CFG, b, ROWS) for b in (16, 32)}


@pytest.mark.slow
@pytest.mark.xdist_group("memory_analysed")
def test_compiled_bytes_grow_with_batch(analysed):
    a16, a32 = analysed[16], analysed[32]
    assert a32.temp_bytes > a16.temp_bytes > 0
    assert a16.argument_bytes == a32.argument_bytes - 16 * 4  # only the index vector grows
    # The floor counts state, data and indices (not the 16-byte RNG key).
    assert a32.argument_bytes - 16 <= memory.min_bytes(CFG, 32, ROWS) <= a32.argument_bytes


@pytest.mark.slow
@pytest.mark.xdist_group("memory_analysed")
def test_analysis_only_gives_the_optimised_programs_buffers(analysed):
    # The planner compiles with little optimisation (tftjax.memory.analysis.analysis_only):
    # the buffers are assigned on the HLO, before the back end's optimisation.
    from conftest import xla_optimised

    with xla_optimised():
        optimised = memory.analyse(CFG, 16, ROWS, compiled=memory.compile_step(CFG, 16, ROWS))
    assert optimised == analysed[16]


@pytest.mark.slow  # the optimised programs' analysis (memory_analysed, with the slow tier's)
@pytest.mark.xdist_group("memory_analysed")
def test_full_tier_holds_less_temp_memory_than_off(analysed):
    full = memory.analyse(CFG.override(remat="full", vsn_chunk=20), 32, ROWS)
    assert full.temp_bytes < analysed[32].temp_bytes


@pytest.mark.slow
@pytest.mark.xdist_group("memory_analysed")
def test_auto_grows_the_batch_when_off_fits(analysed):
    budget = 1.5 * analysed[32].total_bytes
    tier, batch, k = memory.plan_auto(
        CFG, budget, 32, rows=ROWS, log=lambda *a: None, backend="modelled"
    )  # off fastest there
    assert tier == "off" and batch > 32 and k == 1
    assert memory.analyse(CFG, batch, ROWS).total_bytes <= budget


@pytest.mark.slow  # the optimised programs' analysis (memory_analysed, with the slow tier's)
@pytest.mark.xdist_group("memory_analysed")
def test_eval_step_is_analysed_and_smaller_than_the_train_step(analysed):
    # the check --remat auto makes before it trains (it once crashed on the variables' form)
    ev = memory.analyse_eval(CFG, 32, ROWS)
    assert 0 < ev.temp_bytes < analysed[32].temp_bytes


@pytest.mark.slow  # the optimised programs' analysis (memory_analysed, with the slow tier's)
@pytest.mark.xdist_group("memory_analysed")
def test_accumulated_micro_batches_take_the_memory_of_one(analysed):
    # batch 128 as 4 micro-batches of 32: the temporaries of batch 32 (plus the float32
    # gradient sum, parameter-sized), not of 128
    k4 = memory.analyse(CFG, 128, ROWS, accumulate=4)
    assert k4.accumulate == 4 and k4.batch_size == 128
    assert 0.8 * analysed[32].temp_bytes <= k4.temp_bytes <= 1.3 * analysed[32].temp_bytes
    assert k4.temp_bytes < 0.5 * (analysed[32].temp_bytes * 4)


PER_SAMPLE = {"off": 100e6, "minimal": 100e6, "aggressive": 80e6, "full": 20e6}


def largest(budget: float, tier: str = "full") -> int:
    """By enumeration: the largest batch whose synthetic bytes fit ``budget``."""
    return max(
        b
        for b in range(1, 5000)
        if fake_analyse(CFG.override(remat=tier), b, 0).total_bytes <= budget
    )


def fake_analyse(cfg, b, rows, compiled=None, accumulate=1):
    """Synthetic compiled sizes: 1 GB fixed plus per-sample bytes by tier (of a micro-batch)."""
    return memory.Compiled(
        cfg.execution.remat,
        b,
        int(1e9),
        0,
        0,
        int(PER_SAMPLE[cfg.execution.remat] * b // accumulate),
        0,
        0,
        accumulate,
    )


@pytest.fixture
def fake(monkeypatch):
    # the planner's own references (tftjax.memory.planning) to the compiler and the device
    monkeypatch.setattr(planning, "analyse", fake_analyse)
    monkeypatch.setattr(planning, "min_bytes", lambda *a: int(1e9))
    monkeypatch.setattr(planning, "device_limit", lambda *a: None)
    return monkeypatch


def test_auto_picks_the_fastest_tier_that_fits_not_the_first(fake):
    lines = []
    # On CPU `full` is measured fastest: chosen though every tier fits 20 GB at batch 64.
    tier, batch, k = memory.plan_auto(CFG, 20e9, 64, rows=ROWS, log=lines.append, backend="cpu")
    assert tier == "full" and batch == largest(20e9) == 950 and k == 1
    assert any("chose remat=full" in x for x in lines)
    # Modelled elsewhere: off is fastest when it fits ...
    assert memory.plan_auto(
        CFG, 20e9, 64, rows=ROWS, log=lines.append, backend="gpu", grow_batch=False
    ) == ("off", 64, 1)
    # ... and then no slower tier is compiled: it could not help.
    assert not any("auto: minimal" in x for x in lines[-3:])
    # At batch 64 only full fits 5 GB (off 7.4, aggressive 6.1), and it takes 200 samples.
    assert memory.plan_auto(CFG, 5e9, 64, rows=ROWS, log=lines.append, backend="gpu") == (
        "full",
        200,
        1,
    )
    # A resumed run keeps its batch: only the tier is chosen.
    assert memory.plan_auto(
        CFG, 5e9, 64, rows=ROWS, log=lines.append, grow_batch=False, backend="gpu"
    ) == ("full", 64, 1)


def test_auto_accumulates_where_no_tier_fits_the_whole_batch(fake):
    lines = []
    # 2 GB at batch 64: full needs 2.28 GB whole; as 2 micro-batches of 32 off needs 4.2,
    # minimal 4.2, aggressive 3.56 and full 1.64: full with 2 micro-batches.
    assert memory.plan_auto(CFG, 2e9, 64, rows=ROWS, log=lines.append, backend="gpu") == (
        "full",
        64,
        2,
    )
    assert any("as 2 micro-batches of 32" in x for x in lines)
    assert "as 2 accumulated micro-batches of 32" in lines[-1]
    # 1.2 GB: full as 8 micro-batches of 8 (1.16 GB)
    assert memory.plan_auto(CFG, 1.2e9, 64, rows=ROWS, log=lines.append, backend="gpu") == (
        "full",
        64,
        8,
    )
    with pytest.raises(ConfigError, match="even as 64 accumulated micro-batches"):
        memory.plan_auto(CFG, 1.01e9, 64, rows=ROWS, log=lines.append, backend="gpu")


def test_auto_respects_the_device_limit_and_the_eval_step(fake):
    lines = []
    fake.setattr(planning, "device_limit", lambda *a: int(6e9))
    # --memory-budget 20GB on a device that allows 6 GB: plans for 5.4 GB.
    tier, batch, k = memory.plan_auto(CFG, 20e9, 64, rows=ROWS, log=lines.append, backend="gpu")
    assert (tier, batch, k) == ("full", largest(0.9 * 6e9), 1) and batch == 220
    assert any("device's limit of 6.00 GB" in x for x in lines)
    # No budget given: the device's limit is the budget.
    assert memory.plan_auto(
        CFG, None, 64, rows=ROWS, log=lines.append, backend="gpu", grow_batch=False
    ) == ("full", 64, 1)
    fake.setattr(planning, "analyse_eval", lambda cfg, b, rows: fake_analyse(cfg, 40 * b, rows))
    with pytest.raises(ConfigError, match="eval step at --eval-batch-size 256"):
        memory.plan_auto(CFG, None, 64, rows=ROWS, log=lines.append, eval_batch_size=256)
    fake.setattr(planning, "device_limit", lambda *a: None)
    with pytest.raises(ConfigError, match="needs --memory-budget"):
        memory.plan_auto(CFG, None, 64, rows=ROWS, log=lines.append)


@pytest.mark.parametrize("fit", [(0.0, 5e6), (0.0, 80e6), (3e9, 20e6)])
def test_largest_batch_is_exact_from_a_wrong_fit_in_both_directions(fake, fit):
    # True answer for full at 5 GB: (5e9 - 1e9) / 20e6 = 200. The fits guess 1000, 50, 100.
    seen = []
    fake.setattr(
        planning,
        "analyse",
        lambda cfg, b, rows, compiled=None, accumulate=1: (
            seen.append(b) or fake_analyse(cfg, b, rows)
        ),
    )
    cfg = CFG.override(remat="full")
    best, checked = memory.largest_batch(cfg, 5e9, fit, ROWS)
    assert best == 200 and checked.total_bytes <= 5e9  # exact: 201 does not fit
    assert len(seen) <= 14, seen
    assert memory.largest_batch(cfg, 5e9, fit, ROWS, verify=False)[1] is None


def test_auto_refuses_an_impossible_budget():
    with pytest.raises(ConfigError, match="no remat tier fits"):
        memory.plan_auto(CFG, 1e6, 8, rows=ROWS, log=lambda *a: None)


def test_default_tier_is_the_fastest():
    assert remat.default_tier("cpu") == "full"
    assert remat.default_tier("gpu") == "off"  # modelled: recompute only costs there


def live_bytes():
    return sum(x.nbytes for x in jax.live_arrays())


# The steps of training/test_remat_training.py (tiny.CHUNKED_*: same model, batch and optimizer; same group, so
# one compile serves both).
@pytest.mark.slow
@pytest.mark.xdist_group("remat_training")
@pytest.mark.parametrize("tier", ["off", "aggressive"])
def test_no_growth_of_live_device_memory_over_20_steps(tier):
    from conftest import short_es
    from tiny import CHUNKED_TFT as TRAIN_CFG
    from tiny import CHUNKED_TRAIN as TC

    cfg = TRAIN_CFG.override(remat=tier)
    ds = load_dataset(short_es(), cfg.data)
    trainer = Trainer(cfg, TC, to_device(ds.features))
    state = create_train_state(cfg, TC, jax.random.key(0))
    key = jax.random.key(1, impl="rbg")
    idx, _ = epoch_batches(ds.splits.train, TC.batch_size, seed=0, epoch=0)
    # test_remat_training's precision: the same compiled step
    with jax.default_matmul_precision("highest"):
        state, m = trainer.train_step(state, idx[0], key)
        jax.block_until_ready(state)
        del m
        after_one = live_bytes()
        for i in range(1, 20):  # a leak of any step's buffers grows with every step
            state, m = trainer.train_step(state, idx[i % len(idx)], key)
        jax.block_until_ready(state)
        del m
    assert live_bytes() == after_one
    assert np.isfinite(jax.device_get(state.params["quantiles"]["kernel"])).all()


def _run(*args, **env):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "tftjax.memory", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **env),
    )


def test_memory_cli_bad_tier_exit_2():
    p = _run("--tiers", "off,sideways")
    assert (
        p.returncode == 2
        and "--tiers must be one of off, minimal, aggressive, full, offload, got 'sideways'"
        in p.stderr
    )
    assert "Traceback" not in p.stderr


@pytest.mark.slow  # the optimised programs' analysis (memory_analysed, with the slow tier's)
@pytest.mark.xdist_group("memory_analysed")
def test_memory_cli_writes_report(tmp_path, analysed, capsys):
    # In-process (the points are the analysed fixture's: their compiles are in the cache).
    # Without --verify: the plan from the linear fit (largest_batch's compile check is
    # tested through test_auto_grows_the_batch_when_off_fits); rows from --dataset.
    from tftjax.memory import __main__ as memory_cli

    rc = memory_cli.main(
        [
            "--preset",
            "tiny",
            "--tiers",
            "off",
            "--batch-sizes",
            "16,32",
            "--steps",
            "1",
            "--budgets",
            "0.2",
            "--dataset",
            "es",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    import json

    recs = json.loads((tmp_path / "memory.json").read_text())
    assert [(r["tier"], r["batch_size"]) for r in recs] == [("off", 16), ("off", 32)]
    for r in recs:
        assert r["temp_bytes"] > 0 and r["argument_bytes"] > 0 and r["output_bytes"] > 0
        assert r["step_time_s"] > 0
    # the report's own compiles (to run) give the fixture's plans
    for r in recs:
        a = analysed[r["batch_size"]]
        assert (r["temp_bytes"], r["argument_bytes"], r["output_bytes"], r["alias_bytes"]) == (
            a.temp_bytes,
            a.argument_bytes,
            a.output_bytes,
            a.alias_bytes,
        )
    plan = json.loads((tmp_path / "batch_plan.json").read_text())["plan"]
    assert plan[0]["budget_gb"] == 0.2 and plan[0]["max_batch"] > 32
    assert plan[0]["checked_total_bytes"] is None
    assert (tmp_path / "memory.png").stat().st_size > 1000
    assert (tmp_path / "memory_off_b32.prof").stat().st_size > 0


@pytest.mark.slow
def test_memory_cli_isolated_point_runs_in_its_own_process(tmp_path):
    # What a GPU does by default (a fresh process per point: its own device peak), forced
    # on CPU: the point's step time comes back from the child's report.
    # (tier off at batch 16: test_memory_cli_writes_report's point, often in the compile cache)
    p = _run(
        "--preset",
        "tiny",
        "--tiers",
        "off",
        "--batch-sizes",
        "16",
        "--steps",
        "1",
        "--budgets",
        "",
        "--isolate",
        "--out",
        str(tmp_path),
        JAX_LOG_COMPILES="1",
    )
    assert p.returncode == 0, p.stderr
    import json

    (rec,) = json.loads((tmp_path / "memory.json").read_text())
    assert rec["isolated"] is True and rec["step_time_s"] > 0 and rec["temp_bytes"] > 0
    # one compile per point: the child's (the parent's own log shows no train step compiled)
    assert "Compiling jit(step)" not in p.stderr, p.stderr[-2000:]
    assert (
        json.loads((tmp_path / "point_off_b16_k1" / "config.json").read_text())["execution"][
            "remat"
        ]
        == "off"
    )
    assert (tmp_path / "memory_off_b16.prof").exists()


# ------------------------------------------------------------------ soak: memory that stays put
SOAK = pytest.mark.xdist_group("runloop_base")  # the tiny runs' compiled steps


def soak_run(tmp_path, callback=None):
    from conftest import short_es

    from tftjax.config import TrainConfig
    from tftjax.memory.soak import soak

    cfg = preset("tiny", remat="off")
    tc = TrainConfig(batch_size=32, learning_rate=3e-3, max_steps_per_epoch=3)
    return soak(
        cfg,
        tc,
        4,
        tmp_path / "soak",
        parquet_file=short_es(),
        log=lambda *a: None,
        callback=callback,
    )


@pytest.mark.slow
@SOAK
def test_soak_passes_a_clean_run(tmp_path):
    records, grew = soak_run(tmp_path)
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert grew == [], grew
    assert (tmp_path / "soak" / "checkpoints").is_dir()  # epochs saved as in a real run


@pytest.mark.slow
@SOAK
def test_soak_catches_a_leak(tmp_path):
    kept = []  # a real leak: every epoch's parameters kept alive on the device

    def leak(epoch, state, metrics, is_final):
        kept.append(jax.tree.map(lambda a: a + 0, state.params))

    records, grew = soak_run(tmp_path, leak)
    assert any(g.startswith("live_arrays grew") for g in grew), grew
    assert any(g.startswith("device_bytes grew") for g in grew), grew
    from tftjax.memory.soak import growth

    # and the check itself, on readings made up by hand: flat passes, growth past a threshold fails
    flat = [
        {"epoch": e, "device_bytes": 100, "live_arrays": 7, "host_rss": 5 << 20} for e in (1, 2, 3)
    ]
    assert growth(flat) == []
    flat[2]["host_rss"] += 65 << 20
    assert [g.split(" ")[0] for g in growth(flat)] == ["host_rss"]


def test_soak_cli_refuses_too_few_epochs(tmp_path, capsys):
    from conftest import call

    from tftjax.memory import __main__ as memory_cli

    for bad, expect in [
        ("0", "--soak 0: a soak needs 2 or more epochs"),
        ("1", "--soak 1: a soak needs 2 or more epochs"),
    ]:
        rc = call(memory_cli.main, "--soak", bad, "--preset", "tiny", "--out", tmp_path / "o")
        err = capsys.readouterr().err
        assert rc == 2 and expect in err and err.count("\n") == 1 and "Traceback" not in err, err
    rc = call(memory_cli.main, "--precision", "fp8", "--preset", "tiny", "--out", tmp_path / "o")
    err = capsys.readouterr().err
    assert rc == 2 and "--precision must be one of f32, bf16, got 'fp8'" in err, err
