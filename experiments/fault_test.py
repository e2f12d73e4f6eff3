"""Kill a tiny TFT-225 run at random moments and resume it until it ends: does every trial end
bit-identical to the uninterrupted run, how many steps does each kill cost, and does any
process print a traceback?

    python experiments/fault_test.py --trials 20 --out runs/fault_test

One reference run, uninterrupted; then ``--trials`` runs, each started with ``--resume auto``
into its own folder and sent SIGKILL or SIGTERM (half each, drawn from ``--seed``) either at
a random step or while its n-th checkpoint is being written (a temporary Orbax folder
exists), then rerun with ``--resume auto`` (as a restart script would, whatever the exit)
until one exits 0. Every process shares one persistent compilation cache, so all of them
run one compiled program, as a requeued job on the same machine does.

Per trial: the signal, the moment, the steps done when it was sent (the progress bar's count,
which lags the device by up to a step), the step the resume started from, the steps lost
(done minus resumed, at least 0), whether the final weights and the test metrics equal the
reference's bit for bit, and whether any process printed a traceback. The goals: no trial
lost, 0 steps lost per SIGTERM, at most ``--save-every-steps`` per SIGKILL, no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EPOCHS, STEPS, SAVE_EVERY, BARS = 3, 8, 3, 1500
RUN = [
    "--preset",
    "tiny",
    "--remat",
    "off",
    "--batch-size",
    "32",
    "--max-steps-per-epoch",
    str(STEPS),
    "--epochs",
    str(EPOCHS),
    "--patience",
    "0",
    "--no-plots",
    "--no-tensorboard",
    "--save-every-steps",
    str(SAVE_EVERY),
]
BAR = re.compile(r"epoch (\d+):\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)")
RESUMED = re.compile(r"resuming from \S+ \((?:step (\d+) of epoch (\d+); )?step (\d+) of the run\)")


class Process:
    """A training subprocess whose progress bar (stderr) is read as it is drawn."""

    def __init__(self, workdir: Path, data: str, env: dict, resume: bool = True):
        argv = [sys.executable, "-m", "tftjax.train", *RUN, "--parquet-file", data]
        argv += ["--workdir", str(workdir)] + (["--resume", "auto"] if resume else [])
        self.p = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.steps_done, self.err, self.out = 0, "", ""
        self._threads = [
            threading.Thread(target=self._read, args=(self.p.stderr, "err"), daemon=True),
            threading.Thread(target=self._read, args=(self.p.stdout, "out"), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream, name: str) -> None:
        while chunk := os.read(stream.fileno(), 4096):
            text = chunk.decode(errors="replace")
            setattr(self, name, getattr(self, name) + text)
            if name == "err":
                for m in BAR.finditer(text):
                    epoch, step = int(m.group(1)), int(m.group(2))
                    self.steps_done = max(self.steps_done, (epoch - 1) * STEPS + step)

    def wait(self, timeout: float = 900) -> int:
        rc = self.p.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        return rc


def final_state(workdir: Path) -> tuple[list[np.ndarray], dict]:
    import jax
    import orbax.checkpoint as ocp

    ckpt = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    path = (workdir / "checkpoints" / f"tft_final_epoch{EPOCHS}").absolute()
    state = ckpt.restore(path, args=ocp.args.Composite(state=ocp.args.StandardRestore())).state
    test = json.loads((workdir / "summary.json").read_text())["model"]["test"]
    return [np.asarray(x) for x in jax.tree.leaves(state)], test


def kill_when(proc: Process, workdir: Path, moment: str, at: int, sig: int) -> int:
    """Send ``sig`` at global step ``at`` (``moment`` "step") or while the ``at``-th
    checkpoint write is under way ("save"); the steps done then."""
    seen: set[str] = set()
    ckpts = workdir / "checkpoints"
    while proc.p.poll() is None:
        if moment == "step" and proc.steps_done >= at:
            break
        if moment == "save" and ckpts.exists():
            tmp = {p.name for p in ckpts.iterdir() if "orbax-checkpoint-tmp" in p.name}
            seen |= tmp
            if len(seen) >= at and tmp:
                break
        time.sleep(0.002)
    done = proc.steps_done
    if proc.p.poll() is None:
        proc.p.send_signal(sig)
    return done


def trial(k: int, rng, data: str, env: dict, out: Path, reference) -> dict:
    workdir = out / f"trial_{k:02d}"
    shutil.rmtree(workdir, ignore_errors=True)
    sig = [signal.SIGKILL, signal.SIGTERM][k % 2]
    moment = "save" if rng.random() < 0.3 else "step"
    at = (
        int(rng.integers(1, EPOCHS * STEPS // SAVE_EVERY))
        if moment == "save"
        else int(rng.integers(1, EPOCHS * STEPS))
    )
    first = Process(workdir, data, env)
    done = kill_when(first, workdir, moment, at, sig)
    codes, errs, resumed = [first.wait()], [first.err], None
    while codes[-1] != 0 and len(codes) < 4:
        again = Process(workdir, data, env)
        codes.append(again.wait())
        errs.append(again.err)
        if resumed is None and (m := RESUMED.search(again.out)):
            resumed = int(m.group(3))
        elif resumed is None and "resum" not in again.out:
            resumed = 0  # killed before its first checkpoint: started afresh
    row = {
        "trial": k,
        "signal": signal.Signals(sig).name,
        "moment": f"{moment} {at}",
        "steps_done": done,
        "resumed_from": resumed,
        "steps_lost": None if resumed is None else max(done - resumed, 0),
        "exit_codes": codes,
        "traceback": any("Traceback" in e for e in errs),
        "ended": codes[-1] == 0,
    }
    if row["ended"]:
        leaves, test = final_state(workdir)
        row["identical"] = (
            len(leaves) == len(reference[0])
            and all(np.array_equal(a, b) for a, b in zip(leaves, reference[0]))
            and test == reference[1]
        )
    else:
        row["identical"] = False
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/fault_test"))
    args = ap.parse_args()
    from tftjax.data import default_parquet, read_bars, write_bars

    args.out.mkdir(parents=True, exist_ok=True)
    data = str(args.out / "bars.parquet")  # the first bars of the bundled ES file
    write_bars(read_bars(default_parquet()).slice(0, BARS), data)
    env = dict(
        os.environ,
        JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
        JAX_COMPILATION_CACHE_DIR=str(args.out / "jax-cache"),
    )
    ref_dir = args.out / "reference"
    shutil.rmtree(ref_dir, ignore_errors=True)
    ref = Process(ref_dir, data, env, resume=False)
    assert ref.wait() == 0, ref.err[-3000:]
    reference = final_state(ref_dir)
    rng = np.random.default_rng(args.seed)
    rows = []
    head = f"{'trial':>5} {'signal':7} {'moment':9} {'done':>4} {'resumed':>7} {'lost':>4}  exits        identical  traceback"
    print(head)
    for k in range(args.trials):
        r = trial(k, rng, data, env, args.out, reference)
        rows.append(r)
        print(
            f"{r['trial']:>5} {r['signal']:7} {r['moment']:9} {r['steps_done']:>4} "
            f"{str(r['resumed_from']):>7} {str(r['steps_lost']):>4}  "
            f"{','.join(map(str, r['exit_codes'])):12} {str(r['identical']):9}  {r['traceback']}",
            flush=True,
        )
    lost = {
        s: [r["steps_lost"] for r in rows if r["signal"] == s and r["steps_lost"] is not None]
        for s in ("SIGTERM", "SIGKILL")
    }
    summary = {
        "trials": len(rows),
        "survived_identical": sum(r["identical"] for r in rows),
        "steps_lost_sigterm_max": max(lost["SIGTERM"], default=None),
        "steps_lost_sigkill_max": max(lost["SIGKILL"], default=None),
        "steps_lost_sigkill_mean": float(np.mean(lost["SIGKILL"])) if lost["SIGKILL"] else None,
        "tracebacks": sum(r["traceback"] for r in rows),
        "save_every_steps": SAVE_EVERY,
    }
    print(
        f"summary: {summary['survived_identical']}/{summary['trials']} trials ended bit-identical "
        f"to the uninterrupted run; steps lost per SIGTERM at most "
        f"{summary['steps_lost_sigterm_max']}, per SIGKILL at most "
        f"{summary['steps_lost_sigkill_max']} (--save-every-steps {SAVE_EVERY}); "
        f"{summary['tracebacks']} tracebacks"
    )
    (args.out / "fault_test.json").write_text(
        json.dumps({"rows": rows, "summary": summary}, indent=1)
    )


if __name__ == "__main__":
    main()
