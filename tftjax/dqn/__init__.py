"""A fully jitted DQN trader (and CartPole agent) with Orbax epoch/final checkpoints.

``python -m tftjax.dqn --epochs 100`` trains on the bundled ES bars; see
:mod:`tftjax.dqn.train` for the loop, :mod:`tftjax.dqn.env` for the
environments, :mod:`tftjax.dqn.agent` for the double-DQN pieces and
:mod:`tftjax.dqn.buffer` for the replay buffer.
"""

from tftjax.dqn.train import DQN, DQNState, ConfigError, TrainingDiverged, make_train, run

__all__ = ["DQN", "DQNState", "ConfigError", "TrainingDiverged", "make_train", "run"]
