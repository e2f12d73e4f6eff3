"""The DQN trader's (and CartPole agent's) configuration and presets."""

from __future__ import annotations

import dataclasses
from typing import Literal

from tftjax.config import check


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """The DQN trader (or CartPole agent) and its training loop."""

    env: Literal["trading", "cartpole"] = "trading"
    """trading: bars from a parquet file; cartpole: gymnax CartPole-v1 through the same agent
    and loop (its own preset)."""
    # trading environment
    window: int = 16
    """Bars of features in one observation."""
    features: tuple[str, ...] = (
        "r1",
        "ret_5",
        "ret_20",
        "ret_60",
        "rvol_10",
        "rvol_60",
        "clv_20",
        "vz_20",
        "rsi_13",
        "sma_30",
        "tod_sin",
        "tod_cos",
    )
    episode_len: int = 256
    """Decisions per training episode (a random contiguous segment of the training rows)."""
    fill: str = "next-open"
    """Where an order decided on bar t's close fills: the next bar's open (what a trader can
    do after seeing the close), or that close itself (optimistic)."""
    latency: int = 0
    """Bars between the decision and its fill (0: the next open, or the close, as --fill)."""
    spread_bps: float | None = None
    """Quoted bid-ask spread in basis points; half of it is paid per unit traded. Default: the
    bundled set's (README: ES a tick, BTC the book, S&P/NASDAQ an index ETF's), else 1."""
    fee_bps: float | None = None
    """Commission or exchange fee in basis points per unit traded (default per data set)."""
    slippage_bps: float | None = None
    """Extra market impact in basis points per unit traded (default per data set)."""
    flatten_at_session_end: bool = False
    """Close the position on the last bar of every session of --calendar (no overnight or
    weekend risk); needs a calendar."""
    tft_checkpoint: str | None = None
    """A trained TFT (run folder, checkpoint or export) whose first-step quantile forecasts at
    each bar join the observation; it must have been trained and validated on data ending
    before this run's validation split."""
    reward_scale: float | None = None
    """Learning reward = net log return × this. Default (trading): 1 / the training split's
    target scale (the std of its returns), so that rewards, and Q, are O(1) on any data."""
    # data (as the TFT's flags)
    calendar: str | None = None
    """Exchange calendar (XCME, XNYS, 24/7 …): session features, --flatten-at-session-end and
    the annualisation (its bars per year)."""
    timezone: str | None = None
    """Wall clock of the calendar features (default: the data's, else the calendar's)."""
    bar_interval: str | None = None
    """Nominal bar interval (default: the training rows' median step)."""
    train_fraction: float = 0.70
    """Share of the usable bars given to training."""
    val_fraction: float = 0.15
    """Share given to validation (the rest, less embargoes, is test)."""
    # loop
    epochs: int = 100
    """Epochs; one epoch = as many env steps as the training split has bars (trading)."""
    steps_per_epoch: int | None = None
    """Env steps per epoch; ``None``: the training split's length (trading), 10,000 (cartpole)."""
    num_envs: int = 8
    """Parallel episodes."""
    patience: int = 10
    """Early stop after this many epochs without a better smoothed validation score
    (trading: Sharpe, CartPole: greedy return); 0: off. The final checkpoint holds the best
    epoch's agent."""
    min_epochs: int = 20
    """No early stop before this epoch, nor before ε has finished decaying."""
    smooth_epochs: int = 5
    """Epochs are ranked by the mean validation score of the last this many (1: unsmoothed)."""
    flat_fallback: bool = True
    """Ship the flat policy when the agent's validation record does not clear --psr-gate
    (--no-flat-fallback: ship the agent anyway; the report says which)."""
    psr_gate: float = 0.95
    """Trading: ship the agent only where the deflated Sharpe of its validation record,
    counting every candidate compared (ranked epochs × seeds), is at least this (the
    probability that its Sharpe beats the best of that many skill-less candidates)."""
    action_augment: bool = False
    """Trading: learn from all three actions at every stored bar (the agent does not move
    the market, so each action's reward and next state are known): three targets per
    transition, and acting greedily (no ε-exploration)."""
    decision_every: int = 1
    """Trading: decide every K bars and hold in between (one transition spans K bars); cuts
    turnover."""
    # agent
    hidden: tuple[int, ...] = (128, 128)
    """Q-network hidden sizes, e.g. --hidden 128 128."""
    learning_rate: float = 3e-4
    lr_end_fraction: float = 1.0
    """The learning rate falls linearly to this fraction of itself over the run (1: constant)."""
    max_grad_norm: float = 10.0
    huber_delta: float = 1.0
    """Huber loss: quadratic within ±delta of the target, linear outside."""
    gamma: float = 0.9
    batch_size: int = 64
    buffer_size: int = 50_000
    compact_buffer: bool = True
    """Keep each transition's observation key (trading: the bar and the decisions, a few
    int32) instead of the observation, which is rebuilt when sampled (the same floats:
    training is bit-identical); --no-compact-buffer stores observations."""
    learning_starts: int = 1_000
    """Env steps collected before the first gradient update."""
    train_every: int = 1
    """Loop iterations (each ``num_envs`` env steps) per gradient update."""
    target_update_every: int = 250
    """Gradient updates between hard target copies (tau = 1)."""
    tau: float = 1.0
    """Target update: 1 = a hard copy every target_update_every updates, < 1 = Polyak
    averaging after every update."""
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_steps: int | None = None
    """Env steps over which ε falls linearly; ``None``: 30% of the run's env steps."""
    seed: int = 0
    """Initialisation, exploration and episode sampling."""

    def __post_init__(self) -> None:
        check({
            f"env must be 'trading' or 'cartpole', got {self.env!r}": self.env in ("trading", "cartpole"),
            "window must be >= 1": self.window >= 1,
            "features must not be empty": len(self.features) > 0,
            "episode_len must be >= 1": self.episode_len >= 1,
            f"--fill must be next-open or close, got {self.fill!r}": self.fill in ("next-open", "close"),
            f"--latency must be >= 0 bars, got {self.latency}": self.latency >= 0,
            f"--spread-bps must be >= 0, got {self.spread_bps}": (self.spread_bps or 0) >= 0,
            f"--fee-bps must be >= 0, got {self.fee_bps}": (self.fee_bps or 0) >= 0,
            f"--slippage-bps must be >= 0, got {self.slippage_bps}": (self.slippage_bps or 0) >= 0,
            "reward_scale must be > 0": self.reward_scale is None or self.reward_scale > 0,
            f"--min-epochs must be >= 0, got {self.min_epochs}": self.min_epochs >= 0,
            "train_fraction and val_fraction must be > 0 with a sum below 1, got "
            f"{self.train_fraction}, {self.val_fraction}":
                self.train_fraction > 0 and self.val_fraction > 0
                and self.train_fraction + self.val_fraction < 1,
            f"--smooth-epochs must be >= 1, got {self.smooth_epochs}": self.smooth_epochs >= 1,
            f"--psr-gate must be in (0, 1), got {self.psr_gate}": 0 < self.psr_gate < 1,
            f"--decision-every must be >= 1 bar, got {self.decision_every}":
                self.decision_every >= 1,
            "--action-augment is for --env trading (in CartPole the action moves the cart: "
            "the other actions' outcomes are not known)": not self.action_augment
                or self.env == "trading",
            "--action-augment rebuilds each action's next state from the stored bar: it needs "
            "the compact buffer (drop --no-compact-buffer)": not self.action_augment
                or self.compact_buffer,
            "--decision-every is for --env trading": self.decision_every == 1
                or self.env == "trading",
            "epochs must be >= 1": self.epochs >= 1,
            "steps_per_epoch must be >= 1": self.steps_per_epoch is None or self.steps_per_epoch >= 1,
            "num_envs must be >= 1": self.num_envs >= 1,
            "hidden sizes must be >= 1": all(h >= 1 for h in self.hidden),
            "learning_rate must be > 0": self.learning_rate > 0,
            "lr_end_fraction must be in [0, 1]": 0 <= self.lr_end_fraction <= 1,
            "max_grad_norm must be > 0": self.max_grad_norm > 0,
            "gamma must be in [0, 1)": 0 <= self.gamma < 1,
            "huber_delta must be > 0": self.huber_delta > 0,
            "batch_size must be >= 1": self.batch_size >= 1,
            "buffer_size must be >= num_envs": self.buffer_size >= self.num_envs,
            "learning_starts must be >= batch_size": self.learning_starts >= self.batch_size,
            f"learning_starts ({self.learning_starts}) must be <= buffer_size ({self.buffer_size}): "
            "the buffer never holds more, so the agent would never train":
                self.learning_starts <= self.buffer_size,
            f"patience must be >= 0, got {self.patience}": self.patience >= 0,
            f"seed must be in [0, 2**32), got {self.seed}": 0 <= self.seed < 2**32,
            "train_every must be >= 1": self.train_every >= 1,
            "target_update_every must be >= 1": self.target_update_every >= 1,
            "tau must be in (0, 1]": 0 < self.tau <= 1,
            "eps_start and eps_end must be in [0, 1]": 0 <= self.eps_end <= 1 and 0 <= self.eps_start <= 1,
            "eps_decay_steps must be >= 1": self.eps_decay_steps is None or self.eps_decay_steps >= 1,
        }, "DQN config")  # fmt: skip

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def cost(self) -> float:
        """Cost of trading one unit, as a fraction: half the spread, the fee and slippage."""
        return ((self.spread_bps or 0) / 2 + (self.fee_bps or 0) + (self.slippage_bps or 0)) * 1e-4

    @classmethod
    def from_json(cls, d: dict) -> DQNConfig:
        d = dict(d)
        d["features"], d["hidden"] = tuple(d["features"]), tuple(d["hidden"])
        if "cost_bps" in d:  # a run from before fills and cost components: its own terms
            d.setdefault("fee_bps", d.pop("cost_bps"))
            d.setdefault("spread_bps", 0.0)
            d.setdefault("slippage_bps", 0.0)
            d.setdefault("fill", "close")
            d.setdefault("min_epochs", 0)
            d.setdefault("smooth_epochs", 1)
            d.setdefault("flat_fallback", False)
            d.setdefault("compact_buffer", False)
        return cls(**d)


