"""The bundled bar sets (``--dataset``): where they are in this installation, and the
larger panels kept in the repository's ``data/`` folder (not in the wheel).

Sources and licences: ``SOURCES.md`` beside them, and ``data/SOURCES.md``."""

from __future__ import annotations

import os
from pathlib import Path

DATASETS = {
    "es": "es_1min_2013-09.parquet",
    "spx": "spx_daily_1999-2018.parquet",
    "nasdaq": "nasdaq_daily_1999-2018.parquet",
    "btc": "btcusd_1h_2017-2019.parquet",
}
"""ES 1-minute futures bars, S&P 500 and NASDAQ Composite daily, BTC/USD hourly, by
``--dataset`` name."""


PANELS = {
    "us-daily": "lean_us_daily_1998-2021.parquet",
}
"""Panels by ``--dataset`` name, kept in the repository's ``data/`` folder: ``us-daily`` is 12
US stocks and ETFs, daily, 1998-2021, split and dividend adjusted (a long file with a
``symbol`` column; series start between 1998 and 2014)."""


def data_dir() -> Path:
    """The folder of the panels: ``$TFTJAX_DATA_DIR``, else ``data/`` of the repository this
    package runs from."""
    env = os.environ.get("TFTJAX_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "data"


def bundled_path(name: str) -> Path:
    """Path of a bundled data set or a panel by name (:data:`DATASETS`, :data:`PANELS`).

    Raises:
      ConfigError: not a known name, or a panel this installation does not have.
    """
    from tftjax.errors import ConfigError

    if name in PANELS:
        path = data_dir() / PANELS[name]
        if not path.is_file():
            raise ConfigError(
                f"--dataset {name}: {PANELS[name]} is kept in the repository's data/ folder, "
                f"not in the installed package, and is not at {path}: run from a clone of "
                "tftjax, or set TFTJAX_DATA_DIR to the folder that holds it"
            )
        return path
    if name not in DATASETS:
        raise ConfigError(
            f"--dataset {name!r} is not bundled; choose one of: "
            f"{', '.join((*DATASETS, *PANELS))} (or pass --parquet-file)"
        )
    return Path(__file__).resolve().parent / DATASETS[name]


def default_parquet() -> Path:
    """Path of the bundled ES 1-minute bars (the default data of every trainer)."""
    return bundled_path("es")
