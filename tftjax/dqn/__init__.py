"""A fully jitted DQN trader (and CartPole agent) with Orbax epoch/final checkpoints.

``python -m tftjax.dqn --epochs 100`` trains on the bundled ES bars; see
:mod:`tftjax.dqn.train` for the jitted trainer, :mod:`tftjax.dqn.loop` for
its part of the shared host loop, :mod:`tftjax.dqn.env` for the environments,
:mod:`tftjax.dqn.agent` for the double-DQN pieces and :mod:`tftjax.dqn.buffer`
for the replay buffer.
"""

from tftjax.dqn.loop import DQNTask, run
from tftjax.dqn.train import DQN, DQNState, make_train

__all__ = ["DQN", "DQNState", "DQNTask", "make_train", "run"]
