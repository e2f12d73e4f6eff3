"""Quantization: int8 fake-quant as a straight-through ``custom_vjp`` and its observers
(:mod:`~tftjax.quant.core`), the quantized parameter trees (:mod:`~tftjax.quant.tree`), what a
calibration batch records (:mod:`~tftjax.quant.calib`), and post-training calibration of a
float model (:mod:`~tftjax.quant.ptq`)."""
