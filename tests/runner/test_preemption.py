"""Training that survives preemption (tftjax.runner.preemption): a signal mid-epoch saves that
step and exits 75, and ``--resume auto`` ends bit-identical to the uninterrupted run; a second
signal during the save changes nothing; a save cut short (its temporary folder left behind)
leaves the previous checkpoint the one that resumes; ``--resume auto`` starts afresh where a
run was killed before its first save, and refuses a changed setting or a folder of other
files; the DQN saves at the end of the epoch in flight. The signals are real ones, sent to
this process from inside a step (the run loop's handlers are installed there)."""

import json
import os
import signal

import numpy as np
import pytest
from conftest import call
from tiny import TINY_DQN, raw_state, tiny_tft

from tftjax import train as train_cli
from tftjax.dqn import __main__ as dqn_cli
from tftjax.runner import checkpoints
from tftjax.runner.preemption import EXIT_SAVED, SaveSchedule, Saving, SignalWatch
from tftjax.training.trainer import Trainer

EPOCHS = ["--epochs", "2"]  # tiny_tft: 3 steps an epoch


def send_at(monkeypatch, cls, name: str, call_no: int, *signals):
    """Patch ``cls.name`` to send ``signals`` to this process on its ``call_no``-th call."""
    real, seen = getattr(cls, name), []

    def patched(*a, **k):
        seen.append(1)
        if len(seen) == call_no:
            for s in signals:
                os.kill(os.getpid(), s)
        return real(*a, **k)

    monkeypatch.setattr(cls, name, patched)


