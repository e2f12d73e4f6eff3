"""One model over several instruments against one model per instrument, on the same test
windows.

    python experiments/joint_vs_separate.py [--datasets spx,nasdaq] [--preset small]
        [--seeds 3] [--epochs 20] [--patience 3] [--block 60] [--out joint_vs_separate.json]

For each seed: one joint model trained on every series (``python -m tftjax.train --dataset
spx,nasdaq``: the instrument embedding, each series' own statistics, global split times),
and one model per series trained on that series alone **at the joint run's cut times**, so
that both are scored on exactly the same test windows, with the same targets (each series'
statistics come from the same training rows in both). Epochs are chosen on the validation
windows (early stopping, the best epoch's weights); the test windows are scored once.

Per series: the P90 (and P50) q-risk of each seed, of the seed-averaged per-window sums, and
the paired difference joint - separate with a 95% circular block bootstrap interval over the
test windows (block length by the Politis-White rule on the per-window P90 differences,
``tftjax.stats.scoring.block_length``) and a Diebold-Mariano test (Newey-West, HLN) on the
per-window P90 pinball differences. Negative: the joint model is better. ``--score-only``
scores the runs already in ``--work`` again without training.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

from tftjax.config import TrainConfig, preset
from tftjax.data import bundled_path, load_dataset, to_device
from tftjax.stats import scoring
from tftjax.training import Trainer, open_checkpoint, restore_checkpoint, train_and_evaluate
from tftjax.training.evaluation import window_targets


def test_sums(run: Path, cfg, tc, ds) -> tuple[np.ndarray, int]:
    """Per-window metric sums of a run's best weights on ``ds``'s test windows."""
    ck = open_checkpoint(run)
    model = ck.cfg
    variables = restore_checkpoint(ck).variables()
    pred, _ = Trainer(model, tc, to_device(ds.features)).predict(variables, ds.splits.test)
    return scoring.window_sums(
        window_targets(ds, ds.splits.test), pred, cfg.head.quantiles
    ), ck.meta["weights_epoch"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="spx,nasdaq")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--score-only", action="store_true", help="score the runs in --work again")
    ap.add_argument("--work", type=Path, default=Path("runs/joint_vs_separate"))
    ap.add_argument("--out", type=Path, default=Path("joint_vs_separate.json"))
    args = ap.parse_args()

    names = args.datasets.split(",")
    paths = [bundled_path(n) for n in names]
    cfg = preset(args.preset, remat="full")
    joint_ds = load_dataset(paths, cfg.data)
    sep_ds = {n: load_dataset(p, cfg.data, cuts=joint_ds.cuts) for n, p in zip(names, paths)}
    for i, n in enumerate(names):  # the same windows and targets in both
        mine = joint_ds.series_of(joint_ds.splits.test) == i
        np.testing.assert_array_equal(
            window_targets(joint_ds, joint_ds.splits.test[mine]),
            window_targets(sep_ds[n], sep_ds[n].splits.test),
        )
    per = {n: {"joint": [], "separate": []} for n in names}
    epochs = {"joint": [], **{n: [] for n in names}}
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        tc = TrainConfig(
            epochs=args.epochs,
            batch_size=args.batch_size,
            patience=args.patience,
            seed=seed,
            eval_batch_size=512,
        )
        run = args.work / f"joint_{seed}"
        if not args.score_only:
            train_and_evaluate(cfg, tc, run, data=joint_ds, progress=False, log=lambda *a: None)
        sums, ep = test_sums(run, cfg, tc, joint_ds)
        epochs["joint"].append(ep)
        which = joint_ds.series_of(joint_ds.splits.test)
        for i, n in enumerate(names):
            per[n]["joint"].append(sums[which == i])
        for n in names:
            run = args.work / f"{n}_{seed}"
            if not args.score_only:
                train_and_evaluate(
                    cfg, tc, run, data=sep_ds[n], progress=False, log=lambda *a: None
                )
            sums, ep = test_sums(run, cfg, tc, sep_ds[n])
            epochs[n].append(ep)
            per[n]["separate"].append(sums)
        print(f"seed {seed} done in {time.perf_counter() - t0:.0f} s", flush=True)

    out = {
        "datasets": names,
        "preset": args.preset,
        "seeds": args.seeds,
        "epochs_max": args.epochs,
        "patience": args.patience,
        "cuts": [str(np.datetime64(int(c), "ns")) for c in joint_ds.cuts],
        "best_epochs": epochs,
        "series": {},
        "seconds": time.perf_counter() - t0,
        "revision": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    }
    print(
        "| series | test windows | joint P90 (seeds) | separate P90 (seeds) | joint P90 "
        "| separate P90 | joint - separate [95% CI] | DM stat (p) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        j, s = np.mean(per[n]["joint"], axis=0), np.mean(per[n]["separate"], axis=0)
        diff = j[:, 2] - s[:, 2]  # per-window P90 pinball sums
        block = scoring.block_length(diff)
        delta = lambda x: (
            scoring.from_sums(x[:, :6])["q_risk_90"] - scoring.from_sums(x[:, 6:])["q_risk_90"]
        )
        both = np.concatenate([j, s], axis=1)
        ci = scoring.bootstrap_interval(delta, both, block, args.bootstrap)
        dm = scoring.diebold_mariano(j[:, 2], s[:, 2], cfg.data.decoder_steps)
        row = {
            "windows": int(j.shape[0]),
            "block": block,
            "joint_seeds": [scoring.from_sums(x)["q_risk_90"] for x in per[n]["joint"]],
            "separate_seeds": [scoring.from_sums(x)["q_risk_90"] for x in per[n]["separate"]],
            "joint": {k: float(v) for k, v in scoring.from_sums(j).items()},
            "separate": {k: float(v) for k, v in scoring.from_sums(s).items()},
            "delta_q_risk_90": [float(delta(both)), *ci],
            "dm": dm,
        }
        out["series"][n] = row
        fmt = lambda xs: " / ".join(f"{x:.4f}" for x in xs)
        dq = row["delta_q_risk_90"]
        print(
            f"| {n} | {row['windows']} | {fmt(row['joint_seeds'])} | "
            f"{fmt(row['separate_seeds'])} | {row['joint']['q_risk_90']:.4f} | "
            f"{row['separate']['q_risk_90']:.4f} | {dq[0]:+.4f} [{dq[1]:+.4f}, {dq[2]:+.4f}] "
            f"| {dm['stat']:+.2f} ({dm['p']:.2g}) |"
        )
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
