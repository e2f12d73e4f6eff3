"""Data parallelism, gradient accumulation and multi-host runs against the 1-device run.

The meshes need simulated CPU devices (``XLA_FLAGS`` before jax is imported), so these run in
subprocesses: ``mesh_worker.py`` for the in-process comparisons, the CLI for the rest.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent  # mesh_worker.py beside this file
ROOT = HERE.parent


def env(devices: int | None = None, fast: bool = False) -> dict:
    """The subprocesses' environment: ``devices`` simulated CPU devices; this process's XLA
    optimisation, or (``fast``) the quick tier's little in either tier (conftest.fast_compile)
    where every comparison is between runs of that one process, compiled alike."""
    from conftest import fast_compile

    e = dict(os.environ, JAX_PLATFORMS="cpu")
    if fast:
        fast_compile(e)
    flags = [f for f in e.get("XLA_FLAGS", "").split() if "device_count" not in f]
    if devices:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    e["XLA_FLAGS"] = " ".join(flags)
    return e


def cli(*args, devices=None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "tftjax.train", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(devices),
        timeout=600,
        **kw,
    )


@pytest.fixture(scope="module")
def worker():
    from conftest import short_es

    p = subprocess.run(
        [sys.executable, str(HERE / "mesh_worker.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        # compiled alike within the worker; what it shows (meshes, accumulation,
        # checkpoints across meshes) does not hang on XLA's optimisation, and
        # compiled as users compile it took 240 s instead of 100 s
        env={**env(fast=True), "TFTJAX_TEST_PARQUET": short_es()},
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def close(r: dict):
    """Loss, evaluation and parameters equal to float32 round-off (1e-6 relative; every
    parameter within 1% of one Adam step), and the state replicated on every device."""
    assert r["loss_rel"] <= 1e-6, r
    assert r["params_rel"] <= 1e-6, r
    assert r["params_max_abs"] <= 1e-5, r  # 1% of one Adam step (lr 1e-3)
    assert r["eval_rel"] is None or r["eval_rel"] <= 1e-6, r
    assert r["replicated"], r


@pytest.mark.slow
@pytest.mark.xdist_group("mesh_worker")
def test_four_devices_train_like_one(worker):
    # dropout on: the masks do not depend on how the batch is split over devices
    close(worker["four_vs_one"])


@pytest.mark.slow
@pytest.mark.xdist_group("mesh_worker")
def test_accumulated_micro_batches_give_the_whole_batch_update(worker):
    # 2 micro-batches of 8 windows (over 4 devices, feature rows sharded) vs 16 at once
    close(worker["accumulate_2_rows_sharded_vs_whole"])


@pytest.mark.slow
@pytest.mark.xdist_group("mesh_worker")
@pytest.mark.parametrize("case", ["qat_accumulate_4_vs_whole", "qat_four_devices_vs_one"])
def test_qat_observers_and_weights_do_not_depend_on_the_split(worker, case):
    # issue 27: each micro-batch once moved the observers (narrowing the ranges with K) and
    # counted against --qat-freeze-after; now the step updates them once, by the batch's range.
    # Equal up to fake-quant's rounding flips, which no tolerance on the weights can bound:
    # micro-batches of B/4 rows (on one device or four) round off differently from the whole
    # batch in the last ulp (another reduction order; it differs with the machine, the thread
    # count and Eigen's threading), and a value within that of a rounding boundary lands one
    # int8 step away. Its gradient terms then differ by a step, and Adam, which normalises
    # each parameter's update, turns a small gradient's difference into up to a whole step
    # (lr 1e-3): measured on one machine, a few parameters 1.3e-3 apart, on another none
    # beyond 4e-5. So the invariants, each argued:
    # - the observers' update count, exactly: 3 steps, one update each (the bug: 12);
    # - the observers' values to 1e-3 of each one's range: a flip moves an activation by a
    #   step (1/255 of the range) and the moving average takes 0.01 of it (~4e-5); the bug
    #   narrowed the ranges by O(10%) (its first update read one micro-batch);
    # - the loss to 1e-3 (the bound; measured 6e-5 to 1.1e-4);
    # - at most 0.1% of the parameters more than one Adam step apart: a flip reaches the
    #   few parameters whose gradient it dominates (none to a few of the ~10^5 here).
    r = worker[case]
    obs = r["observers"]
    assert obs["counts"] == [3], obs
    assert obs["n"] > 0 and obs["max_rel"] <= 1e-3, obs
    assert r["loss_rel"] <= 1e-3, r
    assert r["params_share_beyond_one_step"] <= 1e-3, r
    assert r["replicated"], r


@pytest.mark.slow
@pytest.mark.xdist_group("mesh_worker")
def test_qat_observers_ignore_the_padded_rows_of_a_last_batch(worker):
    assert worker["qat_padded_rows"]["max_abs"] == 0.0, worker["qat_padded_rows"]


@pytest.mark.slow
@pytest.mark.xdist_group("mesh_worker")
def test_checkpoints_move_between_meshes(worker):
    assert worker["saved_on_4_restored_on_1"] == {"equal": True, "devices": [1]}
    assert worker["saved_on_1_restored_on_4"] == {"equal": True, "devices": [4]}


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--batch-size", "18"], "--batch-size 18 is not divisible by the 4 devices of the mesh"),
        (
            ["--batch-size", "16", "--accumulate", "8"],
            "--batch-size / --accumulate 8 = 2 is not divisible by the 4 devices",
        ),
        (
            ["--batch-size", "16", "--accumulate", "3"],
            "batch_size 16 is not divisible by --accumulate 3",
        ),
        (["--devices", "8"], "--devices 8: this process sees 4 CPU devices"),
        (["--coordinator", "localhost:1234"], "missing: --num-processes, --process-id"),
        (
            ["--coordinator", "localhost", "--num-processes", "2", "--process-id", "0"],
            "must be HOST:PORT",
        ),
        (["--feature-layout", "diagonal"], "diagonal"),
        (
            ["--kernels", "pallas"],
            "--kernels pallas runs on one device: the Pallas kernels are "
            "not sharded over a mesh, and this run has 4 devices (give --devices 1)",
        ),
    ],
)
def test_cli_refuses_a_batch_the_mesh_cannot_split(tmp_path, args, expect):
    p = cli("--preset", "tiny", "--workdir", str(tmp_path / "w"), *args, devices=4)
    assert p.returncode == 2, p.stderr
    assert expect in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "w").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.heavy
def test_two_processes_train_like_one(tmp_path, capsys):
    """jax.distributed over localhost: 2 processes of 1 CPU device each, each feeding its own
    half of every batch, give the 1-process run's losses, metrics and weights; only process 0
    writes logs and files, both write the checkpoints."""
    # the tiny runs' settings (tests/runner/test_loop.py): the reference's compiles are cached
    from conftest import short_es

    args = [
        "--preset",
        "tiny",
        "--remat",
        "off",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--max-steps-per-epoch",
        "3",
        "--no-progress",
        "--parquet-file",
        short_es(),
    ]
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tftjax.train",
                *args,
                "--workdir",
                str(tmp_path / "multi"),
                "--coordinator",
                f"localhost:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env(),
        )
        for i in range(2)
    ]
    # the 1-process reference in this process: it shares this worker's compiled steps
    from tftjax import train as train_cli

    assert train_cli.main([*args, "--workdir", str(tmp_path / "one"), "--no-plots"]) == 0
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "2 devices (cpu, 2 processes)" in outs[0][0]
    assert "q-risk P50" in outs[0][0] and "q-risk P50" not in outs[1][0]  # process 0 logs
    m_multi = json.loads((tmp_path / "multi" / "metrics.jsonl").read_text())
    m_one = json.loads((tmp_path / "one" / "metrics.jsonl").read_text())
    # the CLI's default matmul precision (TF32 on NVIDIA GPUs): float32's 1e-6 scaled by the
    # mantissa bits the default gives up
    from conftest import matmul_mantissa_bits

    rtol = 1e-6 * 2.0 ** (24 - matmul_mantissa_bits())
    for k in ("train_loss", "val_loss", "val_q_risk_90"):
        assert m_multi[k] == pytest.approx(m_one[k], rel=rtol), k
    s_multi = json.loads((tmp_path / "multi" / "summary.json").read_text())
    s_one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert s_multi["model"]["test"]["loss"] == pytest.approx(
        s_one["model"]["test"]["loss"], rel=rtol
    )
    assert (tmp_path / "multi" / "quantile_fan.png").exists()
    a, b = (_params(tmp_path / d / "checkpoints" / "tft_final_epoch1") for d in ("multi", "one"))
    diff = np.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b)))
    assert diff <= rtol * np.sqrt(sum((y**2).sum() for y in b))


def _params(path):
    import jax

    from tftjax.training import open_checkpoint, restore_checkpoint

    state = restore_checkpoint(open_checkpoint(path))
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(state.params)]


def test_which_environments_start_jax_distributed(monkeypatch):
    from tftjax.runner import mesh as parallel

    for var in (
        "JAX_COORDINATOR_ADDRESS",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_SIZE",
        "TFTJAX_DISTRIBUTED",
    ):
        monkeypatch.delenv(var, raising=False)
    assert not parallel.wants_distributed()
    assert parallel.wants_distributed("node0:1234", 2, 0)
    monkeypatch.setenv("SLURM_NTASKS", "4")  # a batch script's own shell: one process
    assert not parallel.wants_distributed()
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")  # inside `srun -n 4`
    assert parallel.wants_distributed()
    monkeypatch.setenv("TFTJAX_DISTRIBUTED", "0")
    assert not parallel.wants_distributed()
    monkeypatch.delenv("TFTJAX_DISTRIBUTED")
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "node0:1234")
    assert parallel.wants_distributed()


@pytest.mark.slow
@pytest.mark.heavy
def test_two_processes_save_the_same_step_on_a_signal_to_one(tmp_path):
    """jax.distributed over localhost: SIGTERM to process 0 alone stops both at one step
    (JAX's preemption sync point), both exit 75 after saving it, and ``--resume auto`` on
    both ends the run."""
    import signal
    import time

    from conftest import short_es

    from tftjax.runner.checkpoints import list_checkpoints, step_checkpoints
    from tftjax.runner.preemption import EXIT_SAVED

    wd = tmp_path / "multi"
    args = [
        *("--preset", "tiny", "--remat", "off", "--epochs", "2", "--batch-size", "32"),
        *("--max-steps-per-epoch", "8", "--no-progress", "--no-plots", "--no-tensorboard"),
        *("--parquet-file", short_es(), "--workdir", str(wd), "--resume", "auto"),
    ]

    def start():
        port = free_port()
        return [
            subprocess.Popen(
                [sys.executable, "-m", "tftjax.train", *args, "--coordinator", f"localhost:{port}"]
                + ["--num-processes", "2", "--process-id", str(i)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=env(fast=True),
            )
            for i in range(2)
        ]

    procs = start()
    deadline = time.monotonic() + 600
    while "tft_epoch_1" not in list_checkpoints(wd / "checkpoints"):  # training in epoch 2
        assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].stderr.read()
        time.sleep(0.05)
    procs[0].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=600) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [EXIT_SAVED, EXIT_SAVED], [o[1][-2000:] for o in outs]
    (saved,) = step_checkpoints(wd / "checkpoints", "tft")  # one step, saved by both
    assert 8 < saved < 16 and "Traceback" not in outs[1][1]
    procs = start()
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert f"(step {saved - 8} of epoch 2; step {saved} of the run)" in outs[0][0]
    assert "tft_final_epoch2" in list_checkpoints(wd / "checkpoints")
