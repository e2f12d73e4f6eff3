"""Forecast skill on real bars: the TFT (several seeds, two presets) against every baseline.

    pip install -e ".[experiments]"      # exchange_calendars, arch (GARCH)
    python experiments/forecast_skill.py [--datasets spx,btc,es] [--presets small,tft225]
        [--seeds 3] [--epochs 6] [--max-steps 60] [--bootstrap 1000] [--hygiene all|none|...]
        [--variants none,vol,forget,...] [--out experiments/results/forecast_skill]

For each bundled set (with its exchange calendar: ES → XCME, S&P 500 → XNYS,
BTC → 24/7), each preset and each seed, a TFT is trained with the usual loop
(early stopping on validation loss, the best epoch's weights) and its test
forecasts are scored beside every baseline on the same test windows:
zero, training quantiles, rolling quantiles, EWMA (RiskMetrics) with Gaussian
and with empirical residual quantiles (``tftjax.stats.baselines``) and GARCH(1,1)
with Gaussian quantiles (``arch``; parameters fitted on the training rows
only, variance forecasts per horizon for every test origin).

Metrics: mean pinball loss, q-risk P50 and P90, coverage of the 10–90% band.
95% intervals: a moving-block bootstrap over test windows (blocks of
``--block`` consecutive windows, default twice the window length, since
neighbouring windows overlap). The TFT row is the mean over seeds of each
window's metric sums (the interval covers window sampling, not seed spread;
the seeds' own range is in the JSON). Beside it, a paired bootstrap of the TFT's
P90 q-risk minus the best baseline's on the same resampled windows.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np

from tftjax.config import TrainConfig, preset
from tftjax.data import bundled_path, load_dataset, to_device
from tftjax.runner.provenance import write_result
from tftjax.stats import baselines, losses
from tftjax.stats.scoring import from_sums, window_sums
from tftjax.training import (
    Trainer,
    open_checkpoint,
    restore_checkpoint,
    train_and_evaluate,
    window_targets,
)

CALENDARS = {"es": "XCME", "spx": "XNYS", "btc": "24/7"}
HYGIENE = ("forget", "nodecay", "cosine", "monotone")
"""--hygiene items: LSTM forget-gate bias 1; no weight decay on LayerNorms, biases and
embeddings; linear warm-up (5% of the steps) and cosine decay; non-crossing quantiles."""
ITEMS = HYGIENE + ("vol",)
"""Items of a --variants entry: the hygiene items and ``vol``, the volatility-style target
(``--vol-target``: returns in units of the EWMA volatility at the forecast time)."""


def parse_variant(text: str) -> tuple[str, ...]:
    """``none``, ``all`` (the four hygiene items) or items joined by ``+`` (``all+vol``)."""
    items: list[str] = []
    for part in text.split("+"):
        items += {"none": [], "all": list(HYGIENE)}.get(part, [part])
    if bad := set(items) - set(ITEMS):
        raise SystemExit(
            f"forecast_skill.py: unknown variant item {', '.join(sorted(bad))} "
            f"(known: none, all, {', '.join(ITEMS)})"
        )
    return tuple(i for i in ITEMS if i in items)


def with_hygiene(cfg, tc, items, total_steps):
    # forget bias 1 is the library's default since this comparison: set it either way
    cfg = cfg.override(lstm_forget_bias=1.0 if "forget" in items else 0.0)
    if "monotone" in items:
        cfg = cfg.override(monotone_quantiles=True)
    if "vol" in items:
        cfg = cfg.override(vol_target=True)
    if "nodecay" in items:
        tc = dataclasses.replace(tc, decay_all=False)
    if "cosine" in items:
        tc = dataclasses.replace(tc, lr_schedule="cosine", warmup_steps=max(total_steps // 20, 1))
    return cfg, tc


METRICS = ("loss", "q_risk_50", "q_risk_90", "coverage_80")


def garch_forecasts(
    target: np.ndarray, origins: np.ndarray, horizon: int, quantiles, train_rows: tuple[int, int]
) -> np.ndarray:
    """GARCH(1,1), zero mean, Gaussian: ``[N, horizon, Q]`` quantiles from variance forecasts
    made at each origin with parameters fitted on the training rows."""
    from arch import arch_model
    from scipy.stats import norm

    y = np.asarray(target, np.float64)
    a, b = train_rows
    model = arch_model(y[a:], mean="Zero", vol="GARCH", p=1, q=1, dist="normal", rescale=False)
    res = model.fit(last_obs=b - a, disp="off")
    first = int(origins.min()) - a
    f = res.forecast(horizon=horizon, start=first, reindex=False)
    var = f.variance.to_numpy()  # row i: forecasts made at index first + i (of y[a:])
    v = var[origins - a - first]  # [N, horizon]
    return np.sqrt(v)[..., None] * norm.ppf(np.asarray(quantiles))[None, None, :]


def bootstrap(s: np.ndarray, reps: int, block: int, seed: int = 0) -> dict:
    """Moving-block bootstrap 95% intervals of every metric from per-window sums."""
    n = s.shape[0]
    block = max(1, min(block, n))
    rng = np.random.default_rng(seed)
    nb = -(-n // block)
    starts = rng.integers(0, n - block + 1, size=(reps, nb))
    idx = (starts[..., None] + np.arange(block)).reshape(reps, -1)[:, :n]
    m = from_sums(s[idx])
    return {k: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for k, v in m.items()}


def paired_delta(a: np.ndarray, b: np.ndarray, reps: int, block: int, seed: int = 0) -> dict:
    """95% interval of metric(a) - metric(b) on the same resampled windows (a paired
    moving-block bootstrap: sharper than comparing two separate intervals)."""
    n = a.shape[0]
    block = max(1, min(block, n))
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n - block + 1, size=(reps, -(-n // block)))
    idx = (starts[..., None] + np.arange(block)).reshape(reps, -1)[:, :n]
    ma, mb = from_sums(a[idx]), from_sums(b[idx])
    full = {k: float(from_sums(a)[k] - from_sums(b)[k]) for k in ("loss", "q_risk_90")}
    return {
        k: (
            full[k],
            float(np.percentile(ma[k] - mb[k], 2.5)),
            float(np.percentile(ma[k] - mb[k], 97.5)),
        )
        for k in full
    }


def run_dataset(name: str, args, work: Path, log) -> dict:
    parquet = bundled_path(name)
    out: dict = {"presets": {}, "baselines": {}}
    ds, tft_sums, base_sums = None, {}, {}
    for pname, variant in itertools.product(args.presets, args.variants):
        key = pname if len(args.variants) == 1 else f"{pname} [{variant}]"
        items = parse_variant(variant)
        per_seed = []
        for seed in range(args.seeds):
            cfg = preset(pname, calendar=CALENDARS[name], remat=args.remat)
            tc = TrainConfig(
                epochs=args.epochs,
                batch_size=args.batch_size,
                patience=args.patience,
                seed=seed,
                max_steps_per_epoch=args.max_steps,
                eval_batch_size=512,
            )
            cfg, tc = with_hygiene(cfg, tc, items, args.epochs * args.max_steps)
            run = work / f"{name}_{pname}_{'_'.join(items) or 'none'}_{seed}"
            t0 = time.perf_counter()
            train_and_evaluate(cfg, tc, run, data=parquet, progress=False, log=lambda *a: None)
            ck = open_checkpoint(run)
            if ds is None or ds.cfg != cfg.data:
                ds = load_dataset(parquet, cfg.data)
            variables = restore_checkpoint(ck).variables()
            pred, _ = Trainer(cfg, tc, to_device(ds.features)).predict(variables, ds.splits.test)
            y = window_targets(ds, ds.splits.test)
            per_seed.append(window_sums(y, pred, cfg.head.quantiles))
            log(
                f"{key} seed {seed}: epoch {ck.meta['weights_epoch']}, "
                f"{time.perf_counter() - t0:.0f} s, test {from_sums(per_seed[-1])}"
            )
        sums = np.mean(per_seed, axis=0)
        tft_sums[key] = sums
        seeds = [from_sums(s) for s in per_seed]
        out["presets"][key] = {
            "preset": pname,
            "variant": list(items),
            "metrics": {k: float(v) for k, v in from_sums(sums).items()},
            "ci95": bootstrap(sums, args.bootstrap, args.block or 2 * cfg.data.window),
            "seed_range": {
                k: (min(float(m[k]) for m in seeds), max(float(m[k]) for m in seeds))
                for k in METRICS
            },
            "windows": {"train": int(ds.splits.train.size), "test": int(ds.splits.test.size)},
        }
        ref = f"{pname} [{args.variants[0]}]"
        if key != pname and key != ref:  # paired: this variant minus the first one
            out["presets"][key]["vs_first_variant"] = {
                "variant": args.variants[0],
                **paired_delta(
                    sums, tft_sums[ref], args.bootstrap, args.block or 2 * cfg.data.window
                ),
            }
    # baselines, on the last preset's windows (the same test windows when E, D agree)
    cfg = preset(args.presets[-1], calendar=CALENDARS[name])
    ds = load_dataset(parquet, cfg.data)
    starts, origins = ds.splits.test, ds.splits.test + cfg.data.encoder_steps - 1
    y = window_targets(ds, starts)
    preds = baselines.forecasts(
        ds.features.target,
        origins,
        cfg.data.decoder_steps,
        cfg.head.quantiles,
        ds.splits.train_rows,
    )
    try:
        preds["garch"] = garch_forecasts(
            ds.features.target,
            origins,
            cfg.data.decoder_steps,
            cfg.head.quantiles,
            ds.splits.train_rows,
        )
    except ImportError:
        log("arch is not installed: no GARCH baseline (pip install -e '.[experiments]')")
    for k, p in preds.items():
        s = base_sums[k] = window_sums(y, p, cfg.head.quantiles)
        out["baselines"][k] = {
            "metrics": {m: float(v) for m, v in from_sums(s).items()},
            "ci95": bootstrap(s, args.bootstrap, args.block or 2 * cfg.data.window),
        }
        check = losses.numpy_metrics(y, p, cfg.head.quantiles)  # the library's own metric code
        assert abs(check["loss"] - out["baselines"][k]["metrics"]["loss"]) < 1e-9
    best = min(out["baselines"], key=lambda k: out["baselines"][k]["metrics"]["q_risk_90"])
    for pname, sums in tft_sums.items():
        if sums.shape == base_sums[best].shape:
            out["presets"][pname]["vs_best_baseline"] = {
                "baseline": best,
                **paired_delta(
                    sums, base_sums[best], args.bootstrap, args.block or 2 * cfg.data.window
                ),
            }
    np.savez(
        args.out / f"{name}_window_sums.npz",
        **{f"tft_{k}": v for k, v in tft_sums.items()},
        **{f"baseline_{k}": v for k, v in base_sums.items()},
    )
    out["bars"], out["calendar"] = len(ds.bars), CALENDARS[name]
    return out


NAMES = {**baselines.NAMES, "garch": "GARCH(1,1), Gaussian"}


def table(results: dict) -> str:
    head = (
        "| data | forecaster | loss | q-risk P50 | q-risk P90 (95% CI) | cover 10–90 |\n"
        "|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, r in results["datasets"].items():
        n = len(results["seeds"])
        seeds = f"{n} seed" + ("s" if n > 1 else "")
        rows = [(f"**TFT {p}** ({seeds})", v) for p, v in r["presets"].items()]
        rows += [(NAMES[k], v) for k, v in r["baselines"].items()]
        best = min(v["metrics"]["q_risk_90"] for v in r["baselines"].values())
        for label, v in rows:
            m, ci = v["metrics"], v["ci95"]
            mark = (
                " ◀ best baseline"
                if v in r["baselines"].values() and m["q_risk_90"] == best
                else ""
            )
            if "vs_best_baseline" in v:
                d = v["vs_best_baseline"]["q_risk_90"]
                mark += f" (P90 minus best: {d[0]:+.4f}, 95% CI {d[1]:+.4f} to {d[2]:+.4f})"
            if "vs_first_variant" in v:
                d = v["vs_first_variant"]["q_risk_90"]
                mark += (
                    f" (P90 minus [{v['vs_first_variant']['variant']}]: {d[0]:+.4f}, "
                    f"95% CI {d[1]:+.4f} to {d[2]:+.4f})"
                )
            lines.append(
                f"| {name} | {label}{mark} | {m['loss']:.4f} | {m['q_risk_50']:.4f} | "
                f"{m['q_risk_90']:.4f} ({ci['q_risk_90'][0]:.4f}–{ci['q_risk_90'][1]:.4f})"
                f" | {m['coverage_80']:.3f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="spx,btc,es")
    ap.add_argument("--presets", default="small,tft225")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-steps", type=int, default=60, help="steps per epoch cap")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--block", type=int, default=0, help="bootstrap block (0: 2 windows)")
    ap.add_argument("--remat", default="full", help="remat tier (full: the fastest on CPU)")
    ap.add_argument(
        "--hygiene",
        default="forget,cosine",
        help=f"training hygiene: all, none, or a comma list of {', '.join(HYGIENE)} "
        "(default: the two that helped on both S&P daily and BTC hourly)",
    )
    ap.add_argument(
        "--variants",
        default="",
        help="compare TFT variants (overrides --hygiene): a comma list, each none, "
        f"all, or items joined by + ({', '.join(ITEMS)}; vol: the "
        "volatility-style target), e.g. none,forget,cosine,vol,all+vol; each "
        "is scored against the first with a paired bootstrap",
    )
    ap.add_argument("--out", type=Path, default=Path("experiments/results/forecast_skill"))
    args = ap.parse_args()
    args.presets = args.presets.split(",")
    hygiene = (
        HYGIENE
        if args.hygiene == "all"
        else ()
        if args.hygiene == "none"
        else tuple(args.hygiene.split(","))
    )
    if bad := set(hygiene) - set(HYGIENE):
        ap.error(f"--hygiene: unknown {', '.join(sorted(bad))}")
    args.hygiene = list(hygiene)
    args.variants = args.variants.split(",") if args.variants else ["+".join(hygiene) or "none"]
    seen: dict[tuple, str] = {}
    for v in args.variants:  # two spellings of one variant would share a run folder
        if (items := parse_variant(v)) in seen:
            ap.error(f"--variants: {v!r} is the same variant as {seen[items]!r}")
        seen[items] = v
    results: dict = {
        "datasets": {},
        "seeds": list(range(args.seeds)),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
    }
    results["settings"]["out"] = str(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            log = lambda *a, n=name: print(f"[{n}]", *a, flush=True)
            results["datasets"][name] = run_dataset(name, args, Path(tmp), log)
            print(table({**results, "datasets": {name: results["datasets"][name]}}), flush=True)
    text = table(results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text + "\n")
    write_result(args.out / "forecast_skill.json", results)
    print(f"written: {args.out}/forecast_skill.json, table.md")


if __name__ == "__main__":
    main()
