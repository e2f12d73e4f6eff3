"""Kernels that replace XLA's code for one block each: the fused per-variable GRN (CPU,
:mod:`~tftjax.models.kernels.fused`) and the Pallas/Triton kernels for NVIDIA GPUs (VSNs,
LSTMs, GRNs and gates, attention, the optimizer step), with what they share. How a family
runs is a :class:`~tftjax.models.kernels.mode.KernelMode`; the layers choose it."""
