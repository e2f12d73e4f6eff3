"""How long 10,000 forecast origins of TFT-225 take: featurising, compiling, the batched pass.

    python experiments/forecast_speed.py [--dataset btc] [--origins 10000] [--preset tft225]

The model is TFT-225 with its initial weights (a forecast's cost does not depend on what
the weights learnt), its statistics fitted on the bundled BTC hourly bars (20,111 bars,
enough for 10,000 origins), saved as a run would save them. The call timed is the one
``python -m tftjax.predict --origins 10000`` makes (:func:`tftjax.serving.forecast.forecast`), twice
in one process: the first pays the eval step's compile, the second does not. Its parts:
reading and featurising the file, and the batched pass over every origin.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="btc")
    ap.add_argument("--calendar", default="24/7")
    ap.add_argument("--origins", type=int, default=10_000)
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--out", default="experiments/results/forecast_speed.json")
    a = ap.parse_args()

    import jax

    from tftjax.config import TrainConfig, preset
    from tftjax.data import bundled_path, load_dataset
    from tftjax.models.tft import init_variables
    from tftjax.runner.provenance import write_result
    from tftjax.serving.forecast import forecast
    from tftjax.training import SavedModel

    cfg = preset(a.preset)
    cfg = cfg.override(calendar=a.calendar)
    path = bundled_path(a.dataset)
    t0 = time.perf_counter()
    ds = load_dataset(path, cfg.data)
    featurise = time.perf_counter() - t0
    meta = ds.stats_meta()
    from tftjax.data import saved_featurisation

    saved = SavedModel(
        cfg,
        TrainConfig(),
        init_variables(cfg, jax.random.key(0)),
        ds.series[0].features.stats,
        ds.identity(),
        Path("."),
        "initial weights",
        Path("."),
        None,
        f"TFT {a.preset} (initial weights)",
        featurisation=saved_featurisation(meta),
    )
    runs = []
    for attempt in ("first call (compiles)", "second call"):
        t0 = time.perf_counter()
        f = forecast(saved, path, origins=str(a.origins))
        wall = time.perf_counter() - t0
        runs.append(
            {
                "call": attempt,
                "origins": int(f.rows.size),
                "wall_s": round(wall, 2),
                "origins_per_s": round(f.rows.size / wall, 1),
            }
        )
        print(
            f"{attempt}: {f.rows.size:,} origins of {a.preset} in {wall:.1f} s "
            f"({f.rows.size / wall:,.0f} origins/s)"
        )
    print(f"featurising {len(ds.bars):,} bars alone: {featurise:.1f} s")
    write_result(
        a.out,
        {
            "runs": runs,
            "featurise_s": round(featurise, 2),
            "bars": len(ds.bars),
            "preset": a.preset,
        },
        vars(a),
    )


if __name__ == "__main__":
    main()
