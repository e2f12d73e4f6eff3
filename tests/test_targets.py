"""GPU memory planned without a GPU: steps compiled for a GPU target (``--target``) on this
machine. Needs the CUDA plugin of this jax (the cuda12 extra); skipped without it."""

import pytest
from conftest import call

from tftjax.config import preset
from tftjax.memory import __main__ as memory_cli
from tftjax.memory import analyse, for_target, targets

TIERS = ("off", "minimal", "aggressive", "full")


@pytest.mark.slow
@pytest.mark.skipif(not targets.available(),
                    reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')")
def test_every_tier_at_most_off_on_a_gpu_target():
    with for_target("h100"):
        temp = {t: analyse(preset("tiny", remat=t), 64, 2000).temp_bytes for t in TIERS}
    # off >= minimal >= aggressive >= full, each step a real saving (measured, tiny b64 on
    # the H100 spec: 1, 0.86, 0.60, 0.36)
    assert temp["off"] > temp["minimal"] > temp["aggressive"] > temp["full"], temp
    assert temp["full"] <= 0.5 * temp["off"], temp


@pytest.mark.slow
@pytest.mark.skipif(not targets.available(),
                    reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')")
def test_memory_cli_plans_for_a_target(tmp_path, capsys):
    rc = call(memory_cli.main, "--target", "rtx4090", "--preset", "tiny", "--tiers", "off,full",
              "--batch-sizes", "32,64", "--budgets", "24", "--out", tmp_path)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "NVIDIA GeForce RTX 4090 (compile-only target)" in (tmp_path / "memory.json").read_text()
    assert "--remat auto on NVIDIA GeForce RTX 4090 (25.8 GB" in out and "not run" in out


def test_unknown_target_exits_2(tmp_path, capsys):
    rc = call(memory_cli.main, "--target", "h900", "--preset", "tiny", "--out", tmp_path / "o")
    err = capsys.readouterr().err
    assert rc == 2 and "--target 'h900' is not a known GPU; choose one of: h100" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_gpu_plans_differ_where_the_cpu_plan_costs_memory_on_a_gpu():
    from tftjax import remat

    assert remat.plan("aggressive", "cpu").vsn_scan and not remat.plan("aggressive", "gpu").vsn_scan
    assert remat.plan("full", "cpu").fused and not remat.plan("full", "gpu").fused
    # on a GPU every tier but off recomputes the VSN chunks, keeping less and less
    assert [remat.plan(t, "gpu").vsn for t in TIERS] == [False, True, True, True]
    assert not any(remat.plan(t, "gpu").fused and remat.plan(t, "gpu").vsn for t in TIERS)
