"""How often the historical inputs hit the ±10 z clip on the test rows, per normalisation.

    python experiments/clip_rate.py --dataset es --calendar XCME [--family dhigh]

The one-series split of ``python -m tftjax.train`` (its test rows), the ``small`` preset's
windows, each ``--normalise`` (the training rows' scale, expanding, rolling): the share of
test rows clipped in each look-back of one family, and over all 210 inputs.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="es")
    ap.add_argument("--calendar", default=None)
    ap.add_argument("--family", default="dhigh")
    ap.add_argument("--features", default="v1")
    a = ap.parse_args()
    from tftjax.config import preset
    from tftjax.data import bundled_path, load_dataset
    from tftjax.data.features import CLIP, historical_names

    names = historical_names(a.features)
    cols = [i for i, n in enumerate(names) if n.split("_")[0] == a.family]
    print(
        f"| --normalise | {a.family} clipped, by look-back ({', '.join(names[i].split('_')[1] for i in cols)}) | all 210 inputs |"
    )
    print("|---|---|---|")
    for how in ("train", "expanding", "rolling"):
        cfg = dataclasses.replace(
            preset("small").data, normalise=how, calendar=a.calendar, features=a.features
        )
        ds = load_dataset(bundled_path(a.dataset), cfg)
        lo, hi = ds.splits.test_rows
        h = np.abs(ds.features.historical[lo:hi]) >= CLIP
        print(
            f"| {how} | {', '.join(f'{100 * x:.1f}%' for x in h[:, cols].mean(axis=0))} | "
            f"{100 * h.mean():.2f}% |"
        )


if __name__ == "__main__":
    main()
