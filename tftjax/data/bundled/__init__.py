"""The bundled bar sets (``--dataset``): where they are in this installation.

Sources and licences: ``SOURCES.md`` beside them."""

from __future__ import annotations

from pathlib import Path

DATASETS = {
    "es": "es_1min_2013-09.parquet",
    "spx": "spx_daily_1999-2018.parquet",
    "nasdaq": "nasdaq_daily_1999-2018.parquet",
    "btc": "btcusd_1h_2017-2019.parquet",
}
"""ES 1-minute futures bars, S&P 500 and NASDAQ Composite daily, BTC/USD hourly, by
``--dataset`` name."""


def bundled_path(name: str) -> Path:
    """Path of a bundled data set by name (:data:`DATASETS`).

    Raises:
      ConfigError: not a bundled name.
    """
    if name not in DATASETS:
        from tftjax.errors import ConfigError

        raise ConfigError(f"--dataset {name!r} is not bundled; choose one of: "
                          f"{', '.join(DATASETS)} (or pass --parquet-file)")
    return Path(__file__).resolve().parent / DATASETS[name]


def default_parquet() -> Path:
    """Path of the bundled ES 1-minute bars (the default data of every trainer)."""
    return bundled_path("es")