def same_state(a, b) -> bool:
    import jax

    la, lb = jax.tree.leaves(raw_state(a)), jax.tree.leaves(raw_state(b))
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def history(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run = tmp_path_factory.mktemp("reference") / "run"
    assert call(train_cli.main, *tiny_tft(*EPOCHS, "--workdir", run)) == 0
    return run


@pytest.mark.xdist_group("preemption")
def test_a_signal_mid_epoch_saves_and_the_resume_is_bit_identical(
    reference, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    # --resume auto on a folder that does not exist yet: a fresh run. SIGTERM in epoch 2's
    # second step (the 5th); a second signal (SIGUSR1, SIGTERM) while its checkpoint is
    # written is ignored: the save runs to its end
    send_at(monkeypatch, Trainer, "train_step", 5, signal.SIGTERM)
    send_at(
        monkeypatch, checkpoints.EpochCheckpointer, "save_within", 1, signal.SIGUSR1, signal.SIGTERM
    )
    rc = call(train_cli.main, *tiny_tft(*EPOCHS, "--workdir", run, "--resume", "auto"))
    err = capsys.readouterr().err
    assert rc == EXIT_SAVED, err
    assert err.count("\n") == 1 and "SIGTERM: saved after step 2 of epoch 2" in err, err
    assert "tft_step_5" in checkpoints.list_checkpoints(run / "checkpoints")
    partial = json.loads((run / "partial.json").read_text())
    assert partial["signal"] == "SIGTERM" and partial["epochs_done"] == 1
    assert partial["epoch_in_flight"]["step"] == 2 and partial["at"].endswith("+00:00")
    assert [h["epoch"] for h in history(run)] == [1]  # the metrics so far
    monkeypatch.undo()

    # a changed setting is refused, nothing in the folder touched
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    rc = call(
        train_cli.main,
        *tiny_tft(*EPOCHS, "--workdir", run, "--resume", "auto", "--learning-rate", "0.01"),
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "learning_rate" in err, err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before

    # a later save cut short by a SIGKILL leaves its temporary folder: never a checkpoint
    cut = run / "checkpoints" / "tft_step_6.orbax-checkpoint-tmp-1700000000"
    (cut / "state").mkdir(parents=True)
    assert call(train_cli.main, *tiny_tft(*EPOCHS, "--workdir", run, "--resume", "auto")) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "tft_step_5 (step 2 of epoch 2" in out, out
    assert not cut.exists() and not (run / "partial.json").exists()
    # the uninterrupted run's weights, bit for bit, and its numbers
    assert same_state(
        run / "checkpoints" / "tft_final_epoch2", reference / "checkpoints" / "tft_final_epoch2"
    )
    keys = ("epoch", "train_loss", "grad_norm", "val_loss", "val_q_risk_90")
    assert [{k: h[k] for k in keys} for h in history(run)] == [
        {k: h[k] for k in keys} for h in history(reference)
    ]
    test = lambda r: json.loads((r / "summary.json").read_text())["model"]["test"]
    assert test(run) == test(reference)


@pytest.mark.slow  # a third tiny run (the quick tier has the signal's: the test above)
@pytest.mark.xdist_group("preemption")
def test_resume_auto_starts_afresh_where_a_run_was_killed_before_its_first_save(
    reference, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"

    def killed(*a, **k):  # as a SIGKILL leaves it: no handler, no save
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train_step", killed)
    assert call(train_cli.main, *tiny_tft(*EPOCHS, "--workdir", run)) == 130
    monkeypatch.undo()
    assert not checkpoints.list_checkpoints(run / "checkpoints")
    capsys.readouterr()
    # plain --resume keeps its refusal; auto refuses another setting (run.json) ...
    assert call(train_cli.main, *tiny_tft(*EPOCHS, "--workdir", run, "--resume")) == 2
    assert "no checkpoint to resume" in capsys.readouterr().err
    rc = call(
        train_cli.main, *tiny_tft(*EPOCHS, "--workdir", run, "--resume", "auto", "--seed", "7")
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "train.seed" in err, err
    # ... and with the same settings starts the run afresh, to the uninterrupted run's end
    assert call(train_cli.main, *tiny_tft(*EPOCHS, "--workdir", run, "--resume", "auto")) == 0
    assert same_state(
        run / "checkpoints" / "tft_final_epoch2", reference / "checkpoints" / "tft_final_epoch2"
    )


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--save-every-steps", "0"], "--save-every-steps must be at least 1, got 0"),
        (["--keep", "0"], "--keep must be at least 1, got 0"),
        (["--save-every-minutes", "0"], "--save-every-minutes must be above 0, got 0"),
        (["--resume", "maybe"], "must be one of no, yes, auto, got 'maybe'"),
    ],
)
def test_bad_saving_flags_exit_2_in_one_line(tmp_path, capsys, args, expect):
    rc = call(train_cli.main, *tiny_tft("--workdir", tmp_path / "w", *args))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and expect in err, err
    assert not (tmp_path / "w").exists()


def test_resume_auto_refuses_a_folder_of_other_files(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    rc = call(train_cli.main, *tiny_tft("--workdir", tmp_path, "--resume", "auto"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "notes.txt" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.slow  # three tiny DQN runs
def test_the_dqn_saves_at_the_end_of_the_epoch_in_flight_and_resumes(tmp_path, monkeypatch, capsys):
    from tftjax.dqn.loop import DQNTask

    ref, run = tmp_path / "ref", tmp_path / "run"
    args = [*TINY_DQN, "--epochs", "3", "--no-progress", "--no-tensorboard"]
    assert call(dqn_cli.main, *args, "--workdir", ref) == 0
    send_at(monkeypatch, DQNTask, "train_epoch", 2, signal.SIGTERM)
    assert call(dqn_cli.main, *args, "--workdir", run, "--resume", "auto") == EXIT_SAVED
    monkeypatch.undo()
    assert "saved after epoch 2" in capsys.readouterr().err
    names = checkpoints.list_checkpoints(run / "checkpoints")
    assert "dqn_epoch_2" in names and not any("final" in n for n in names)
    assert call(dqn_cli.main, *args, "--workdir", run, "--resume", "auto") == 0
    assert same_state(
        run / "checkpoints" / "dqn_final_epoch3", ref / "checkpoints" / "dqn_final_epoch3"
    )


def test_signals_are_requests_and_no_save_is_cut_by_one():
    watch = SignalWatch(multi_process=False)
    assert not watch.should_stop(1)
    with watch.saving():  # a scheduled save: the signal is kept for after it (the fault
        watch._handle(signal.SIGTERM, None)  # test found it dropped once)
    watch._handle(signal.SIGTERM, None)  # a scheduler's repeat changes nothing
    assert watch.received == "SIGTERM" and watch.should_stop(2)
    ctrl_c = SignalWatch(multi_process=False)
    ctrl_c._handle(signal.SIGINT, None)
    with ctrl_c.saving():
        ctrl_c._handle(signal.SIGINT, None)  # during the save: ignored
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C before a save: stop now
        ctrl_c._handle(signal.SIGINT, None)


def test_the_save_schedule_counts_steps_and_minutes():
    now = [0.0]
    by_steps = SaveSchedule(Saving(every_steps=4), clock=lambda: now[0])
    assert [g for g in range(1, 13) if by_steps.due(g)] == [4, 8, 12]
    by_time = SaveSchedule(Saving(every_minutes=0.5), clock=lambda: now[0])
    now[0] = 29.0
    assert not by_time.due(1)
    now[0] = 30.0
    assert by_time.due(2)
    by_time.saved()
    now[0] = 59.0
    assert not by_time.due(3)


def test_an_epoch_saved_after_its_last_step_resumes_to_its_end():
    # a signal (or --save-every-steps) at an epoch's last step: the resumed epoch runs no
    # step, and its books are the saved sums (a review found it failing an assertion)
    from types import SimpleNamespace

    from tftjax.training.epoch import RunningSums

    idx = np.arange(6, dtype=np.int32).reshape(3, 2)
    within = SimpleNamespace(first=3, sums={"loss_sum": 1.5, "grad_norm": 0.25})
    books = RunningSums(2, idx, None, within)
    assert books.settle_last() == 1.5 and books.sums() == {"loss_sum": 1.5, "grad_norm": 0.25}
