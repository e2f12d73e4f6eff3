"""tftjax against pytorch-forecasting's TFT, side by side on the same windows and sizes.

    pip install -e ".[bench]"   # torch==2.13.0 (a CPU build here), pytorch-forecasting, lightning
    python experiments/vs_pytorch_forecasting.py [--batch-sizes 64,256] [--steps 6]

A batch the peer cannot hold (killed by the OOM killer) is reported and halved until
it fits; tftjax then runs at that batch too.

Both models are TFT-225 sized: 5 static reals, 210 historical + 10 known encoder
reals, 10 known decoder reals, hidden 128, 4 heads, per-variable embedding 8
(pytorch-forecasting's ``hidden_continuous_size`` = tftjax's ``d_v``), 7 quantiles,
50 encoder and 10 decoder steps, dropout 0.1, Adam(W) at lr 1e-3. Both read the
same feature matrix (tftjax's pipeline on the bundled ES bars): pytorch-forecasting
gets it as a DataFrame with identity scalers and target normaliser, its training
dataset is the training rows and its validation dataset the validation rows, so
the windows are the same (each side samples its own batches from them).

Each side runs in its own child process, one after the other: ``--warmup`` steps,
then ``--steps`` timed steps (per-step wall time, the median and range reported;
tftjax's compile is timed apart, pytorch-forecasting's data loading is inside its
steps, as a user runs it), then the validation loss (mean pinball over quantiles
and steps, computed by the same numpy function for both) on the same validation
windows, and the child's peak RSS (``ru_maxrss``). Torch uses as many threads as
the machine has cores (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def val_loss(y: np.ndarray, pred: np.ndarray) -> float:
    from tftjax.stats.losses import numpy_metrics

    return numpy_metrics(y, pred, QUANTILES)["loss"]


# ----------------------------------------------------------------------------- tftjax


def run_tftjax(args) -> dict:
    import jax
    import jax.numpy as jnp

    from tftjax.config import TrainConfig, preset
    from tftjax.data import epoch_batches, load_dataset, to_device
    from tftjax.models.remat import default_tier
    from tftjax.training import Trainer, create_train_state, window_targets

    # the CLI's default tier on this backend; --precision bf16: bfloat16 compute
    cfg = preset(
        "tft225",
        remat=args.remat or default_tier(),
        precision="bf16" if args.precision == "bf16" else "f32",
    )
    assert tuple(cfg.head.quantiles) == QUANTILES, cfg.head.quantiles
    ds = load_dataset(None, cfg.data)
    data = to_device(ds.features)
    tc = TrainConfig(batch_size=args.batch_size, learning_rate=1e-3)
    state = create_train_state(cfg, tc, jax.random.key(0))
    trainer = Trainer(cfg, tc, data)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    idx, _ = epoch_batches(ds.splits.train, args.batch_size, seed=0, epoch=1)
    total = args.warmup + args.steps
    batches = [jnp.asarray(idx[i % len(idx)], jnp.int32) for i in range(total)]
    key = jax.random.key(1, impl="rbg")
    t0 = time.perf_counter()
    trainer._train = trainer._train.lower(state, data, batches[0], key).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for i, b in enumerate(batches):
        t0 = time.perf_counter()
        state, m = trainer._train(state, data, b, jax.random.fold_in(key, i))
        jax.block_until_ready(m)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    val = ds.splits.val[: args.val_windows]
    pred, _ = trainer.predict(state.params, val)
    y = window_targets(ds, val)
    return {
        "side": "tftjax",
        "remat": cfg.execution.remat,
        "precision": cfg.execution.precision,
        "device": jax.devices()[0].device_kind,
        "compile_s": compile_s,
        "step_s": times,
        "params": int(n_params),
        "val_loss": val_loss(y, pred),
        "val_windows": len(val),
        "threads": os.cpu_count(),
        "jax": jax.__version__,
    }


# ----------------------------------------------------------------- pytorch-forecasting


def frame(ds, rows: tuple[int, int]):
    import pandas as pd

    f = ds.features
    a, b = rows
    cols = {"time_idx": np.arange(a, b), "group": "es", "target": f.target[a:b]}
    cols.update({f"h{i}": f.historical[a:b, i] for i in range(f.historical.shape[1])})
    cols.update({f"k{i}": f.known[a:b, i] for i in range(f.known.shape[1])})
    cols.update({f"s{i}": np.full(b - a, f.static[i], np.float32) for i in range(f.static.size)})
    return pd.DataFrame(cols)


def dataset_settings(f, E: int, D: int) -> dict:
    """pytorch-forecasting's ``TimeSeriesDataSet`` settings for tftjax's features ``f``: the
    same inputs in their roles (static, known, observed), already scaled (no normaliser or
    scaler of its own), ``E`` encoder and ``D`` decoder steps."""
    from pytorch_forecasting.data.encoders import TorchNormalizer

    hist = [f"h{i}" for i in range(f.historical.shape[1])]
    known = [f"k{i}" for i in range(f.known.shape[1])]
    static = [f"s{i}" for i in range(f.static.size)]
    return dict(
        time_idx="time_idx",
        target="target",
        group_ids=["group"],
        max_encoder_length=E,
        min_encoder_length=E,
        max_prediction_length=D,
        min_prediction_length=D,
        static_reals=static,
        time_varying_known_reals=known,
        time_varying_unknown_reals=hist,
        target_normalizer=TorchNormalizer(method="identity", center=False),
        scalers={c: None for c in hist + known + static},
        add_relative_time_idx=False,
        add_target_scales=False,
        add_encoder_length=False,
    )


def run_peer(args) -> dict:
    import lightning.pytorch as pl
    import pytorch_forecasting
    import torch
    from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet
    from pytorch_forecasting.metrics import QuantileLoss

    from tftjax.config import preset
    from tftjax.data import load_dataset

    threads = os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = preset("tft225")
    ds = load_dataset(None, cfg.data)
    E, D = cfg.data.encoder_steps, cfg.data.decoder_steps
    f = ds.features
    common = dataset_settings(f, E, D)
    train = TimeSeriesDataSet(frame(ds, ds.splits.train_rows), **common)
    val = TimeSeriesDataSet.from_dataset(
        train, frame(ds, ds.splits.val_rows), stop_randomization=True, predict=False
    )
    model = TemporalFusionTransformer.from_dataset(
        train,
        hidden_size=cfg.model.hidden,
        attention_head_size=cfg.model.heads,
        dropout=cfg.model.dropout,
        hidden_continuous_size=cfg.model.d_v,
        lstm_layers=1,
        output_size=len(QUANTILES),
        loss=QuantileLoss(quantiles=list(QUANTILES)),
        learning_rate=1e-3,
        optimizer="adam",
    )
    n_params = sum(p.numel() for p in model.parameters())
    total = args.warmup + args.steps
    loader = train.to_dataloader(train=True, batch_size=args.batch_size, num_workers=0)

    class Clock(pl.Callback):
        """Whole steps, batch end to batch end: the data loader's time counts too."""

        def __init__(self):
            self.times, self._t = [], None

        def on_train_start(self, *a):
            self._t = time.perf_counter()

        def on_train_batch_end(self, *a):
            t = time.perf_counter()
            self.times.append(t - self._t)
            self._t = t

    clock = Clock()
    # --accelerator gpu: Lightning on the GPU; --precision bf16: its "bf16-mixed" (autocast),
    # what pytorch-forecasting users switch on for a GPU
    trainer = pl.Trainer(
        max_steps=total,
        accelerator=args.accelerator,
        devices=1,
        logger=False,
        precision="bf16-mixed" if args.precision == "bf16" else "32-true",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[clock],
    )
    t0 = time.perf_counter()
    trainer.fit(model, train_dataloaders=loader)
    fit_s = time.perf_counter() - t0
    model.eval()
    vloader = val.to_dataloader(train=False, batch_size=256, num_workers=0)
    preds, ys = [], []
    model.to("cuda" if args.accelerator == "gpu" else "cpu")
    with torch.no_grad():
        for x, (y, _) in vloader:
            x = {k: v.to(model.device) if hasattr(v, "to") else v for k, v in x.items()}
            preds.append(model(x)["prediction"].float().cpu().numpy())
            ys.append(y.numpy())
            if sum(len(p) for p in preds) >= args.val_windows:
                break
    pred = np.concatenate(preds)[: args.val_windows]
    y = np.concatenate(ys)[: args.val_windows]
    return {
        "side": "pytorch-forecasting",
        "step_s": clock.times[args.warmup :],
        "fit_s": fit_s,
        "params": int(n_params),
        "val_loss": val_loss(y, pred),
        "val_windows": len(pred),
        "threads": threads,
        "torch": torch.__version__,
        "accelerator": args.accelerator,
        "precision": args.precision,
        "pytorch_forecasting": pytorch_forecasting.__version__,
    }


