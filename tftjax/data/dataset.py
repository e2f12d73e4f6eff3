"""Parquet files → a :class:`Dataset` of one or more series: validated bars, time-ordered
splits, features fitted on each series' own training rows (and its ``--anchor``), warnings.

Several series (several files, a long file with a symbol column, ``--dataset spx,nasdaq``)
are split at **global cut times** (:func:`~tftjax.data.windows.global_cuts`: every series'
test period is the same stretch of calendar time; the embargo is counted in each series'
own rows), featurised with **their own statistics** (normalisation, target scale,
winsorisation, statics: from that series' training rows), and laid one after another in
one feature matrix: a window's start is a global row, and every series' window starts
stay inside its own rows, so no window crosses a series. Each series has an index into the
model's instrument vocabulary (static input 0, embedded), which has one more, reserved row
for an instrument it has not seen (``unknown="embed"``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

import numpy as np

from tftjax.config import WARMUP, DataConfig, TFTConfig
from tftjax.data.anchors import with_anchor
from tftjax.data.bars import Bars, read_series
from tftjax.data.bundled import DATASETS, bundled_path, default_parquet
from tftjax.data.calendar import format_interval
from tftjax.data.covariates import (
    Schema,
    SeriesFit,
    drop_windows,
    fit_schema,
    fit_series,
    pooled_fit,
    read_static_file,
    static_values,
)
from tftjax.data.feature_stats import pooled_stats
from tftjax.data.features import FeatureSet, FeatureStats, build_features
from tftjax.data.identity import combined_identity, data_identity
from tftjax.data.panel import check_shared_dates, fold_members
from tftjax.data.quality import series_warnings
from tftjax.data.windows import (
    Splits,
    fold_splits,
    global_cuts,
    make_splits,
    splits_at,
    window_decoder_targets,
)
from tftjax.errors import DataError
from tftjax.stats.baselines import ewma_scale

UNKNOWN_POLICIES = ("refuse", "embed")
"""What evaluation and prediction do with an instrument the model was not trained on:
refuse it (one line naming it), or serve it through the vocabulary's reserved unknown row
(trained by ``--instrument-dropout``) with statistics fitted on its own training rows."""


@dataclasses.dataclass(frozen=True)
class Series:
    """One instrument: its bars, features (with its own statistics) and its own splits."""

    name: str
    bars: Bars
    features: FeatureSet
    splits: Splits  # rows of this series
    index: int = 0
    """Its row in the model's instrument vocabulary (``len(vocab)``: the unknown row)."""
    stats_from: str = "trained"
    """``trained`` (saved with the model, or fitted on its own training rows in training),
    ``own`` (an unseen series served by ``embed``: fitted on its own training rows) or
    ``pooled`` (an unseen series without training rows: the trained series' pooled
    statistics)."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Series laid one after another: global rows, global window starts."""

    series: tuple[Series, ...]
    cfg: DataConfig
    vocab: tuple[str, ...] | None = ()
    """The instrument vocabulary static input 0 indexes; None: a model from before it
    (static input 0 is then the old instrument code, kept in the statistics)."""
    cuts: tuple[int, int] | None = None
    """Global split times (ns) of several series (None: one series split by fractions)."""
    warnings: tuple[str, ...] = ()
    """What passed validation but deserves a word (irregular steps, zero volume, outliers)."""
    absent: tuple[str, ...] = ()
    """Series of the files that sit this walk-forward fold out (too little history before it:
    :mod:`tftjax.data.panel`)."""
    anchor: tuple[str, tuple[float, ...]] | None = None
    """The ``--anchor`` whose forecasts ride on every row, and its quantiles
    (:attr:`tftjax.config.HeadConfig.dataset_anchor`; None: no anchor)."""
    schema: Schema = Schema()
    """Your own columns (:mod:`tftjax.data.covariates`; empty: none)."""

    @classmethod
    def single(
        cls,
        bars: Bars,
        features: FeatureSet,
        splits: Splits,
        cfg: DataConfig,
        warnings: tuple[str, ...] = (),
        name: str | None = None,
    ) -> Dataset:
        name = name or series_name(bars)
        return cls((Series(name, bars, features, splits, 0),), cfg, (name,), None, warnings)

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """``[S+1]``: series ``i`` holds global rows ``offsets[i] .. offsets[i+1]-1``."""
        return np.cumsum([0] + [len(s.bars) for s in self.series]).astype(np.int64)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.series)

    @property
    def bars(self) -> Bars:
        """The bars of a one-series dataset."""
        if len(self.series) != 1:
            raise AttributeError("a dataset of several series has no single bars table")
        return self.series[0].bars

    @functools.cached_property
    def features(self) -> FeatureSet:
        """Every series' features one after another (statics per row; under a vocabulary
        each row's instrument, its vocabulary row, in ``instrument``). Its ``stats`` are the
        first series'; each series' own are ``series[i].features.stats``."""
        parts = [self._features(s) for s in self.series]
        if len(parts) == 1:
            return parts[0]
        cat = lambda name: np.concatenate([getattr(f, name) for f in parts])
        static = np.concatenate(
            [np.broadcast_to(f.static, (len(f), f.static.size)) for f in parts]
        ).astype(np.float32)
        return FeatureSet(
            cat("historical"),
            cat("known"),
            cat("future"),
            static,
            cat("target"),
            parts[0].stats,
            None,
            np.concatenate([ewma_scale(f.target) for f in parts]),
            np.concatenate([window_decoder_targets(f) for f in parts]),
            *((cat("anchor"), cat("anchor_z")) if self.anchor is not None else (None, None)),
            None if self.vocab is None else cat("instrument"),
        )

    def _features(self, s: Series) -> FeatureSet:
        f, c = s.features, self.cfg
        if self.anchor is not None:  # its own bars, scale and training rows (data.anchors)
            name, quantiles = self.anchor
            f = with_anchor(
                f,
                s.bars,
                f.stats.train_rows,
                name,
                quantiles,
                c.decoder_steps,
                c.target == "cumulative",
            )
        if self.vocab is None:  # a model from before vocabularies: its static input 0
            return f
        static = f.static.copy()
        static[0] = 0  # the categorical rides in ``instrument``, never as a float
        return dataclasses.replace(f, static=static, instrument=np.full(len(f), s.index, np.int32))

    @functools.cached_property
    def splits(self) -> Splits:
        """Global window starts of every split (row ranges: the first series')."""
        if len(self.series) == 1:
            return self.series[0].splits
        first = self.series[0].splits

        def cat(name: str) -> np.ndarray:
            return np.concatenate(
                [getattr(s.splits, name) + o for s, o in zip(self.series, self.offsets)]
            ).astype(np.int32)

        return Splits(
            first.train_rows, first.val_rows, first.test_rows, cat("train"), cat("val"), cat("test")
        )

    def series_of(self, rows: np.ndarray) -> np.ndarray:
        """The series index of global rows."""
        return np.searchsorted(self.offsets, np.asarray(rows), side="right") - 1

    @functools.cached_property
    def ts(self) -> np.ndarray:
        return np.concatenate([s.bars.ts for s in self.series])

    @functools.cached_property
    def close(self) -> np.ndarray:
        return np.concatenate([s.bars.close for s in self.series])

    def describe(self) -> str:
        if len(self.series) == 1:
            return f"{len(self.bars):,} bars from {self.bars.path}"
        return (
            f"{len(self.ts):,} bars of {len(self.series)} series ("
            + ", ".join(f"{s.name} {len(s.bars):,}" for s in self.series)
            + ")"
        )

    def identity(self, run_dir: str | os.PathLike | None = None) -> dict:
        """What a run records of its data and checks on resume and evaluate."""
        if len(self.series) == 1:
            return data_identity(self.bars, run_dir)
        return combined_identity([(s.name, s.bars) for s in self.series], run_dir)

    def stats_meta(self) -> dict:
        """What a checkpoint keeps to featurise data as this run did (statistics, vocab, cuts)."""
        stats = [self._features(s).stats for s in self.series]  # with the --anchor's fit
        return {
            "feature_stats": stats[0].to_json(),
            "series": [
                {"name": s.name, "feature_stats": st.to_json()} for s, st in zip(self.series, stats)
            ],
            "vocab": None if self.vocab is None else list(self.vocab),
            "cuts": None if self.cuts is None else list(self.cuts),
            **({"covariates": self.schema.to_json()} if self.schema.columns else {}),
        }


