"""Batch and tier plans for a memory budget: the largest batch that fits, and ``--remat
auto``'s choice of tier, accumulation and batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from tftjax.config import ConfigError, TFTConfig, parse_bytes
from tftjax.memory.analysis import GB, Compiled, analyse, analyse_eval, min_bytes, targeting
from tftjax.models import remat
from tftjax.runner.devices import device_limit


def fit_linear(points: list[Compiled]) -> tuple[float, float]:
    """``total_bytes ≈ a + b · batch`` by least squares over the measured batch sizes."""
    x = np.array([p.batch_size for p in points], float)
    y = np.array([p.total_bytes for p in points], float)
    if len(points) == 1:
        return 0.0, float(y[0] / x[0])
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def largest_batch(
    cfg: TFTConfig,
    budget_bytes: float,
    fit: tuple[float, float],
    rows: int,
    verify: bool = True,
    max_batch: int = 1 << 16,
    log=None,
) -> tuple[int, Compiled | None]:
    """Largest batch whose compiled step fits ``budget_bytes``.

    From the linear fit alone (``verify=False``: no compile), or exactly, by compiling: from
    the fit's guess, step up or down (by one, then by 25%) until the boundary is bracketed,
    then narrow the bracket by interpolating the measured bytes (bisection when that stalls)
    until the answer fits and the next batch does not. Compiled bytes are close to linear in the
    batch, so the interpolation lands within a batch or two: an exact answer in a few
    compiles, whatever the float rounding of the fit.
    """
    a, b = fit
    guess = int(min(max((budget_bytes - a) // max(b, 1.0), 0), max_batch))
    if not verify:
        return guess, None
    tried: dict[int, Compiled] = {}

    def fits(n: int) -> bool:
        if n not in tried:
            tried[n] = analyse(cfg, n, rows)
            if log:
                log(f"  {cfg.execution.remat} batch {n}: {tried[n].total_bytes / GB:.2f} GB")
        return tried[n].total_bytes <= budget_bytes

    lo, hi = 0, max_batch + 1  # lo fits (0: nothing), hi does not
    n = max(guess, 1)
    # the neighbour first (a good fit is off by one at most), then steps of 25%
    if fits(n):
        lo, step = n, 1
        while lo < max_batch:
            n = min(lo + max(step, 1), max_batch)
            if not fits(n):
                hi = n
                break
            lo, step = n, int(n * 0.25)
    else:
        hi, step = n, 1
        while hi > 1:
            n = max(hi - max(step, 1), 1)
            if fits(n):
                lo = n
                break
            hi, step = n, int(n * 0.2)
    prev, bisect = None, False  # the end the last interpolated step moved (True: lo)
    while hi - lo > 1 and hi <= max_batch:
        n = (lo + hi) // 2
        y0 = tried[lo].total_bytes if lo in tried else None
        y1 = tried[hi].total_bytes if hi in tried else None
        interpolate = not bisect and y0 is not None and y1 is not None and y1 > y0
        if interpolate and y0 is not None and y1 is not None:  # where the line through the
            # two measured ends meets the budget
            n = min(max(lo + int((budget_bytes - y0) * (hi - lo) // (y1 - y0)), lo + 1), hi - 1)
        ok = fits(n)
        lo, hi = (n, hi) if ok else (lo, n)
        # the same end moved twice by interpolation: bisect once (no creep from one side)
        bisect, prev = (interpolate and prev == ok), (ok if interpolate else None)
    return lo, tried.get(lo)


HEADROOM = 0.9
"""Share of the device's ``bytes_limit`` that ``--remat auto`` plans for."""