COSTS = {  # (spread, fee, slippage) in bp per unit traded; sources in the README
    "es": (1.5, 0.2, 0.0),  # one 0.25-point tick at ~1,650 (2013-09); CME+broker ~$2/side
    "spx": (1.0, 0.5, 0.0),  # an S&P 500 index ETF's quoted spread and a retail commission
    "nasdaq": (1.0, 0.5, 0.0),  # a NASDAQ index ETF, as for the S&P
    "btc": (2.0, 25.0, 0.0),  # BTC/USD book spread; taker fee 0.25% (2017-2019 exchanges)
}
DEFAULT_COSTS = (1.0, 0.0, 0.0)
"""Costs of a file that is not a bundled set (state yours with the flags)."""


def with_costs(cfg: DQNConfig, dataset: str | None) -> DQNConfig:
    """``cfg`` with the cost components it leaves None filled from ``dataset``'s defaults."""
    spread, fee, slip = COSTS.get(dataset or "", DEFAULT_COSTS)
    return dataclasses.replace(
        cfg,
        spread_bps=spread if cfg.spread_bps is None else cfg.spread_bps,
        fee_bps=fee if cfg.fee_bps is None else cfg.fee_bps,
        slippage_bps=slip if cfg.slippage_bps is None else cfg.slippage_bps,
    )


DQN_PRESETS = {
    "trading": DQNConfig(),
    # Verification on gymnax CartPole-v1. Rewards are scaled by 0.1 so that Q (<= 10) stays
    # mostly inside the Huber loss's quadratic zone; a 50k-transition buffer and a target copy
    # every 100 updates kept all seeds stable (10k and every-50 diverged: see the README).
    "cartpole": DQNConfig(
        env="cartpole",
        epochs=20,
        steps_per_epoch=10_000,
        num_envs=8,
        hidden=(64, 64),
        learning_rate=1e-3,
        gamma=0.99,
        batch_size=64,
        buffer_size=50_000,
        learning_starts=1_000,
        train_every=1,
        target_update_every=100,
        eps_decay_steps=20_000,
        eps_end=0.02,
        reward_scale=0.1,
        max_grad_norm=10.0,
        min_epochs=0,
    ),
}
