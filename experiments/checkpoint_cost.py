"""What checkpoints within an epoch cost a step: the same run with no saves within its epochs
and with ``--save-every-steps N`` for each N given, side by side in one process.

    python experiments/checkpoint_cost.py --preset tiny --steps 40 --every 1,5,20

Each setting trains two epochs of ``--steps`` steps from one seed (the second epoch is timed:
its steps are compiled) and saves asynchronously where Orbax allows (the step goes on while
the checkpoint is written; the next save waits for the last). Printed: milliseconds per step
and the ratio to no saves; the settings run in the order off, the Ns, off again, and the two
offs' spread says how much of a ratio is noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def step_ms(preset: str, steps: int, every: int | None, data, workdir: Path) -> float:
    from tftjax.config import get_preset
    from tftjax.runner.preemption import Saving
    from tftjax.training import train_and_evaluate

    p = get_preset(preset)
    tc = dataclasses.replace(p.train, epochs=2, max_steps_per_epoch=steps)
    _, summary = train_and_evaluate(
        p.model,
        tc,
        workdir,
        data=data,
        progress=False,
        plots=False,
        tensorboard=False,
        log=lambda *a: None,
        saving=Saving(every_steps=every),
    )
    last = summary["history"][-1]
    return 1000 * last["epoch_time_s"] / last["steps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", default="1,5,20", help="comma-separated N of --save-every-steps")
    args = ap.parse_args()
    import jax

    from tftjax.config import get_preset
    from tftjax.data import default_parquet, load_dataset

    data = load_dataset(default_parquet(), get_preset(args.preset).model.data)
    settings = [None, *(int(n) for n in args.every.split(",")), None]
    root = Path(tempfile.mkdtemp(prefix="checkpoint-cost-"))
    rows = []
    for k, every in enumerate(settings):
        rows.append((every, step_ms(args.preset, args.steps, every, data, root / f"run_{k}")))
    offs = [ms for every, ms in rows if every is None]
    base = sum(offs) / len(offs)
    print(f"{args.preset}, {args.steps} steps an epoch, {jax.devices()[0].platform}:")
    print(f"{'saves within':>22} {'ms/step':>8} {'ratio':>6}")
    for every, ms in rows:
        label = "none" if every is None else f"--save-every-steps {every}"
        print(f"{label:>22} {ms:8.1f} {ms / base:6.2f}")
    print(f"the two runs without saves differ by {abs(offs[0] - offs[1]) / base:.1%}")


if __name__ == "__main__":
    main()
