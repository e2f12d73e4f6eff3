"""PNG plots of a training run: loss curves, a quantile fan, variable importance."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def loss_curves(path: Path, history: list[dict]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ep = [h["epoch"] for h in history]
    ax.plot(
        ep,
        [np.nan if h.get("train_loss") is None else h["train_loss"] for h in history],
        "o-",
        label="train",
    )
    ax.plot(ep, [h["val_loss"] for h in history], "s-", label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("quantile loss")
    ax.set_title("TFT loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def quantile_fan(
    path: Path,
    target_history: np.ndarray,
    target: np.ndarray,
    pred: np.ndarray,
    quantiles,
    titles: list[str],
    ylabel: str = "return / train std",
) -> None:
    """``target_history [k, T_e]``, ``target [k, T_d]``, ``pred [k, T_d, Q]`` (in the units
    ``ylabel`` names)."""
    plt = _plt()
    k = len(target)
    fig, axes = plt.subplots(1, k, figsize=(4 * k, 3.4), squeeze=False)
    qs = np.asarray(quantiles)
    te, td = target_history.shape[1], target.shape[1]
    for i, ax in enumerate(axes[0]):
        ax.plot(np.arange(-te, 0), target_history[i], color="0.4", lw=1, label="past")
        x = np.arange(td)
        for lo in range(len(qs) // 2):
            hi = len(qs) - 1 - lo
            ax.fill_between(
                x,
                pred[i, :, lo],
                pred[i, :, hi],
                color="tab:blue",
                alpha=0.15 + 0.1 * lo,
                lw=0,
                label=f"P{qs[lo] * 100:g}–P{qs[hi] * 100:g}",
            )
        if len(qs) % 2:
            ax.plot(x, pred[i, :, len(qs) // 2], color="tab:blue", lw=1.5, label="median")
        ax.plot(x, target[i], "k.-", lw=1, label="actual")
        ax.axvline(-0.5, color="0.7", ls=":")
        ax.set_title(titles[i], fontsize=9)
        ax.set_xlabel("step (0 = first forecast bar)")
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def variable_importance(
    path: Path,
    static_w: np.ndarray,
    hist_w: np.ndarray,
    fut_w: np.ndarray,
    static_names,
    hist_names,
    fut_names,
    top: int = 20,
) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 5), gridspec_kw={"width_ratios": [1, 2, 1]})
    for ax, w, names, title in (
        (axes[0], static_w, static_names, "static"),
        (axes[1], hist_w, hist_names, f"encoder (top {top} of {len(hist_names)})"),
        (axes[2], fut_w, fut_names, "decoder (known future)"),
    ):
        order = np.argsort(w)[::-1][:top]
        ax.barh(np.arange(len(order))[::-1], w[order], color="tab:green")
        ax.set_yticks(np.arange(len(order))[::-1])
        ax.set_yticklabels([names[j] for j in order], fontsize=7)
        ax.set_title(f"{title} variable weights", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def window_titles(ts: np.ndarray, starts: np.ndarray, encoder_steps: int) -> list[str]:
    """Fan titles: each window's first forecast bar as the bars store it (``ts``: int64
    nanoseconds since the epoch, wall-clock or UTC), to the minute."""
    return [
        f"first forecast bar {np.datetime64(int(t), 'ns').astype('datetime64[m]')}"
        for t in ts[np.asarray(starts) + encoder_steps]
    ]


def training_plots(workdir: Path, history, trainer, params, ds, cfg, write: bool = True) -> None:
    """Loss curves, quantile fans and variable importance. ``write=False`` (the other
    processes of a multi-host run) runs the predictions, in which every process takes part,
    and draws nothing."""
    from tftjax.data.covariates import input_names
    from tftjax.training.evaluation import window_targets

    test = ds.splits.test
    picks = test[np.linspace(0, len(test) - 1, num=min(4, len(test))).astype(int)]
    pred, _ = trainer.predict(params, picks)
    _, interp = trainer.predict(params, test)
    if not write:
        return
    if history:
        loss_curves(workdir / "loss_curves.png", history)
    e = cfg.data.encoder_steps
    tgt = ds.features.target
    past = tgt[picks[:, None] + np.arange(e)]
    future = window_targets(ds, picks)  # on the calendar grid (NaN: no bar in the slot)
    titles = window_titles(ds.ts, picks, e)
    if len(ds.series) > 1:
        titles = [f"{ds.names[i]}: {t}" for i, t in zip(ds.series_of(picks), titles)]
    quantile_fan(workdir / "quantile_fan.png", past, future, pred, cfg.head.quantiles, titles)
    static_names, encoder_names, decoder_names = input_names(cfg.data)
    variable_importance(
        workdir / "variable_importance.png",
        interp.static_weights.mean(0),
        interp.historical_weights.mean((0, 1)),
        interp.future_weights.mean((0, 1)),
        static_names,
        encoder_names,
        decoder_names,
    )


def dqn_plots(workdir: Path, history: list[dict], score: str, rollouts: dict) -> None:
    """``learning_curves.png`` and, where the environment has an equity curve (trading),
    ``equity_curve.png`` of the greedy rollouts ``{split: rollout}``."""
    plt = _plt()
    workdir = Path(workdir)
    ep = [h["epoch"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].plot(ep, [np.nan if h["loss"] is None else h["loss"] for h in history], "o-", ms=3)
    axes[0].set(title="Huber loss (train)", xlabel="epoch")
    ep_ret = [np.nan if h.get("episode_return") is None else h["episode_return"] for h in history]
    axes[1].plot(
        np.asarray(ep)[np.isfinite(ep_ret)], np.asarray(ep_ret)[np.isfinite(ep_ret)], "o-", ms=3
    )
    axes[1].set(title="mean episode return (ε-greedy, train)", xlabel="epoch")
    axes[2].plot(ep, [h[score] for h in history], "o-", ms=3, color="C2")
    axes[2].set(title=f"{score} (greedy)", xlabel="epoch")
    fig.tight_layout()
    fig.savefig(workdir / "learning_curves.png", dpi=110)
    plt.close(fig)
    rollouts = {s: r for s, r in rollouts.items() if r is not None}
    if not rollouts:
        return
    fig, axes = plt.subplots(1, len(rollouts), figsize=(6 * len(rollouts), 4), squeeze=False)
    for ax, (split, r) in zip(axes[0], rollouts.items()):
        ax.plot(np.cumsum(r["net"]), label="DQN (net of costs)")
        ax.plot(np.cumsum(r["next_ret"]), label="buy and hold")
        ax.axhline(0.0, color="grey", lw=0.8, label="flat")
        ax.set(title=f"equity, {split} split", xlabel="bar", ylabel="cumulative log return")
        ax.legend()
    fig.tight_layout()
    fig.savefig(workdir / "equity_curve.png", dpi=110)
    plt.close(fig)


def pit_histogram(path: Path, pit: dict, quantiles) -> None:
    """Where the targets fell among the forecast quantiles (``{"counts", "expected"}``, from
    :func:`tftjax.stats.scoring.pit_counts`), as shares per bin against the shares the quantile
    levels imply: a calibrated forecast matches them bar for bar."""
    plt = _plt()
    counts, expected = np.asarray(pit["counts"], float), np.asarray(pit["expected"], float)
    edges = np.concatenate([[0.0], np.asarray(quantiles, float), [1.0]])
    labels = [f"{a:g}-{b:g}" for a, b in zip(edges[:-1], edges[1:])]
    x = np.arange(counts.size)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(x - 0.2, counts / counts.sum(), 0.4, label="observed")
    ax.bar(x + 0.2, expected / expected.sum(), 0.4, label="expected (calibrated)")
    ax.set_xticks(x, labels)
    ax.set(
        xlabel="quantile bin of the target",
        ylabel="share of targets",
        title="PIT histogram of the quantile forecasts",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
