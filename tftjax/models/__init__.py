"""The Temporal Fusion Transformer (:mod:`~tftjax.models.tft`), its layers, its remat tiers and
compute precision; the kernels that replace XLA's code for some blocks live in
:mod:`tftjax.models.kernels`."""
