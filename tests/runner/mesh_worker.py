"""Run by tests/runner/test_mesh.py in a subprocess with 4 simulated CPU devices (XLA_FLAGS must
be set before jax is imported): trains 3 steps on meshes of 1, 2 and 4 devices, saves and
restores across meshes, and prints one JSON line of comparisons against the 1-device run."""

import os
import sys

os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    + ["--xla_force_host_platform_device_count=4"]
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json
import tempfile

import jax
import numpy as np

jax.config.update("jax_default_matmul_precision", "highest")  # equality on any backend

from tftjax.config import TrainConfig, preset  # noqa: E402
from tftjax.data import load_dataset  # noqa: E402
from tftjax.runner.checkpoints import EpochCheckpointer  # noqa: E402
from tftjax.runner.mesh import make_parallel  # noqa: E402
from tftjax.training import Trainer, create_train_state  # noqa: E402

STEPS, BATCH = 3, 16


def train(cfg, devices, layout="replicated", accumulate=1, evaluate=False):
    par = make_parallel(devices, layout)
    tc = TrainConfig(batch_size=BATCH, eval_batch_size=30, accumulate=accumulate)
    trainer = Trainer(cfg, tc, par.put_data(DS.features), par=par)
    state = par.replicate(create_train_state(cfg, tc, jax.random.key(0)))
    key = par.replicate(jax.random.key(1, impl="rbg"))
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        state, m = trainer.train_step(state, rng.choice(DS.splits.train, BATCH), key)
        losses.append(float(m["loss"]))
    ev = trainer.evaluate(state.variables(), DS.splits.val[:50])["loss"] if evaluate else None
    return {
        "losses": losses,
        "state": state,
        "eval": ev,
        "par": par,
        "replicated": all(x.sharding.is_fully_replicated for x in jax.tree.leaves(state)),
    }


def compare_observers(run, ref) -> dict:
    """QAT: the observers after the same steps (how many updates; min/max, also against
    each observer's range ``max - min``)."""
    from tftjax.quant.core import MinMax

    leaf = lambda x: isinstance(x, MinMax)
    a = jax.tree.leaves(jax.device_get(run["state"].quant_stats), is_leaf=leaf)
    b = jax.tree.leaves(jax.device_get(ref["state"].quant_stats), is_leaf=leaf)
    f64 = lambda x: np.asarray(x, np.float64)
    diffs = [
        np.maximum(np.abs(f64(x.min) - f64(y.min)), np.abs(f64(x.max) - f64(y.max)))
        for x, y in zip(a, b)
    ]
    spans = [np.maximum(f64(y.max) - f64(y.min), 1e-12) for y in b]
    return {
        "n": len(b),
        "max_abs": float(max(d.max() for d in diffs)),
        "max_rel": float(max((d / r).max() for d, r in zip(diffs, spans))),
        "counts": sorted({int(np.max(x.count)) for x in a}),
    }


def padded_rows(cfg, par) -> dict:
    """QAT: a batch whose last rows are padding (-1, the last batch of an epoch) moves the
    observers exactly as the same batch with those rows replaced by its first window: the
    padded rows add nothing to the ranges (they once were window 0's values)."""
    tc = TrainConfig(batch_size=BATCH, eval_batch_size=30)  # train()'s: its compiled step
    trainer = Trainer(cfg, tc, par.put_data(DS.features), par=par)
    key = par.replicate(jax.random.key(1, impl="rbg"))
    idx = np.asarray(DS.splits.train[-BATCH:], np.int32)  # far from window 0
    pad, dup = idx.copy(), idx.copy()
    pad[-5:], dup[-5:] = -1, idx[0]

    def observers(i):  # a fresh state each (the step donates its input)
        state = par.replicate(create_train_state(cfg, tc, jax.random.key(0)))
        return jax.device_get(trainer.train_step(state, i, key)[0].quant_stats)

    a, b = observers(pad), observers(dup)
    return {
        "max_abs": float(
            max(
                np.abs(np.asarray(x, np.float64) - np.asarray(y)).max()
                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
            )
        )
    }


def compare(run, ref) -> dict:
    a = [np.asarray(x, np.float64) for x in jax.tree.leaves(run["state"].params)]
    b = [np.asarray(x, np.float64) for x in jax.tree.leaves(ref["state"].params)]
    diff = np.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b)))
    norm = np.sqrt(sum((y**2).sum() for y in b))
    return {
        "loss_rel": max(abs(x - y) / abs(y) for x, y in zip(run["losses"], ref["losses"])),
        "params_rel": float(diff / norm),
        "params_max_abs": float(max(np.abs(x - y).max() for x, y in zip(a, b))),
        # parameters more than one Adam step (lr 1e-3) apart, as a share of all of them
        "params_share_beyond_one_step": float(
            sum((np.abs(x - y) > 1e-3).sum() for x, y in zip(a, b)) / sum(y.size for y in b)
        ),
        "params_n": int(sum(y.size for y in b)),
        "leaf_rel_max": float(
            max(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-12) for x, y in zip(a, b))
        ),
        "eval_rel": (
            abs(run["eval"] - ref["eval"]) / ref["eval"] if run["eval"] is not None else None
        ),
        "replicated": run["replicated"],
    }


def save_and_restore(src, dst_par) -> dict:
    """Save ``src``'s state with its mesh, restore it onto ``dst_par``'s mesh."""
    with tempfile.TemporaryDirectory() as d:
        ck = EpochCheckpointer(d, "tft")
        ck.save(1, src["state"], {}, {"kind": "tft"}, improved=True)
        rep = dst_par.replicated
        like = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), src["state"]
        )
        got = ck.restore(1, like)
        ck.close()
    same = all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(src["state"]))
    )
    devices = {len(x.sharding.device_set) for x in jax.tree.leaves(got)}
    return {"equal": same, "devices": sorted(devices)}


if __name__ == "__main__":
    assert len(jax.devices()) == 4, jax.devices()
    DS = load_dataset(os.environ.get("TFTJAX_TEST_PARQUET"), preset("tiny").data)  # short bars
    with_dropout = preset("tiny")
    no_dropout = with_dropout.override(dropout=0.0)
    out = {}
    one = train(with_dropout, 1, evaluate=True)
    four = train(with_dropout, 4, evaluate=True)
    out["four_vs_one"] = compare(four, one)
    out["saved_on_4_restored_on_1"] = save_and_restore(four, one["par"])
    out["saved_on_1_restored_on_4"] = save_and_restore(one, four["par"])
    # 2 micro-batches of 8 over 4 devices (2 windows each) vs 16 windows on one device, the
    # feature rows sharded over the 4 devices (the other layout)
    out["accumulate_2_rows_sharded_vs_whole"] = compare(
        train(no_dropout, 4, layout="rows", accumulate=2), train(no_dropout, 1)
    )
    # QAT: observers move once per step by the whole batch's range, whatever the batch is
    # split into: 4 micro-batches or 4 devices equal one device's whole batch
    qat = no_dropout.override(qat=True)
    q1 = train(qat, 1)
    for name, run in (
        ("qat_accumulate_4_vs_whole", train(qat, 1, accumulate=4)),
        ("qat_four_devices_vs_one", train(qat, 4)),
    ):
        out[name] = {**compare(run, q1), "observers": compare_observers(run, q1)}
    out["qat_padded_rows"] = padded_rows(qat, q1["par"])
    print(json.dumps(out))
    sys.stdout.flush()
