"""GPU memory planned without a GPU: steps compiled for a GPU target (``--target``) on this
machine. Needs the CUDA plugin of this jax (the cuda12 extra); skipped without it."""

import pytest
from conftest import call

from tftjax.config import preset
from tftjax.memory import __main__ as memory_cli
from tftjax.memory import targets

TIERS = ("off", "minimal", "aggressive", "full")


def test_the_pool_fraction_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert targets.jax_pool_fraction() == 0.75
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert targets.jax_pool_fraction() == 0.9
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5")
    with pytest.raises(targets.ConfigError, match="give a fraction in"):
        targets.jax_pool_fraction()


def test_a_target_plan_is_never_capped_at_this_machines_device(monkeypatch):
    """--remat auto for a target compares the target's budget only: this machine's device
    limit (1 GB here, stubbed) does not lower it. The analysis is stubbed too: the point is
    which budget the plan is held to."""
    from tftjax.memory import planning
    from tftjax.memory.analysis import Compiled

    monkeypatch.setattr(planning, "device_limit", lambda: 10**9)
    monkeypatch.setattr(planning, "min_bytes", lambda *a: 0)
    monkeypatch.setattr(
        planning,
        "analyse",
        lambda cfg, b, rows, accumulate=1: Compiled(cfg.execution.remat, b, 0, 0, 0, 5 * 10**9, 0),
    )
    logs = []
    cfg = preset("tiny", remat="off")
    monkeypatch.setattr(planning, "targeting", lambda: True)
    assert (
        planning.plan_auto(cfg, 70e9, 64, 100, log=logs.append, grow_batch=False, backend="gpu")[0]
        == "off"
    )
    assert not any("device's limit" in line for line in logs), logs
    monkeypatch.setattr(planning, "targeting", lambda: False)  # here: capped at 0.9 GB
    with pytest.raises(targets.ConfigError, match="no remat tier fits 0.90 GB"):
        planning.plan_auto(cfg, 70e9, 64, 100, log=logs.append, grow_batch=False, backend="gpu")


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
def test_memory_cli_plans_for_a_target(tmp_path, capsys):
    rc = call(
        memory_cli.main,
        "--target",
        "rtx4090",
        "--preset",
        "tiny",
        "--tiers",
        "off",
        "--batch-sizes",
        "64",
        "--budgets",
        "24",
        "--out",
        tmp_path,
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "NVIDIA GeForce RTX 4090 (compile-only target)" in (tmp_path / "memory.json").read_text()
    # planned against the pool a run on that card gets (JAX's default 75%), never this
    # machine's device, with what is not modelled said
    assert (
        "--remat auto on NVIDIA GeForce RTX 4090 (25.8 GB; JAX's pool 75% of it, "
        "XLA_PYTHON_CLIENT_MEM_FRACTION; planned for 90% of the pool): --remat off"
    ) in out
    assert "not modelled: the CUDA context" in out and "not run" in out


def test_unknown_target_exits_2(tmp_path, capsys):
    rc = call(memory_cli.main, "--target", "h900", "--preset", "tiny", "--out", tmp_path / "o")
    err = capsys.readouterr().err
    assert rc == 2 and "--target 'h900' is not a known GPU; choose one of: h100" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_gpu_plans_differ_where_the_cpu_plan_costs_memory_on_a_gpu():
    from tftjax.models import remat

    assert remat.plan("aggressive", "cpu").vsn_scan and not remat.plan("aggressive", "gpu").vsn_scan
    assert remat.plan("full", "cpu").fused and not remat.plan("full", "gpu").fused
    # on a GPU every tier but off recomputes the VSN chunks, keeping less and less
    assert [remat.plan(t, "gpu").vsn for t in TIERS] == [False, True, True, True]
    assert not any(remat.plan(t, "gpu").fused and remat.plan(t, "gpu").vsn for t in TIERS)