# ------------------------------------------------------------------------------ driver


def child(args) -> None:
    out = run_tftjax(args) if args.side == "tftjax" else run_peer(args)
    out["peak_rss_bytes"] = peak_rss_bytes()
    out["batch_size"] = args.batch_size
    print("RESULT " + json.dumps(out), flush=True)


def spawn(side: str, batch: int, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--batch-size",
        str(batch),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--val-windows",
        str(args.val_windows),
        "--accelerator",
        args.accelerator,
        "--precision",
        args.precision,
    ]
    if args.remat:
        cmd += ["--remat", args.remat]
    env = dict(
        os.environ,
        JAX_PLATFORMS=os.environ.get(
            "JAX_PLATFORMS", "cuda" if args.accelerator == "gpu" else "cpu"
        ),
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode in (-9, 137):  # the kernel's OOM killer
        return {"side": side, "batch_size": batch, "oom": True}
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{side} at batch {batch} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def _ram_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def summary(r: dict) -> dict:
    t = r["step_s"]
    med = statistics.median(t)
    return {
        "samples_per_s": r["batch_size"] / med,
        "min": r["batch_size"] / max(t),
        "max": r["batch_size"] / min(t),
        "rss_gb": r["peak_rss_bytes"] / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="64,256")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per side")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--val-windows", type=int, default=512)
    ap.add_argument("--remat", default=None, help="tftjax tier (default: the CLI's default)")
    ap.add_argument(
        "--accelerator",
        choices=("cpu", "gpu"),
        default="cpu",
        help="both sides on the CPU, or both on the (first) GPU",
    )
    ap.add_argument(
        "--precision",
        choices=("f32", "bf16"),
        default="f32",
        help="bf16: tftjax --precision bf16 against Lightning's bf16-mixed",
    )
    ap.add_argument("--side", choices=("tftjax", "peer"), help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument(
        "--out", type=Path, default=Path("experiments/results/vs_pytorch_forecasting.json")
    )
    args = ap.parse_args()
    if args.side:
        return child(args)
    from tftjax.runner.provenance import write_result

    rows = []
    print(
        f"{os.cpu_count()} cores; each side in its own process, one after the other; "
        f"{args.warmup} warm-up + {args.steps} timed steps",
        flush=True,
    )
    table = [
        "| batch | side | samples/s (median; range) | peak RSS | params | val loss "
        f"after {args.warmup + args.steps} steps |",
        "|---|---|---|---|---|---|",
    ]
    for b in (int(x) for x in args.batch_sizes.split(",")):
        peer = spawn("peer", b, args)
        while peer.get("oom") and b > 1:
            table.append(
                f"| {b} | pytorch-forecasting | killed: out of memory "
                f"({_ram_gb():.0f} GB machine) | | | |"
            )
            print(table[-1], flush=True)
            b //= 2
            peer = spawn("peer", b, args)
        ours = spawn("tftjax", b, args)
        for r in (peer, ours):
            s = summary(r)
            name = r["side"] + (
                f" (`--remat {r['remat']}`, compile {r['compile_s']:.0f} s)"
                if r["side"] == "tftjax"
                else f" {r['pytorch_forecasting']} (torch {r['torch']}, {r['threads']} threads)"
            )
            table.append(
                f"| {b} | {name} | {s['samples_per_s']:.1f} ({s['min']:.1f}–"
                f"{s['max']:.1f}) | {s['rss_gb']:.2f} GB | {r['params']:,} "
                f"| {r['val_loss']:.4f} |"
            )
        sp, so = summary(peer), summary(ours)
        ratio = {
            "batch_size": b,
            "speed_ratio": so["samples_per_s"] / sp["samples_per_s"],
            "rss_ratio": so["rss_gb"] / sp["rss_gb"],
        }
        table.append(
            f"| {b} | **tftjax / peer** | **{ratio['speed_ratio']:.1f}×** | "
            f"**{ratio['rss_ratio']:.2f}×** | | |"
        )
        rows.append({"peer": peer, "tftjax": ours, **ratio})
        print("\n".join(table[-3:]), flush=True)
    print("\n" + "\n".join(table))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, rows, args)


if __name__ == "__main__":
    main()