def saved_featurisation(meta: dict) -> dict:
    """:func:`load_dataset`'s keywords that featurise data as the run whose checkpoint (or
    export) metadata is ``meta`` did: every series' statistics, its vocabulary and cut times
    (a one-series run from before vocabularies: its statistics and no vocabulary), and the
    anchor an anchored model's data carries."""
    model = meta.get("identity", meta).get("model")
    anchor = None if model is None else TFTConfig.from_json(model).head.dataset_anchor
    if meta.get("series"):
        return {
            "stats": {
                s["name"]: FeatureStats.from_json(s["feature_stats"]) for s in meta["series"]
            },
            "vocab": None if meta.get("vocab") is None else tuple(meta["vocab"]),
            "cuts": None if meta.get("cuts") is None else tuple(meta["cuts"]),
            "anchor": anchor,
            "schema": Schema.from_json(meta.get("covariates")),
        }
    return {"stats": FeatureStats.from_json(meta["feature_stats"]), "vocab": None, "anchor": anchor}


def series_name(bars: Bars) -> str:
    """A series' name: its symbol in a long file, a bundled set's name, else the file's stem."""
    if bars.symbol is not None:
        return bars.symbol
    p = Path(bars.path)
    mine = {bundled_path(k).resolve(): k for k in DATASETS}
    return mine.get(p.resolve(), p.stem) if bars.sha256 else p.stem


