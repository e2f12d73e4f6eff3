"""``python -m tftjax.evaluate --checkpoint DIR``: test metrics of a saved TFT.

Restores the weights, model config and feature statistics saved in DIR (an
epoch or final checkpoint), rebuilds the features of ``--parquet-file``
(default: the file the model was trained on, else the bundled ES bars) with
those statistics, and prints loss and q-risk on the test split beside the
naive baselines.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import tyro


@dataclasses.dataclass
class Args:
    """Evaluate a TFT checkpoint on the test split."""

    checkpoint: Path
    """A checkpoint directory, e.g. runs/tft/checkpoints/tft_final_epoch10."""
    parquet_file: Path | None = None
    """OHLCV bars (default: the training file recorded in the checkpoint)."""
    split: str = "test"
    """train, val or test."""


def evaluate(checkpoint: Path, parquet_file: Path | None = None, split: str = "test") -> dict:
    import jax

    from tftjax.checkpoints import read_meta, restore_state
    from tftjax.config import TFTConfig
    from tftjax.data import DataError, FeatureStats, load_dataset, to_device
    from tftjax.train_lib import (TrainConfig, Trainer, baselines, create_train_state,
                                  format_summary)

    if not checkpoint.is_dir():
        raise DataError(f"{checkpoint}: no such checkpoint directory")
    try:
        meta = read_meta(checkpoint)
    except Exception as e:  # orbax raises several types for a folder that is not a checkpoint
        raise DataError(f"{checkpoint}: not a readable tftjax checkpoint ({type(e).__name__})") from None
    if meta.get("kind") != "tft":
        raise DataError(f"{checkpoint}: not a TFT checkpoint (kind {meta.get('kind')!r})")
    cfg = TFTConfig.from_json(meta["model_config"])
    stats = FeatureStats.from_json(meta["feature_stats"])
    if parquet_file is None:
        recorded = Path(meta.get("parquet_file", ""))
        parquet_file = recorded if recorded.is_file() else None
    ds = load_dataset(parquet_file, cfg.data, stats=stats)
    tc = TrainConfig()
    state = restore_state(checkpoint, create_train_state(cfg, tc, jax.random.key(0)))
    trainer = Trainer(cfg, tc, to_device(ds.features))
    summary = {"model": {split: trainer.evaluate(state.params, getattr(ds.splits, split))},
               "baselines": {}}
    if split != "train":
        for name, m in baselines(ds, cfg.quantiles, split).items():
            summary["baselines"][name] = {split: m}
    print(f"{checkpoint} (epoch {meta.get('epoch')}) on {ds.bars.path}, {split} split, "
          f"{getattr(ds.splits, split).size:,} windows")
    print(format_summary(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, prog="python -m tftjax.evaluate")
    from tftjax.data import DataError

    if args.split not in ("train", "val", "test"):
        print(f"error: --split must be train, val or test, got {args.split!r}", file=sys.stderr)
        return 2
    try:
        evaluate(args.checkpoint, args.parquet_file, args.split)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
