"""tftjax: Temporal Fusion Transformers and DQN traders on market bars, in JAX/Flax.

The packages, one job each, from the ground up (``docs/architecture.md`` draws them):

  config/    typed, frozen configs: the model's five parts, training, presets
  stats/     losses, volatility models, baselines, tests and verdicts (arrays in, numbers out)
  data/      parquet bars → validated series → features → windows on the device
  models/    the TFT and its layers; models/kernels/ the fused and Pallas kernels
  quant/     int8 fake-quant, observers, quantized trees, post-training calibration
  runner/    the run loop every trainer shares: checkpoints, resume, TensorBoard, devices
  cli/       what the entry points share: command lines from the configs, exit codes
  training/  the TFT's train state, jitted steps, trainer, evaluation, search, walk-forward
  serving/   saved models, forecasts and their table, the Python API, the export
  memory/    XLA memory analysis, batch planning, GPU censuses, the soak
  dqn/       the DQN trader: environment, agent, jitted training, walk-forward

The map, module by module in that order. Each module imports only what stands above it
here: ``tests/project/test_structure.py`` checks that, that there are no import circles, and that
this map names every module::

  errors                   the error types every layer raises (DataError, ConfigError, ...)
  config.fields            a config field's command-line metadata; the checks configs share
  config.execution         ExecutionConfig: remat tier, precision, kernels, memory budget
  data.sessions            exchange sessions and their slot grid
  data.calendar            bar interval, time zones, the Timeline, known-future inputs
  config.data              DataConfig: how bars become windows, the TFT-225 layout
  config.model             TFTConfig and its parts; saved configs of any schema
  config.train             TrainConfig: how the TFT is optimised
  config.presets           the named presets: (model, train, execution) triples
  config.schema            settings files (--config, tune's best.json)
  config                   the configs' names in one place
  stats.losses             pinball loss, q-risk, coverage
  stats.volatility         EWMA, range and HAR volatility models; the anchors of --anchor
  stats.memo               baseline fits kept by their inputs' content (a repeat is not refitted)
  stats.garch              GJR-GARCH(1,1) with filtered historical simulation
  stats.caviar             symmetric-absolute-value CAViaR, fitted on the pinball loss
  stats.seasonal           the range EWMA with an hour-of-week profile (intraday bars)
  stats.levels             the last value and the seasonal naive of a level target
  stats.baselines          EWMA, rolling and naive quantile forecasts on the same windows
  stats.scoring            block bootstrap, Diebold-Mariano, Holm, Kupiec/Christoffersen, CRPS
  stats.encompassing       Giacomini-Komunjer quantile encompassing, inference by date
  stats.verdict            a walk-forward's verdict: per-fold baseline choice, DM, calibration
  stats                    (the package's face)
  data.instants            times a user gives (--as-of, --start, --end) on a series' clock
  data.bundled             the bundled bar sets (ES 1-minute, S&P 500 daily, BTC hourly)
  data.sources             where bars come from: a parquet file or a table in memory
  data.bars                read and validate a parquet OHLCV file → Bars
  data.identity            a data file's content hash, and finding the file again
  data.feature_stats       feature statistics fitted on the training rows (z-scores, scale)
  data.rolling             rolling sums, means and extremes (the features' look-backs)
  data.covariates          your own columns → observed, known-future and static inputs
  data.features            bars → 210 historical, 10 known and 5 static features, the target
  data.windows             time-ordered splits, start-index batches, the on-device gather
  data.anchors             the --anchor's volatility forecasts on every row of a series
  data.quality             warnings on data that passes validation (gaps, zero volume, outliers)
  data.panel               panels of several series: shared dates, late starters in folds
  data.dataset             files → a Dataset (bars, features, splits, warnings)
  data                     the pipeline's names in one place
  quant.core               fake-quant (a custom_vjp straight-through estimator), observers, int8
  quant.calib              what a PTQ calibration batch records of each tensor, by method
  quant.tree               the quantized trees: int8 variables, layer names, observers
  quant                    (the package's face)
  models.remat             remat tiers → jax.checkpoint policies
  models.dropout           dropout masks as a counter-based hash of the element's index
  models.kernels.mode      KernelMode: how a family of blocks runs (XLA, Pallas compiled or not)
  models.kernels.triton_util  what the Pallas/Triton kernels share (sizes, dots, row splits)
  models.kernels.multi_tensor element-wise work over many arrays as one kernel (casts, sums)
  models.kernels.fused     the fused, recomputing per-variable GRN kernel (CPU)
  models.kernels.vsn_tiles the VSN's parameters as the Pallas kernels read and write them
  models.kernels.pallas_vsn  the VSNs' per-variable GRNs as two Pallas kernels
  models.kernels.pallas_lstm the LSTM recurrences as persistent Pallas kernels
  models.kernels.pallas_grn  the four static context GRNs as two Pallas kernels
  models.kernels.pallas_gated the temporal GRNs and gated add & norms as Pallas kernels
  models.kernels.pallas_attention the attention's softmax and mix as two Pallas kernels
  models.kernels.pallas_adamw the optimizer step (clip, AdamW, update) as Pallas kernels
  models.kernels.params    the layers' parameters declared for the kernels that run them
  models.kernels           (the package's face)
  models.compute           compute dtypes, float32 islands, kernels in use, cast parameters
  models.recurrence        the LSTM recurrence with its hand-written backward pass
  models.layers            Dense, GLU, GRN, gated add & norm, LSTM, interpretable attention
  models.folded            the selection GRN with the embeddings folded in (float and int8)
  models.vsn               variable selection networks (stacked per-variable GRNs)
  models.blocks            which implementation runs each block (XLA, Pallas, quantized)
  models.tft               the Temporal Fusion Transformer
  models                   (the package's face)
  quant.ptq                post-training calibration of int8 activation ranges
  runner.devices           what a device says of its memory
  runner.checkpoints       Orbax epoch, step and final checkpoints, their names
  runner.provenance        how a result was made (command, versions, device, revision)
  runner.tensorboard       TensorBoard logs of a run: scalars per epoch, config, plots
  runner.resume            what a resume may change; the latest checkpoint's metadata
  runner.preemption        signals, saves within an epoch, exit 75: "saved, resume me"
  runner.loop              the one host loop of every trainer: resume, early stop, NaN stop
  runner.mesh              device mesh, batch sharding, multi-host start-up
  runner                   (the package's face)
  cli.flags                command lines read from the config dataclasses
  cli.options              each command's options beyond the configs (train, predict, ...)
  cli                      what every entry point shares: errors → exit codes, flags
  data.synthetic           ES-like synthetic bars (python -m tftjax.data.synthetic)
  training.optimizer       clip + AdamW as one optax transformation: optax, flat or Pallas
  training.state           the train state
  training.steps           the jitted train and eval steps (accumulation, shardings)
  training.trainer         config + device data + compiled steps: train, evaluate, predict
  training.restore         open and restore checkpoints, --init-from, the SavedModel record
  training.evaluation      metrics beside the baselines, the summary table
  training.anchoring       --anchor: the anchor chosen on validation, the data carrying it
  training.finetune        --init-from on new bars: the data checked to extend, its lineage
  plots                    loss curves, quantile fans, variable importance, DQN equity
  training.epoch           one epoch's running sums, loss checks and profiler window
  training.task            the TFT's part of the run loop
  training.run             train_and_evaluate: the whole TFT job
  training                 the training package's names in one place
  training.search          the Optuna search of tune and backtest --tune-trials
  training.preregistration  --preregistered: a committed recipe checked, its hash recorded
  training.walkforward     the TFT's walk-forward against the baselines (backtest)
  serving.table            the forecast file: its tidy table, times, zones, losses, metadata
  serving.forecast         quantile forecasts of a saved TFT from chosen origins (no lookahead)
  serving.report           a forecast on the terminal (each series' last origin) and as fans
  serving.int8             the int8 export's activation scales and zero points, sample windows
  serving.export           safetensors export (float32 and int8) and its loader
  serving.saved            any saved TFT (checkpoint, run folder, export) as one record
  serving.api              the Python API: tftjax.load(path).forecast(bars, as_of=...)
  serving                  (the package's face)
  memory.targets           GPU specs to compile for without a GPU (--target h100, ...)
  memory.analysis          XLA's compiled memory analysis of the steps (here or for a target)
  memory.planning          the largest batch for a budget, --remat auto's plan
  memory.report            the per-tier memory and time report, profiles, plot
  memory                   the memory package's names in one place
  memory.hlo_cost          a compiled program's kernels, HBM bytes and FLOPs, from its HLO
  memory.cost              --cost: each tier's GPU census and a roofline estimate of its time
  memory.soak              --soak: N epochs of training, device/array/host memory per epoch
  dqn.config               the DQN's configuration and presets
  dqn.buffer               the replay buffer
  dqn.agent                Q-network and the double-DQN loss
  dqn.metrics              Sharpe, drawdown, turnover of a position path; bars per year
  dqn.significance         the deflated-Sharpe gate, pooled seeds, the minimum detectable Sharpe
  dqn.execution            fills, latency, costs, sessions; greedy and fixed-path passes
  dqn.env                  the trading environment in JAX: observations, steps, K-bar decisions
  dqn.cartpole             gymnax CartPole-v1 behind the same interface
  dqn.train                make_train: the fully jitted DQN epoch
  dqn.report               every trade of a greedy pass, hit rate, exposure, the report PNG
  dqn.tft_inputs           --tft-checkpoint: a TFT's forecasts as causal DQN inputs
  dqn.oof                  out-of-fold TFT forecasts: no fold reads a model fitted on its bars
  dqn.loop                 the DQN's part of the run loop
  dqn.rule                 the bar to clear: a cost-aware rule on the forecast, chosen on validation
  dqn.seeds                --seeds N: agents in one vmapped program, the per-seed report
  dqn.walkforward          --folds K: the DQN's walk-forward, stitched out-of-sample equity
  dqn                      the DQN package's names in one place

Entry points (``python -m``; each parses its command line and calls a library function, and
none imports another): ``tftjax.train``, ``tftjax.evaluate``, ``tftjax.predict``,
``tftjax.backtest`` (walk-forward folds), ``tftjax.tune`` (Optuna on validation),
``tftjax.export``, ``tftjax.memory``, ``tftjax.dqn``, ``tftjax.data``; the same as
``tftjax-train``, ``tftjax-evaluate`` … once installed (``[project.scripts]``).
"""

__version__ = "0.2.0"


def __getattr__(name: str):
    if name == "load":  # tftjax.load(path): the Python API, imported on first use
        from tftjax.serving.api import load

        return load
    raise AttributeError(f"module 'tftjax' has no attribute {name!r}")
