"""tftjax: Temporal Fusion Transformers and DQN traders on market bars, in JAX/Flax.

The map, one job per module, roughly in the order data flows (bars → features → windows →
model → step → run loop → checkpoints). Each module imports only what stands above it
here: ``tests/test_structure.py`` checks that, that there are no import circles, and that
this map names every module::

  errors                the error types every layer raises (DataError, ConfigError, ...)
  config.fields         a config field's command-line metadata; the checks configs share
  config.execution      ExecutionConfig: remat tier, precision, kernels, memory budget
  remat                 remat tiers → jax.checkpoint policies
  data.sessions         exchange sessions and their slot grid
  data.calendar         bar interval, time zones, the Timeline, known-future inputs
  data.instants         times a user gives (--as-of, --start, --end) on a series' clock
  config.data           DataConfig: how bars become windows, the TFT-225 layout
  config.model          TFTConfig and its parts; saved configs of any schema
  config.train          TrainConfig: how the TFT is optimised
  config.presets        the named presets: (model, train, execution) triples
  config.schema         settings files (--config, tune's best.json)
  config                the configs' names in one place
  data.bundled          the bundled bar sets (ES 1-minute, S&P 500 daily, BTC hourly)
  data.sources          where bars come from: a parquet file or a table in memory
  data.bars             read and validate a parquet OHLCV file → Bars
  data.identity         a data file's content hash, and finding the file again
  volatility            EWMA, range and HAR volatility models; the anchors of --anchor
  baselines             EWMA, rolling and naive quantile forecasts on the same windows
  data.stats            feature statistics fitted on the training rows (z-scores, target scale)
  data.rolling          rolling sums, means and extremes (the features' look-backs)
  data.features         bars → 210 historical, 10 known and 5 static features, the target
  data.windows          time-ordered splits, start-index batches, the on-device window gather
  data.anchors          the --anchor's volatility forecasts on every row of a series
  data.quality          warnings on data that passes validation (gaps, zero volume, outliers)
  data.panel            panels of several series: shared dates, late starters in folds
  data.dataset          one file → a Dataset (bars, features, splits, warnings)
  data                  the pipeline's names in one place
  losses                pinball loss, q-risk, coverage
  scoring               block bootstrap, Diebold-Mariano, Holm, Kupiec/Christoffersen, CRPS
  verdict               a walk-forward's verdict: per-fold baseline choice, DM, calibration
  quant                 fake-quant (a custom_vjp straight-through estimator), observers, int8
  quant_tree            the quantized trees: int8 variables, layer names, observers
  quant_calib           what a PTQ calibration batch records of each tensor, by method
  models.kernel_mode    how a family of blocks runs: XLA, Pallas compiled or interpreted
  models.triton_util   what the Pallas/Triton kernels share (sizes, dots, row splits)
  models.multi_tensor   element-wise work over many arrays as one Pallas kernel (casts, sums)
  models.dropout        the stacked GRNs' dropout masks
  models.fused          the fused, recomputing per-variable GRN kernel (CPU)
  models.vsn_tiles     the VSN's parameters as the Pallas kernels read and write them
  models.pallas_vsn     the same as two Pallas/Triton kernels (GPU; --vsn-kernel pallas)
  models.pallas_lstm    the LSTM recurrences as persistent Pallas kernels (--lstm-kernel)
  models.pallas_grn     the four static context GRNs as two Pallas kernels (--grn-kernel)
  models.pallas_gated  the temporal GRNs and gated add & norms as Pallas kernels (--grn-kernel)
  models.pallas_attention  the attention's softmax and mix as two Pallas kernels (--attention-kernel)
  models.kernel_params  the layers' parameters declared for the kernels that run them
  models.recurrence     the LSTM recurrence with its hand-written backward pass
  models.layers         Dense, GLU, GRN, gated add & norm, LSTM, interpretable attention
  models.folded         the selection GRN with the embeddings folded in (float and int8)
  models.vsn            variable selection networks (stacked per-variable GRNs)
  models.compute       compute dtypes, float32 islands, kernels in use, the cast parameters
  models.tft            the Temporal Fusion Transformer
  devices               what a device says of its memory
  parallel              device mesh, batch sharding, multi-host start-up
  checkpoints           Orbax epoch and final checkpoints, their names
  provenance            how a result was made (command, versions, device, revision)
  tensorboard           TensorBoard logs of a run: scalars per epoch, config, plots
  resume                what a resume may change; the latest checkpoint's metadata
  runloop               the one host loop of every trainer: resume, early stop, NaN stop
  cli.flags             command lines read from the config dataclasses
  cli                   what every entry point shares: errors → exit codes, flags
  data.synthetic        ES-like synthetic bars (python -m tftjax.data.synthetic)
  training.pallas_adamw --optimizer-kernel pallas: clip, AdamW and update as Pallas kernels
  training.state        the train state and optimizer
  training.steps        the jitted train and eval steps (accumulation, shardings)
  training.trainer      config + device data + compiled steps: train, evaluate, predict
  training.restore      open and restore checkpoints, --init-from, the SavedModel record
  training.ptq          post-training calibration of int8 activation ranges
  training.evaluation   metrics beside the baselines, the summary table
  training.anchoring    --anchor: the anchor chosen on validation, the data carrying it
  plots                 loss curves, quantile fans, variable importance, DQN equity
  training.task         the TFT's part of the run loop
  training.run          train_and_evaluate: the whole TFT job
  training              the training package's names in one place
  training.search       the Optuna search of tune and backtest --tune-trials
  memory.targets        GPU specs to compile for without a GPU (--target h100, ...)
  memory.analysis       XLA's compiled memory analysis of the steps (here or for a target)
  memory.planning       the largest batch for a budget, --remat auto's plan
  memory.hlo_cost       a compiled program's kernels, HBM bytes and FLOPs, from its HLO
  memory.cost           --cost: each tier's GPU census and a roofline estimate of its time
  memory.report         the per-tier memory and time report, profiles, plot
  memory.soak           --soak: N epochs of training, device/array/host memory per epoch
  memory                the memory package's names in one place
  export_int8           the int8 export's activation scales and zero points, sample windows
  export                safetensors export (float32 and int8) and its loader
  saved                 any saved TFT (checkpoint, run folder, export) as one record
  forecast_table        the forecast file: its tidy table, times, zones, losses, metadata
  forecast              quantile forecasts of a saved TFT from chosen origins (no lookahead)
  api                   the Python API: tftjax.load(path).forecast(bars, as_of=...)
  dqn.config            the DQN's configuration and presets
  dqn.buffer            the replay buffer
  dqn.agent             Q-network and the double-DQN loss
  dqn.metrics           Sharpe, drawdown, turnover of a position path; bars per year
  dqn.significance      the deflated-Sharpe gate, pooled seeds, the minimum detectable Sharpe
  dqn.execution         fills, latency, costs, sessions; greedy and fixed-path passes
  dqn.env               the trading environment in JAX: observations, steps, K-bar decisions
  dqn.cartpole          gymnax CartPole-v1 behind the same interface
  dqn.train             make_train: the fully jitted DQN epoch
  dqn.report            every trade of a greedy pass, hit rate, exposure, the report PNG
  dqn.tft_inputs        --tft-checkpoint: a TFT's forecasts as causal DQN inputs
  dqn.oof               out-of-fold TFT forecasts: no fold reads a model fitted on its bars
  dqn.loop              the DQN's part of the run loop
  dqn.rule              the bar to clear: a cost-aware rule on the forecast, chosen on validation
  dqn.seeds             --seeds N: agents in one vmapped program, the per-seed report
  dqn.walkforward       --folds K: the DQN's walk-forward, stitched out-of-sample equity
  dqn                   the DQN package's names in one place

Entry points (``python -m``; they import the library, never each other): ``tftjax.train``,
``tftjax.evaluate``, ``tftjax.predict``, ``tftjax.backtest`` (walk-forward folds), ``tftjax.tune`` (Optuna on validation), ``tftjax.export``,
``tftjax.memory``, ``tftjax.dqn``, ``tftjax.data``.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "load":  # tftjax.load(path): the Python API, imported on first use
        from tftjax.api import load

        return load
    raise AttributeError(f"module 'tftjax' has no attribute {name!r}")
