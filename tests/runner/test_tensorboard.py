"""TensorBoard logs (issue 40): a tiny train run writes the listed scalars, read back with
tensorboardX's own protos; ``--no-tensorboard`` writes none."""

import pytest

from tftjax.runner.tensorboard import read_scalars, tag

GROUP = pytest.mark.xdist_group("runloop_base")  # the tiny runs' compiled steps


def test_tags_group_metrics_by_split():
    assert [tag(k) for k in ("train_loss", "val_q_risk_90", "samples_per_s", "epsilon")] == [
        "train/loss",
        "val/q_risk_90",
        "run/samples_per_s",
        "run/epsilon",
    ]


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_a_tiny_run_writes_its_scalars_and_config(predict_run):
    logdir = predict_run / "run" / "tensorboard"
    scalars = read_scalars(logdir)
    for t in (
        "train/loss",
        "val/loss",
        "val/q_risk_50",
        "val/q_risk_90",
        "val/coverage_80",
        "run/learning_rate",
        "run/grad_norm",
        "run/samples_per_s",
    ):
        assert [s for s, _ in scalars[t]] == [1], t  # one epoch: one point, at step 1
    import json

    history = [
        json.loads(x) for x in (predict_run / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    # the numbers are the run's own (metrics.jsonl), stored as float32 by the writer
    assert scalars["val/q_risk_90"][0][1] == pytest.approx(history[-1]["val_q_risk_90"], rel=1e-6)
    # a constant schedule without warm-up (the tiny run's): the configured rate, 1e-3
    from tftjax.serving.saved import open_model

    tc = open_model(predict_run / "run").tc
    assert (tc.lr_schedule, tc.warmup_steps) == ("constant", 0)
    assert scalars["run/learning_rate"][0][1] == pytest.approx(tc.learning_rate, rel=1e-6)


# --no-tensorboard writes none: training/test_ema_and_checks.py's run of checks within an
# epoch gives the flag (one tiny run fewer)
