"""A forecast as ``python -m tftjax.predict`` shows it: each series' last origin as a
Markdown table on the terminal, and its quantile fan as a PNG."""

from __future__ import annotations

from pathlib import Path


def _fmt(ns, zone) -> str:
    """A time of the forecast table to the minute, in ``zone`` (naive where it has none)."""
    import numpy as np
    import pyarrow as pa

    if zone is None:
        return str(np.datetime64(int(ns), "ns").astype("datetime64[m]"))
    return pa.scalar(int(ns), pa.timestamp("ns", tz=zone)).as_py().isoformat(timespec="minutes")


def print_last(f, cfg) -> list[int]:
    """Print each series' last origin's table; the rows of those origins' first step."""
    import numpy as np

    t, d = f.table, cfg.data.decoder_steps
    qs = [k for k in t if k.startswith("q")]
    what = "k-bar log ret" if cfg.data.target == "cumulative" else "log ret"
    firsts = []
    for name in dict.fromkeys(t["instrument"].tolist()):
        i0 = int(np.flatnonzero(t["instrument"] == name)[-1]) - d + 1
        firsts.append(i0)
        print(
            f"{name}: from the bar of {_fmt(t['origin_time'][i0], f.zone)} "
            f"(close {t['close_at_origin'][i0]:.6g}; times {f.meta['time_zone']})"
        )
        print("| bar | time | " + " | ".join(f"{k} ({what})" for k in qs) + " |")
        print("|---|---|" + "---|" * len(qs))
        for i in range(i0, i0 + d):
            print(
                f"| {t['horizon'][i]} | {_fmt(t['target_time'][i], f.zone)} | "
                + " | ".join(f"{t[k][i]:+.5f}" for k in qs)
                + " |"
            )
    return firsts


def plot(path: Path, f, cfg, firsts: list[int]) -> None:
    """The quantile fans of the origins whose first rows are ``firsts`` (:func:`print_last`),
    each with its encoder history and, where known, the realised path, as a PNG at ``path``."""
    import numpy as np

    from tftjax.plots import quantile_fan

    ds, t, d, e = f.dataset, f.table, cfg.data.decoder_steps, cfg.data.encoder_steps
    k = [i // d for i in firsts]  # the origins of those rows
    starts = f.starts[k]
    scale = np.array([ds.series[j].features.stats.target_scale for j in ds.series_of(f.rows[k])])[
        :, None
    ]
    hist = ds.features.target[starts[:, None] + np.arange(e)] * scale
    real = t["realised"].reshape(-1, d)[k]
    titles = [
        f"{t['instrument'][i]}: from the bar of {_fmt(t['origin_time'][i], f.zone)}" for i in firsts
    ]
    quantile_fan(
        path,
        hist,
        real,
        f.pred[k] * scale[:, :, None],
        cfg.head.quantiles,
        titles,
        ylabel="log return",
    )