def load_dataset(
    path=None,
    cfg: DataConfig = DataConfig(),
    *,
    stats: FeatureStats | dict[str, FeatureStats] | None = None,
    vocab: tuple[str, ...] | None | str = "own",
    cuts: tuple[int, int] | None = None,
    unknown: str = "refuse",
    instrument: str | None = None,
    need_splits: bool = True,
    fold: tuple[int, int, int] | None = None,
    anchor: tuple[str, tuple[float, ...]] | None = None,
    schema: Schema | None = None,
    future=None,
) -> Dataset:
    """Read ``path`` (one file, or a list of files; default: the bundled ES bars) into
    features and splits.

    Args:
      path: parquet file(s) of OHLCV bars; a long file (symbol column) gives one series per
        symbol.
      cfg: window lengths, split fractions, clock and target options.
      stats: statistics to reuse (e.g. from a checkpoint): one :class:`FeatureStats` (a
        one-series model from before vocabularies), or series name → statistics; fitted on
        each series' training rows when ``None``.
      vocab: the instrument vocabulary (``"own"``: these series' names; None: none, a model
        from before vocabularies).
      cuts: global split times to reuse (several series: computed from their times).
      unknown: a series not in ``stats``: ``refuse`` (DataError) or ``embed`` (its own
        statistics, the vocabulary's unknown row).
      instrument: the name of a one-series file without a symbol column (default its stem).
      need_splits: refuse data too short or outside the time for its splits (False, for
        forecasts: a series with saved statistics then has empty splits).
      fold: a walk-forward fold's ``(val_start, test_start, test_end)`` times
        (:func:`~tftjax.data.windows.walk_forward_times`): its splits and statistics
        fitted on its training rows.
      anchor: an anchored model's ``(anchor, quantiles)``, whose forecasts ride on every row
        (:attr:`tftjax.config.HeadConfig.dataset_anchor`).
      schema: a trained model's columns of your own (None: fitted on these training rows,
        as ``cfg`` names them).
      future: a table of the known columns' values after the bars (a forecast's horizon).

    Raises:
      DataError: bad or too little data, naming the file; an unknown instrument.
    """
    paths = (
        [default_parquet()]
        if path is None
        else (list(path) if isinstance(path, (list, tuple)) else [path])
    )
    # a fold: a short series sits out, and is not refused
    short = (
        None if fold is not None else WARMUP + (cfg.window if need_splits else cfg.encoder_steps)
    )
    not_bars = cfg.target_column if cfg.inputs == "own" else None
    bars, names = read_named(paths, short, instrument, own_columns(cfg, schema), not_bars)
    names = as_the_one_instrument(names, bars, stats, instrument, unknown)
    absent: tuple[str, ...] = ()
    if fold is not None and len(bars) > 1:  # a panel: each series joins where it has data
        members = fold_members(bars, fold, cfg)
        absent = tuple(n for n, m in zip(names, members) if m is None)
        bars = [b for b, m in zip(bars, members) if m is not None]
        names = [n for n, m in zip(names, members) if m is not None]
    if vocab == "own":
        vocab = tuple(names)
    assert not isinstance(vocab, str)
    if len(bars) > 1 and not cfg.bar_interval:  # before any split or feature: one line
        check_intervals(names, [int(np.median(np.diff(b.ts))) for b in bars])
    given = [saved_stats(name, b, stats, unknown, len(bars)) for name, b in zip(names, bars)]
    if (len(bars) > 1 or cuts is not None) and fold is None:
        cuts = cuts or global_cuts([b.ts for b in bars], cfg)
    split = [
        series_splits(
            b,
            own,
            stats,
            cfg,
            fold,
            cuts,
            partial=bool(absent) or len(bars) > 1,
            need_splits=need_splits,
        )
        for b, own in zip(bars, given)
    ]
    schema, fits = own_inputs(cfg, schema, names, bars, split, stats)
    series, warn = [], []
    for name, b, (sp, own, src), fit in zip(names, bars, split, fits):
        mine = None if fit is None else (schema, fit, future)
        features = build_features(b, cfg, train_rows=sp.train_rows, stats=own, own=mine)
        if features.own is not None:  # stale observed values, unscheduled known slots
            sp = without_unknown_inputs(sp, features.own, cfg.encoder_steps)
            warn += list(features.own.notes)
        index = vocab.index(name) if vocab is not None and name in vocab else len(vocab or ())
        series.append(Series(name, b, features, sp, index, src))
        warn += series_warnings(b, features)
    check_intervals([s.name for s in series], [s.features.stats.clock.interval for s in series])
    return Dataset(
        tuple(series),
        cfg,
        vocab,
        cuts if len(bars) > 1 and fold is None else None,
        tuple(warn),
        absent,
        anchor,
        schema,
    )


