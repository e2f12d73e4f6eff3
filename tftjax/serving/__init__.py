"""Trained TFTs put to use: any saved model as one record (:mod:`~tftjax.serving.saved`),
forecasts from chosen origins (:mod:`~tftjax.serving.forecast`) and their table
(:mod:`~tftjax.serving.table`), the Python API (:mod:`~tftjax.serving.api`), and the
safetensors export (:mod:`~tftjax.serving.export`, :mod:`~tftjax.serving.int8`)."""
