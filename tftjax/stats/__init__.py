"""Forecast statistics below the data layer: the pinball loss and q-risk
(:mod:`~tftjax.stats.losses`), volatility models and the anchors
(:mod:`~tftjax.stats.volatility`), the baselines' quantile forecasts
(:mod:`~tftjax.stats.baselines`), the tests (:mod:`~tftjax.stats.scoring`) and a
walk-forward's verdict (:mod:`~tftjax.stats.verdict`). Nothing here reads files or knows a
model: arrays in, numbers out."""