def own_columns(cfg: DataConfig, schema: Schema | None) -> tuple[str, ...]:
    """The columns of your own to read from the bars files (a model's, or ``cfg``'s; the
    statics only when no --static-file gives them)."""
    named = [(c.name, c.role) for c in schema.columns] if schema is not None else cfg.covariates
    mine = [c for c, role in named if role != "static" or cfg.static_file is None]
    if cfg.target_column != "close" or cfg.inputs == "own":  # the target: a column of yours
        mine = [cfg.target_column] + [c for c in mine if c != cfg.target_column]
    return tuple(mine)


def own_inputs(cfg: DataConfig, schema: Schema | None, names, bars, split, stats=None):
    """``(schema, each series' fit or None)``: a trained model's schema and each series'
    saved fit (a series it never saw: fitted on its own training rows, or the trained
    series' pooled statistics with its own statics), or both fitted on these series'
    training rows. ``stats``: a trained model's statistics by series."""
    if schema is None:
        schema = Schema() if not cfg.covariates else None
    if schema is not None and not schema.columns:
        return schema, [None] * len(bars)
    saved = [
        SeriesFit.from_json(own.covariates) if own is not None else None for _, own, _ in split
    ]
    table = read_static_file(cfg) if any(f is None for f in saved) else None
    statics = [
        f.static if f is not None else static_values(cfg, n, b, table)
        for n, b, f in zip(names, bars, saved)
    ]
    if schema is None:
        rows = [train_block_or_none(sp.train_rows) for sp, _, _ in split]
        fitted = [(n, b, r, st) for n, b, r, st in zip(names, bars, rows, statics) if r]
        if not fitted:
            raise DataError("no series has training rows to fit its columns of your own on")
        schema = fit_schema(cfg, fitted)
    fits = []
    for b, (sp, _, _), st, f in zip(bars, split, statics, saved):
        rows = train_block_or_none(sp.train_rows)
        fits.append(f or (fit_series(schema, b, rows, st) if rows else None))
    trained = [
        f
        for st in (stats.values() if isinstance(stats, dict) else ())
        if (f := SeriesFit.from_json(st.covariates)) is not None
    ]
    trained = trained or [f for f in fits if f is not None]
    fits = [f or pooled_fit(trained, st) for f, st in zip(fits, statics)]
    return schema, fits


def train_block_or_none(rows: tuple[int, int]) -> tuple[int, int] | None:
    a, b = max(rows[0], WARMUP), rows[1]
    return (a, b) if b - a >= 2 else None


