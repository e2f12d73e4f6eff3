"""Memory that does not grow: ``python -m tftjax.memory --soak N``.

The original system leaked 16.4 GB over a run and ran out of a 24 GB card. A soak run
trains N epochs through the real run loop (train steps, validation and an epoch
checkpoint each epoch) and records, after every epoch, what a leak would move:

* ``device_bytes``: the device's ``bytes_in_use`` (a GPU reports it; on CPU, where there
  is no device allocator to ask, the bytes of the live device arrays stand in);
* ``live_arrays``: how many device arrays Python still references (``jax.live_arrays``);
* ``host_rss``: the process's resident memory.

After the first epoch (which compiles, and fills caches and the checkpoint writer's
buffers) device bytes and live arrays may not grow, and the host's memory may not grow in
the second half of the run, beyond :data:`THRESHOLDS`; the CLI exits 1 when something does.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable
from pathlib import Path

import jax

from tftjax.config import TFTConfig, TrainConfig
from tftjax.errors import ConfigError
from tftjax.runner.devices import memory_stats

MiB = 1 << 20
THRESHOLDS = {"device_bytes": 1 * MiB, "live_arrays": 0, "host_rss": 64 * MiB}
"""Allowed growth (see :func:`growth` for the baselines). Device bytes and live arrays are
exact counts of what the program holds (a train state is donated and replaced each step, so
a clean loop holds the same arrays after every epoch); host memory moves with the Python
heap and the allocator's caching, so it gets a margin far below any real leak (the seed's
was 16 GB)."""


def host_rss() -> int:
    """This process's resident set size in bytes (Linux ``/proc``; else the peak RSS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reading() -> dict:
    """What the process holds now."""
    gc.collect()
    arrays = [a for a in jax.live_arrays() if not a.is_deleted()]
    stats = memory_stats()
    device = (
        int(stats["bytes_in_use"])
        if stats and "bytes_in_use" in stats
        else sum(a.nbytes for a in arrays)
    )
    return {
        "device_bytes": device,
        "device_bytes_source": "bytes_in_use"
        if stats and "bytes_in_use" in stats
        else "live arrays",
        "live_arrays": len(arrays),
        "host_rss": host_rss(),
    }


def growth(records: list[dict]) -> list[str]:
    """What grew beyond :data:`THRESHOLDS`, one line each. Device bytes and live arrays are
    exact counts: measured from the first epoch on. The host's resident memory also warms up
    (the allocator's arenas, the checkpoint writer's and the evaluation's buffers: measured, a
    TFT-225 soak's RSS rose ~80 MiB over its first 3 epochs and then stayed within 15 MiB), so
    it is measured from the middle epoch on: a leak grows in every epoch, a warm-up stops."""
    if len(records) < 2:
        return []
    out = []
    for key, limit in THRESHOLDS.items():
        start = 0 if key != "host_rss" else (len(records) - 1) // 2
        base = records[start]
        later = records[start + 1 :]
        if not later:
            continue
        worst = max(later, key=lambda r: r[key])
        if worst[key] - base[key] > limit:
            out.append(
                f"{key} grew by {worst[key] - base[key]:,} (epoch {base['epoch']}: "
                f"{base[key]:,}, epoch {worst['epoch']}: {worst[key]:,}; allowed "
                f"{limit:,})"
            )
    return out


def soak(
    cfg: TFTConfig,
    tc: TrainConfig,
    epochs: int,
    workdir: str | Path,
    *,
    parquet_file=None,
    log: Callable = print,
    callback: Callable | None = None,
) -> tuple[list[dict], list[str]]:
    """Train ``epochs`` epochs of ``cfg`` in ``workdir`` (checkpoints each epoch, validation,
    no early stop) and read the memory after each. Returns the per-epoch readings and what
    grew (empty: no leak). ``callback(epoch, state, metrics, is_final)`` runs after each
    epoch before the reading (the leak test keeps every epoch's state there)."""
    from tftjax.training import train_and_evaluate

    if epochs < 2:
        raise ConfigError(
            f"--soak {epochs}: a soak needs 2 or more epochs (growth is measured after the first)"
        )
    records: list[dict] = []

    def after_epoch(epoch, state, metrics, is_final):
        if callback is not None:
            callback(epoch, state, metrics, is_final)
        del state, metrics
        records.append({"epoch": epoch, **reading()})
        r = records[-1]
        log(
            f"soak epoch {epoch}: device {r['device_bytes'] / MiB:,.1f} MiB "
            f"({r['device_bytes_source']}), {r['live_arrays']} live arrays, host RSS "
            f"{r['host_rss'] / MiB:,.0f} MiB"
        )

    tc = dataclasses.replace(tc, epochs=epochs, patience=0)
    train_and_evaluate(
        cfg,
        tc,
        workdir,
        data=parquet_file,
        progress=False,
        callback=after_epoch,
        log=lambda *a, **k: None,
    )
    return records, growth(records)


def format_soak(records: list[dict]) -> str:
    lines = ["| epoch | device bytes | live arrays | host RSS |", "|---|---|---|---|"]
    for r in records:
        lines.append(
            f"| {r['epoch']} | {r['device_bytes'] / MiB:,.2f} MiB | {r['live_arrays']} "
            f"| {r['host_rss'] / MiB:,.0f} MiB |"
        )
    return "\n".join(lines)
