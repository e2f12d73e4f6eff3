"""TensorBoard logs of a run: scalars per epoch, the run's config as text, its plots as images.

Every run loop (``train``, ``dqn``, and the runs inside ``backtest`` folds and ``tune``
trials) writes ``RUN/tensorboard/`` unless ``--no-tensorboard``: ``tensorboard --logdir
runs/`` compares runs live. The writer is tensorboardX: pure Python over protobuf (which
orbax-checkpoint already installs), no TensorFlow or PyTorch, about 100 KB, so it is part of
the base install. Tags: ``train/…`` and ``val/…`` for the metrics of those names
(``train_loss`` → ``train/loss``), ``run/…`` for the rest (samples/s, learning rate,
gradient norm, ε), ``device/…`` for the device's memory where the backend reports it.
:func:`read_scalars` reads a log back (tests; notebooks).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

LOGDIR = "tensorboard"


def tag(key: str) -> str:
    """``val_q_risk_90`` → ``val/q_risk_90``, ``train_loss`` → ``train/loss``, else ``run/key``."""
    for prefix in ("train_", "val_", "test_"):
        if key.startswith(prefix):
            return f"{prefix[:-1]}/{key[len(prefix) :]}"
    return f"run/{key}"


class Board:
    """One run's TensorBoard writer (``folder`` None: off; nothing is written)."""

    def __init__(self, folder: str | Path | None):
        self.writer = None
        if folder is not None:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(str(folder), flush_secs=10)

    def config(self, identity: dict) -> None:
        """The run's data, model and training config, as text."""
        if self.writer is not None:
            text = json.dumps(identity, indent=2, default=str)
            self.writer.add_text("config", "```\n" + text + "\n```", 0)

    def epoch(self, step: int, metrics: dict, memory: dict | None = None) -> None:
        """Every finite number in ``metrics`` (and the device's memory) at ``step``."""
        if self.writer is None:
            return
        for k, v in metrics.items():
            if (
                k != "epoch"
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
                and np.isfinite(v)
            ):
                self.writer.add_scalar(tag(k), float(v), step)
        for k, v in (memory or {}).items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(f"device/{k}", float(v), step)
        self.writer.flush()

    def images(self, folder: str | Path, step: int) -> None:
        """The run's PNG plots."""
        if self.writer is None:
            return
        from PIL import Image

        for png in sorted(Path(folder).glob("*.png")):
            with Image.open(png) as im:
                self.writer.add_image(
                    png.stem, np.asarray(im.convert("RGB")), step, dataformats="HWC"
                )
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``tag → [(step, value), …]`` from the event files under ``folder`` (TFRecord framing:
    length, its CRC, the ``Event`` proto, its CRC; parsed with tensorboardX's own protos)."""
    from tensorboardX.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        raw, i = path.read_bytes(), 0
        while i + 12 <= len(raw):
            (n,) = struct.unpack("<Q", raw[i : i + 8])
            event = Event.FromString(raw[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return out