def without_unknown_inputs(sp: Splits, own, encoder_steps: int) -> Splits:
    """A series' splits without the windows that hold a stale observed value or need an
    unscheduled known one (:func:`~tftjax.data.covariates.drop_windows`)."""
    cut = lambda starts: drop_windows(starts, own, encoder_steps)
    return dataclasses.replace(sp, train=cut(sp.train), val=cut(sp.val), test=cut(sp.test))


def read_named(
    paths: list,
    min_rows: int | None,
    instrument: str | None,
    columns: tuple[str, ...] = (),
    target: str | None = None,
):
    """Every series of ``paths`` and its name (``instrument`` names a one-series file).

    Raises:
      DataError: two series of one name, ``instrument`` for a file of several, or series
        whose dates disagree.
    """
    bars = [
        b for p in paths for b in read_series(p, min_rows=min_rows, columns=columns, target=target)
    ]
    names = [series_name(b) for b in bars]
    if instrument is not None:
        if len(bars) != 1 or bars[0].symbol is not None:
            raise DataError(
                f"--instrument {instrument}: names the one series of a file without a symbol column"
            )
        names = [instrument]
    if len(set(names)) < len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DataError(
            f"two series are named {dup!r} ({', '.join(b.path for b in bars)}): rename one file"
        )
    check_shared_dates(bars, names)
    return bars, names


def as_the_one_instrument(names: list[str], bars: list, stats, instrument, unknown: str):
    """A one-instrument model asked on one in-memory table without a symbol column (it names
    nothing, where a file's stem names its series): that series is the model's instrument.
    Named (``instrument``) or served as unknown (``embed``): as asked. A file of another
    name is still refused (its statistics would be another instrument's)."""
    from tftjax.data.sources import TABLE

    one = isinstance(stats, dict) and len(stats) == 1
    nameless = len(bars) == 1 and bars[0].symbol is None and bars[0].path == TABLE
    if one and nameless and instrument is None and unknown != "embed":
        return list(stats)
    return names


def check_intervals(names: list[str], intervals: list[int]) -> None:
    """Refuse series of different bar intervals in one run (one line naming each)."""
    if len(set(intervals)) > 1:
        raise DataError(
            "series of different bar intervals in one run: "
            + ", ".join(f"{n} {format_interval(i)}" for n, i in zip(names, intervals))
            + "; train one model per bar interval"
        )


def saved_stats(name: str, bars: Bars, stats, unknown: str, n_series: int):
    """Series ``name``'s saved statistics (None: fitted on its own training rows).

    Raises:
      DataError: an instrument the model does not know (unless ``unknown`` is ``embed``),
        or several series for a model from before vocabularies.
    """
    if isinstance(stats, dict):
        own = stats.get(name)
        if own is None and unknown != "embed":
            raise DataError(
                f"{bars.path}: instrument {name!r} is not one the model was trained "
                f"on ({', '.join(stats)}): name it with --instrument if it is one of "
                "them, or serve it with --unknown-instrument embed"
            )
        return own
    if stats is not None and n_series > 1:
        raise DataError(
            f"{bars.path}: this model was trained on one series (before "
            "instrument vocabularies): give it one"
        )
    return stats


def series_splits(
    b: Bars, own, stats, cfg: DataConfig, fold, cuts, *, partial: bool, need_splits: bool
):
    """``(splits, statistics, source)`` of one series: split by the fold, the global cut
    times, or its own fractions; ``source`` says where its statistics come from (``trained``,
    ``own``, or ``pooled`` for a new listing with no training rows before the cut)."""
    source = "trained" if own is not None or not isinstance(stats, dict) else "own"
    try:
        if fold is not None:
            sp = fold_splits(b.ts, fold, cfg, source=b.path, partial=partial)
        elif cuts is not None:
            sp = splits_at(b.ts, cuts, cfg, source=b.path)
        else:
            sp = make_splits(len(b), cfg, source=str(b.path))
    except DataError:
        if need_splits or (own is None and not isinstance(stats, dict)):
            raise
        sp = no_splits()
    if source == "own" and sp.train_rows[1] <= sp.train_rows[0]:
        return sp, pooled_stats(list(stats.values())), "pooled"
    return sp, own, source


def no_splits() -> Splits:
    empty = np.zeros(0, np.int32)
    return Splits((0, 0), (0, 0), (0, 0), empty, empty, empty)
