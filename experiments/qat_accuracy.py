"""Float vs PTQ vs QAT vs INT8 inference: test loss, q-risk, weight bytes, inference speed.

    python experiments/qat_accuracy.py [--preset tiny] [--epochs 8] [--qat-epochs 3]
        [--synthetic-days 180] [--out experiments/results/qat]
        [--table experiments/tables/qat_accuracy.md]

For each data set (the bundled ES bars, and a synthetic ES-like set of
``--synthetic-days`` sessions written by ``tftjax.data.synthetic``):

1. **float**: a TFT trained with the usual loop (early stopping on validation);
2. **PTQ**: its weights, int8 activation ranges calibrated on ``--calibrate`` full
   training batches, no training, by each calibration method (``minmax``,
   ``percentile:99.99``, ``mse``; fake-quant and the int8 path for minmax), and with minmax
   under each quantization option (``--act-symmetric``, ``--weight-granularity tensor``,
   ``--stacked-scales variable``): the int8 path's loss and its weight bytes;
3. **QAT**: ``--init-from`` the float run, ``--qat-epochs`` of quantization-aware
   fine-tuning at ``--qat-lr`` (fake-quant, its float weights, the int8 path).

All test metrics come from the same test windows. Then, side by side in one
process: the weight bytes of the float32 and int8 exports, and the inference
throughput (test windows/s, median of ``--repeats`` interleaved passes) of the
float model and the int8 path, for the trained preset and for TFT-225.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import jax

from tftjax.config import TrainConfig, preset
from tftjax.data import default_parquet, load_dataset, saved_featurisation, to_device
from tftjax.data.bars import write_bars
from tftjax.data.synthetic import generate
from tftjax.runner.provenance import write_result
from tftjax.serving import export as export_lib
from tftjax.training import (
    Trainer,
    calibrate,
    create_train_state,
    model_variables,
    open_checkpoint,
    restore_checkpoint,
    train_and_evaluate,
)


def metrics(m: dict) -> dict:
    return {k: round(float(m[k]), 5) for k in ("loss", "q_risk_50", "q_risk_90")}


def one_dataset(name: str, parquet: Path, args, work: Path) -> dict:
    cfg = preset(args.preset)
    tc = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        patience=3,
        max_steps_per_epoch=args.max_steps,
        eval_batch_size=512,
    )
    log = lambda *a: print(f"[{name}]", *a, flush=True)
    t0 = time.perf_counter()
    float_dir = work / f"{name}_float"
    train_and_evaluate(cfg, tc, float_dir, data=parquet, progress=False, log=log)
    qat_tc = dataclasses.replace(
        tc, epochs=args.qat_epochs, learning_rate=args.qat_lr, init_from=str(float_dir)
    )
    qat_dir = work / f"{name}_qat"
    train_and_evaluate(
        cfg.override(qat=True), qat_tc, qat_dir, data=parquet, progress=False, log=log
    )
    train_s = time.perf_counter() - t0

    ck_float, ck_qat = open_checkpoint(float_dir), open_checkpoint(qat_dir)
    cfg = ck_float.cfg  # the trained model's (with its instrument vocabulary)
    ds = load_dataset(parquet, cfg.data, **saved_featurisation(ck_float.meta))
    data, test = to_device(ds.features), ds.splits.test
    float_vars = restore_checkpoint(ck_float).variables()
    qat_vars = restore_checkpoint(ck_qat).variables()
    trainer = Trainer(cfg, tc, data)
    rows = {"float": metrics(trainer.evaluate(float_vars, test))}
    variants = [
        ("minmax", {}),
        ("percentile:99.99", {}),
        ("mse", {}),
        ("minmax", {"act_symmetric": True}),
        ("minmax", {"weight_granularity": "tensor"}),
        ("minmax", {"stacked_scales": "variable"}),
    ]
    for method, opts in variants:
        qcfg, ptq_stats = calibrate(
            cfg,
            float_vars["params"],
            data,
            ds.splits.train,
            args.calibrate,
            tc.batch_size,
            method=method,
            options=opts,
        )
        qtrainer = Trainer(qcfg, tc, data)
        ptq_vars = {"params": float_vars["params"], "quant_stats": ptq_stats}
        row = f"PTQ {method}" + "".join(f", {k}={v}" for k, v in opts.items())
        if method == "minmax" and not opts:
            rows[f"{row}, fake-quant"] = metrics(qtrainer.evaluate(ptq_vars, test, "fake"))
        rows[f"{row}, int8"] = {
            **metrics(qtrainer.evaluate(ptq_vars, test, "int8")),
            "int8_weight_bytes": int8_bytes(qcfg, float_vars["params"]),
        }
    qtrainer = Trainer(cfg.override(qat=True), tc, data)
    rows["QAT fake-quant"] = metrics(qtrainer.evaluate(qat_vars, test, "fake"))
    rows["QAT weights, float"] = metrics(qtrainer.evaluate(qat_vars, test, "float"))
    rows["QAT int8"] = metrics(qtrainer.evaluate(qat_vars, test, "int8"))
    ref = rows["float"]["loss"]
    for r in rows.values():
        r["loss_vs_float_pct"] = round(100 * (r["loss"] / ref - 1), 2)
    exp = export_lib.export(ck_qat.path, work / f"{name}_export", log=log)
    return {
        "bars": len(ds.bars),
        "windows": {"train": int(ds.splits.train.size), "test": int(test.size)},
        "float_weights_epoch": ck_float.meta["weights_epoch"],
        "qat_weights_epoch": ck_qat.meta["weights_epoch"],
        "train_s": round(train_s, 1),
        "test": rows,
        "weight_bytes": {"float32": exp["float32_weight_bytes"], "int8": exp["int8_weight_bytes"]},
    }


def int8_bytes(cfg, params) -> int:
    """Bytes of the int8 weights and their scales of ``params`` quantized under ``cfg``."""
    from tftjax.models.compute import quant_spec
    from tftjax.quant.tree import int8_variables

    q = jax.device_get(int8_variables(params, quant_spec(cfg, "int8")))
    return export_lib.nbytes(export_lib.flatten(q["params"], "p")) + export_lib.nbytes(
        export_lib.flatten(q["weight_scale"], "s")
    )


def inference_speed(preset_name: str, batch: int, repeats: int, data, starts) -> dict:
    """Test windows/s of the float model and the int8 path, interleaved passes."""
    cfg = preset(preset_name)
    tc = TrainConfig(eval_batch_size=batch)
    state = create_train_state(cfg.override(qat=True), tc, jax.random.key(0))
    trainer = Trainer(cfg.override(qat=True), tc, data)
    # observers from a few calibration batches, so that the int8 path is well defined
    _, stats = calibrate(cfg, state.params, data, starts, 2, 64)
    v = {"params": state.params, "quant_stats": stats}
    # the variables each path runs with, converted once (int8: int8 kernels and their scales)
    ready = {m: model_variables(trainer.cfg, v, m) for m in ("float", "int8")}
    times: dict[str, list[float]] = {"float": [], "int8": []}
    for mode in times:  # compile
        trainer.evaluate(ready[mode], starts, mode)
    for _ in range(repeats):
        for mode in times:
            t = time.perf_counter()
            trainer.evaluate(ready[mode], starts, mode)
            times[mode].append(time.perf_counter() - t)
    out = {m: round(starts.size / statistics.median(ts), 1) for m, ts in times.items()}
    out["int8_over_float"] = round(out["int8"] / out["float"], 3)
    out["float32_weight_bytes"] = export_lib.nbytes(export_lib.flatten(state.params, "p"))
    out["int8_weight_bytes"] = int8_bytes(trainer.cfg, state.params)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny", choices=["tiny", "tft225"])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--qat-epochs", type=int, default=3)
    ap.add_argument("--qat-lr", type=float, default=3e-4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument(
        "--max-steps",
        type=int,
        default=150,
        help="steps per epoch cap (the synthetic set has ~170k training windows)",
    )
    ap.add_argument("--calibrate", type=int, default=16, help="PTQ calibration batches")
    ap.add_argument("--synthetic-days", type=int, default=180, help="0: skip the synthetic set")
    ap.add_argument("--speed-batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/qat"))
    ap.add_argument(
        "--table",
        type=Path,
        default=Path("experiments/tables/qat_accuracy.md"),
        help="the markdown tables (committed, unlike --out's raw results)",
    )
    args = ap.parse_args()

    results: dict = {"datasets": {}, "speed": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sets = {"es_bundled": default_parquet()}
        if args.synthetic_days:
            syn = work / f"synthetic_{args.synthetic_days}d.parquet"
            write_bars(generate(args.synthetic_days, seed=0), syn)
            sets[f"synthetic_{args.synthetic_days}d"] = syn
        for name, path in sets.items():
            results["datasets"][name] = one_dataset(name, path, args, work)
            write_result(args.out / "qat.json", results, args)  # (what is done so far)
        ds = load_dataset(default_parquet(), preset("tft225").data)
        data, starts = to_device(ds.features), ds.splits.test
        for p in ("tiny", "tft225"):
            results["speed"][p] = inference_speed(p, args.speed_batch, args.repeats, data, starts)
            print(p, results["speed"][p], flush=True)
    write_result(args.out / "qat.json", results, args)
    md = table(results, args)
    args.table.parent.mkdir(parents=True, exist_ok=True)
    args.table.write_text(md + "\n")
    print(md)


def table(results: dict, args) -> str:
    from tftjax.runner.provenance import describe, provenance

    lines = [
        describe(provenance(args)),
        "",
        f"preset {args.preset}; test split; loss vs float in %; int8 bytes: weights and "
        "their scales",
        "",
        "| data | model | test loss | vs float | q-risk P50 | q-risk P90 | int8 bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results["datasets"].items():
        for model, m in r["test"].items():
            b = f"{m['int8_weight_bytes']:,}" if "int8_weight_bytes" in m else ""
            lines.append(
                f"| {name} | {model} | {m['loss']:.4f} | {m['loss_vs_float_pct']:+.2f}% "
                f"| {m['q_risk_50']:.4f} | {m['q_risk_90']:.4f} | {b} |"
            )
    lines += [
        "",
        "| data | float32 weight bytes | int8 weight bytes (+ scales) | ratio |",
        "|---|---|---|---|",
    ]
    for name, r in results["datasets"].items():
        b = r["weight_bytes"]
        lines.append(
            f"| {name} | {b['float32']:,} | {b['int8']:,} | {b['float32'] / b['int8']:.2f}x |"
        )
    lines += [
        "",
        "| preset | float windows/s | int8 windows/s | int8 / float | float32 bytes "
        "| int8 bytes | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for p, s in results["speed"].items():
        lines.append(
            f"| {p} | {s['float']:.0f} | {s['int8']:.0f} | {s['int8_over_float']:.2f} "
            f"| {s['float32_weight_bytes']:,} | {s['int8_weight_bytes']:,} "
            f"| {s['float32_weight_bytes'] / s['int8_weight_bytes']:.2f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