def plan_auto(
    cfg: TFTConfig,
    budget_bytes: float | None,
    batch_size: int,
    rows: int,
    log=print,
    grow_batch: bool = True,
    eval_batch_size: int | None = None,
    backend: str | None = None,
    accumulate: int = 1,
    max_accumulate: int = 64,
) -> tuple[str, int, int]:
    """``--remat auto``: three knobs, the remat tier, gradient accumulation and the batch.

    The batch first runs whole (``accumulate`` micro-batches), the tiers tried fastest first
    by modelled step time (:data:`tftjax.models.remat.STEP_TIME`; ties: the smaller tier); where
    none fits, as 2×, 4×, … as many micro-batches (up to ``max_accumulate``): accumulation
    keeps the update of the whole batch at the memory of one micro-batch, but small
    micro-batches use an accelerator poorly, so a rematerialising tier comes first. The first
    fit is the choice (a slower tier is never compiled: it cannot help). With ``grow_batch`` and no accumulation needed,
    the batch then grows to the largest that fits, checked by compiling. The budget is
    ``budget_bytes`` capped at :data:`HEADROOM` of the device's real limit (or that limit when
    ``budget_bytes`` is None). The eval step at ``eval_batch_size`` must fit too.

    Returns:
      ``(tier, batch_size, accumulate)``.

    Raises:
      ConfigError: no budget known, or nothing fits at ``batch_size``.
    """
    # compiling for a GPU target (tftjax.memory.targets): its budget, never this machine's
    # own device's limit
    limit = None if targeting() else device_limit()
    if limit is not None and (budget_bytes is None or HEADROOM * limit < budget_bytes):
        log(
            f"auto: planning for {HEADROOM:.0%} of the device's limit of {limit / GB:.2f} GB"
            + (f" (below --memory-budget {budget_bytes / GB:.2f} GB)" if budget_bytes else "")
            + (
                "; on a GPU that limit is JAX's pool, XLA_PYTHON_CLIENT_MEM_FRACTION of "
                "the card (default 0.75)"
                if remat.is_gpu(backend)
                else ""
            )
        )
        budget_bytes = HEADROOM * limit
    if budget_bytes is None:
        raise ConfigError(
            "--remat auto needs --memory-budget on a device that does not report "
            "its memory limit (e.g. --memory-budget 24GB)"
        )
    floor = min_bytes(cfg, batch_size, rows)
    if budget_bytes < floor:
        raise ConfigError(
            f"no remat tier fits {budget_bytes / GB:.2f} GB: parameters, optimizer "
            f"state and data alone take {floor / GB:.2f} GB"
        )
    choice, k = None, accumulate
    tiers = sorted(remat.ORDER, key=lambda t: (remat.step_time(t, backend), -remat.ORDER.index(t)))
    while choice is None and k <= max_accumulate and batch_size % k == 0:
        for t in tiers:
            at = analyse(cfg.override(remat=t), batch_size, rows, accumulate=k)
            fits = at.total_bytes <= budget_bytes
            log(
                f"auto: {t:10s} batch {batch_size}"
                + (f" as {k} micro-batches of {batch_size // k}" if k > 1 else "")
                + f": {at.total_bytes / GB:7.2f} GB, modelled time "
                f"{remat.step_time(t, backend):.2f}× off: {'fits' if fits else 'does not fit'} "
                f"{budget_bytes / GB:.2f} GB"
            )
            if fits:
                choice = (t, k, at)
                break
        k *= 2
    if choice is None:
        raise ConfigError(
            f"no remat tier fits {budget_bytes / GB:.2f} GB at batch {batch_size}, "
            f"even as {max(k // 2, accumulate)} accumulated micro-batches; lower "
            "--batch-size or raise --memory-budget"
        )
    tier, k, at = choice
    c = cfg.override(remat=tier)
    if eval_batch_size:
        ev = analyse_eval(c, eval_batch_size, rows)
        if ev.total_bytes > budget_bytes:
            raise ConfigError(
                f"the eval step at --eval-batch-size {eval_batch_size} needs "
                f"{ev.total_bytes / GB:.2f} GB, over {budget_bytes / GB:.2f} GB; "
                "lower --eval-batch-size"
            )
        log(
            f"auto: the eval step at batch {eval_batch_size} needs {ev.total_bytes / GB:.2f} GB: fits"
        )
    acc = f" as {k} accumulated micro-batches of {batch_size // k}" if k > 1 else ""
    if not grow_batch or k > 1:
        log(
            f"auto: chose remat={tier} (least modelled step time among the tiers that fit) "
            f"at batch {batch_size}{acc}"
        )
        return tier, batch_size, k
    small = analyse(c, max(1, batch_size // 2), rows)
    best, _ = largest_batch(
        c, budget_bytes, fit_linear([small, at]), rows, max_batch=max(batch_size, rows)
    )
    best = max(best, batch_size)
    log(
        f"auto: chose remat={tier} (least modelled step time among the tiers that fit) and "
        f"batch {best} (the largest that fits, checked by compiling it)"
    )
    return tier, best, 1


def resolve_auto(cfg: TFTConfig, tc, paths, devices: int = 1, resume: bool = False, workdir=None):
    """``--remat auto``: ``(cfg, tc)`` with the fastest tier that fits
    ``cfg.execution.memory_budget`` (a device's: each of ``devices`` runs ``1/devices`` of the
    batch), as accumulated micro-batches where the whole batch fits no tier, and (on a new
    run without accumulation) the largest batch that fits; a resumed run keeps its batch
    size. ``paths``: the run's bars (None: the bundled ES bars, or on resume the run's own,
    found again in ``workdir``).

    Raises:
      ConfigError: no budget known, or nothing fits.
    """
    from tftjax.data import default_parquet, find_data_files
    from tftjax.data.bars import read_series

    budget = cfg.execution.memory_budget
    if paths is None and resume:
        from tftjax.runner.resume import latest_meta

        if workdir is None:
            raise ValueError("a resumed run's bars are found in its workdir: give it")
        saved = latest_meta(Path(workdir) / "checkpoints", "tft")
        paths = find_data_files(saved["identity"]["data"], workdir)
    files = paths if isinstance(paths, list) else [paths or default_parquet()]
    rows = sum(len(b) for p in files for b in read_series(p))
    tier, batch, k = plan_auto(
        cfg.override(remat="off"),
        None if budget is None else parse_bytes(budget),
        tc.batch_size // devices,
        rows,
        grow_batch=not resume,
        eval_batch_size=-(-tc.eval_batch_size // devices),
        accumulate=tc.accumulate,
    )
    return (
        cfg.override(remat=tier),
        dataclasses.replace(tc, batch_size=batch * devices, accumulate=k),
    )
