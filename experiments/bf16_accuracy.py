"""bf16 against float32: the same run (preset, data, seed, settings) trained twice, once per
``--precision``, and the test losses side by side (issue 22: within 1%).

    python experiments/bf16_accuracy.py --preset tft225 --epochs 2 --max-steps-per-epoch 150

Each run is a real ``python -m tftjax.train`` job (its own folder, early stopping on the
validation loss, the best epoch's weights evaluated on the test stretch), so the losses come
from the weights and data they say they do. Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--dataset", default="es", help="bundled set: es, spx, nasdaq or btc")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps-per-epoch", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--remat", default="off")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/bf16_accuracy.json"))
    args = ap.parse_args()
    from tftjax.runner.provenance import write_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("f32", "bf16"):
            wd = Path(tmp) / precision
            cmd = [
                sys.executable,
                "-m",
                "tftjax.train",
                "--preset",
                args.preset,
                "--dataset",
                args.dataset,
                "--epochs",
                str(args.epochs),
                "--max-steps-per-epoch",
                str(args.max_steps_per_epoch),
                "--batch-size",
                str(args.batch_size),
                "--remat",
                args.remat,
                "--precision",
                precision,
                "--no-progress",
                "--workdir",
                str(wd),
            ]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{precision} run failed:\n{p.stderr[-3000:]}")
            s = json.loads((wd / "summary.json").read_text())
            rows.append(
                {
                    "precision": precision,
                    "wall_s": time.perf_counter() - t0,
                    "test_loss": s["model"]["test"]["loss"],
                    "val_loss": s["model"]["val"]["loss"],
                    "best_epoch": s.get("best_epoch"),
                    "identity": s["identity"]["model"],
                }
            )
            print(
                f"{precision}: test loss {rows[-1]['test_loss']:.5f} ({rows[-1]['wall_s']:.0f} s)",
                flush=True,
            )
    ratio = rows[1]["test_loss"] / rows[0]["test_loss"]
    print("\n| precision | test loss | val loss | wall |\n|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['precision']} | {r['test_loss']:.5f} | {r['val_loss']:.5f} | "
            f"{r['wall_s']:.0f} s |"
        )
    print(f"\nbf16 / f32 test loss: {ratio:.4f} ({(ratio - 1) * 100:+.2f}%)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, {"runs": rows, "bf16_over_f32": ratio}, args)


if __name__ == "__main__":
    main()
