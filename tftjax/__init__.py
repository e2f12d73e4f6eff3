"""tftjax: Temporal Fusion Transformers and DQN traders on market bars, in JAX/Flax."""

__version__ = "0.1.0"
