"""What runs a trainer, whatever it trains: the host loop with its early stop and NaN stop
(:mod:`~tftjax.runner.loop`), Orbax checkpoints (:mod:`~tftjax.runner.checkpoints`), what a
resume may change (:mod:`~tftjax.runner.resume`), TensorBoard logs
(:mod:`~tftjax.runner.tensorboard`), provenance (:mod:`~tftjax.runner.provenance`), the
devices' memory (:mod:`~tftjax.runner.devices`) and the data-parallel mesh
(:mod:`~tftjax.runner.mesh`)."""
