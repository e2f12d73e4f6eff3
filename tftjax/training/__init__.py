"""Training and evaluating the TFT, one job per module, in the order a run uses them:

========================  ==============================================================
``state``                 the train state (params, optimizer, QAT observers), the optimizer
``steps``                 the jitted train and eval steps, accumulation, mesh shardings
``trainer``               config + device data + compiled steps: train, evaluate, predict
``restore``               open and restore checkpoints, ``--init-from``, :class:`SavedModel`
``ptq``                   post-training calibration of the int8 activation ranges
``evaluation``            metrics beside the baselines, the summary table
``task``                  the TFT's part of the shared run loop (:mod:`tftjax.runner.loop`)
``run``                   :func:`train_and_evaluate`, the whole job
========================  ==============================================================

Nothing here imports the exporter or a CLI: :mod:`tftjax.export` and the CLIs stand above.
"""

from tftjax.errors import TrainingDiverged
from tftjax.quant.ptq import calibrate
from tftjax.training.evaluation import (
    baselines,
    evaluate_model,
    format_summary,
    summarize,
    window_targets,
)
from tftjax.training.optimizer import make_optimizer
from tftjax.training.restore import (
    Checkpoint,
    SavedModel,
    initial_weights,
    load_checkpoint,
    open_checkpoint,
    restore_checkpoint,
)
from tftjax.training.run import train_and_evaluate
from tftjax.training.state import TrainState, create_train_state
from tftjax.training.steps import make_eval_step, make_train_step
from tftjax.training.task import TFTTask
from tftjax.training.trainer import Trainer, leaf_differences, model_variables, train_epochs

__all__ = [
    "Checkpoint",
    "SavedModel",
    "TFTTask",
    "TrainState",
    "Trainer",
    "TrainingDiverged",
    "calibrate",
    "create_train_state",
    "evaluate_model",
    "format_summary",
    "initial_weights",
    "leaf_differences",
    "load_checkpoint",
    "make_eval_step",
    "make_optimizer",
    "make_train_step",
    "model_variables",
    "open_checkpoint",
    "restore_checkpoint",
    "summarize",
    "train_and_evaluate",
    "train_epochs",
    "baselines",
    "window_targets",
]
