"""What many tests share: the tiny TFT's and DQN's command lines (one compiled program for
all of their runs in a worker), quiet run options, and reading a checkpoint raw."""

import orbax.checkpoint as ocp
from conftest import bars_columns, random_bars, short_es, write_table

from tftjax.config import TrainConfig, preset
from tftjax.dqn.config import DQNConfig

# The in-process remat runs (training/test_remat_training.py, memory/test_memory.py): one
# compiled step serves both. Chunks of 3: every VSN runs chunked, with padding.
CHUNKED_TFT = preset("tiny", vsn_chunk=3)
CHUNKED_TRAIN = TrainConfig(epochs=2, batch_size=16, max_steps_per_epoch=3, seed=3)

# --remat off: the tier of preset("tiny") in the in-process runs, so that they and the CLI
# runs share compiled steps (the CLI's own default tier is run by training/test_train.py and runner/test_mesh.py)
TINY_TFT = [
    "--preset",
    "tiny",
    "--remat",
    "off",
    "--batch-size",
    "32",
    "--max-steps-per-epoch",
    "3",
    "--patience",
    "0",
    "--no-progress",
]


# tftjax.train's: without the PNG plots (a quarter of a warm tiny run; training/test_train.py,
# training/test_multiseries.py and runner/test_mesh.py draw and check them)
TINY_TRAIN = [*TINY_TFT, "--no-plots"]


def tiny_tft(*args):
    """The tiny CLI run's flags on the suite's short data file (conftest.short_es)."""
    return [*TINY_TRAIN, "--parquet-file", short_es(), *args]


# The in-process tiny DQN runs: a few hundred env steps per epoch on the bundled ES bars
TINY_DQN_CONFIG = DQNConfig(
    window=4,
    features=("r1", "ret_5", "rvol_10"),
    episode_len=64,
    num_envs=4,
    steps_per_epoch=200,
    hidden=(16,),
    batch_size=32,
    buffer_size=2_000,
    learning_starts=64,
    target_update_every=20,
    eps_decay_steps=400,
    epochs=3,
    patience=0,
)

TINY_DQN = [
    "--window",
    "4",
    "--features",
    "r1",
    "ret_5",
    "rvol_10",
    "--episode-len",
    "64",
    "--num-envs",
    "4",
    "--steps-per-epoch",
    "200",
    "--hidden",
    "16",
    "--batch-size",
    "32",
    "--buffer-size",
    "2000",
    "--learning-starts",
    "64",
    "--target-update-every",
    "20",
    "--eps-decay-steps",
    "400",
    "--patience",
    "0",
    "--no-progress",
]
quiet = dict(log=lambda *a: None, progress=False)
tft_quiet = dict(quiet, plots=False)  # train_and_evaluate without its PNG plots


def raw_state(path):
    """A checkpoint's state as plain arrays (no target structure needed)."""
    ckpt = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    return ckpt.restore(
        path.absolute(), args=ocp.args.Composite(state=ocp.args.StandardRestore())
    ).state


def other_file(tmp_path):
    return write_table(tmp_path / "other.parquet", bars_columns(random_bars(1500, seed=7)))
