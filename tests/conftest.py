import contextlib
import functools
import os
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""This folder: the tests, in one folder per package, and their fixtures."""
REPO = TESTS.parent
"""The clone's root (experiments/, data/, README.md)."""

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiles dominate the suite's time: share them between this process and the
# CLI subprocesses through a persistent compilation cache (fresh per session).
_OWN_CACHE = None  # the cache folder this process made (removed when its session ends)
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # xdist workers inherit the controller's
    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
        prefix="tftjax-jax-cache-"
    )
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# How the suite compiles (docs/testing.md lists which tests run where, and why):
# - the quick tier (-m "not slow", the README's test command): little XLA optimisation work
#   (JAX_DISABLE_MOST_OPTIMIZATIONS: no expensive passes, LLVM at -O0; where a test turns
#   optimisation back on, LLVM -O1 and XLA:CPU's older element-wise code generator; the CLI
#   subprocesses inherit it). It runs each program for a few steps and compiles are most of
#   its time (the tiny TFT's train step compiles in 3.5 s instead of 11-12 s). Every
#   comparison is between programs compiled alike. The exception is QAT (xla_optimised):
#   XLA:CPU without its passes gives NaN gradients for it where the optimised program, and
#   the same program op by op, are finite.
# - TFTJAX_TEST_XLA=users (opt in; before a release): XLA's defaults, the programs users and
#   experiments/ run; conftest changes nothing of the compiler. Both tiers of .ci/run compile
#   fast; the tests whose claim is the optimised program compile it (xla_optimised).
COMPILE_AS_USERS = os.environ.get("TFTJAX_TEST_XLA", "fast") == "users"
if os.environ.get("TFTJAX_TEST_XLA", "fast") not in ("fast", "users"):
    raise SystemExit(
        f"TFTJAX_TEST_XLA must be 'fast' or 'users', got {os.environ['TFTJAX_TEST_XLA']!r}"
    )


def fast_compile(env: dict) -> dict:
    """``env`` (changed in place, and returned) with the quick tier's little XLA optimisation:
    for this process, and for the subprocesses of the full tier whose point is a comparison
    between programs compiled alike (devices, processes), not the users' compile."""
    env.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    # where a test does compile optimised (xla_optimised): LLVM's -O1 rather than its default
    # (the same XLA passes, compiles ~25% shorter: the QAT gradients 11.5 s against 17.3 s),
    # and the older element-wise code generator (the tiny train step 3.5 s against 6.5 s)
    for flag in ("--xla_backend_optimization_level=1", "--xla_cpu_use_fusion_emitters=false"):
        if flag.split("=")[0] not in env.get("XLA_FLAGS", ""):
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    return env


if not COMPILE_AS_USERS:
    fast_compile(os.environ)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from tftjax.data.bars import Bars  # noqa: E402


@contextlib.contextmanager
def xla_optimised(on: bool = True):
    """Compile with XLA's usual optimisation (``on``) or with the suite's little (``off``)
    inside the block (``jax_disable_most_optimizations`` is read at each compile)."""
    import jax

    if COMPILE_AS_USERS:  # XLA's defaults throughout
        yield
        return
    was = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", not on)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", was)


SHORT_ROWS = 700


_OWN_FOLDERS: list[str] = []  # temporary folders of this process, removed at its end


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session, exitstatus):
    import shutil

    for folder in [*_OWN_FOLDERS, *([_OWN_CACHE] if _OWN_CACHE else [])]:
        shutil.rmtree(folder, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def short_es() -> str:
    """The first 700 bars of the bundled ES file as a parquet file of this process (train /
    val / test windows 347 / 55 / 56 for the tiny preset): the runs of the suite, whose
    evaluations on every split would otherwise be most of their time. One file for all of
    them, so that they share compiled steps (the data arrays' rows are part of a program)."""
    from tftjax.data import default_parquet, read_bars, write_bars

    folder = tempfile.mkdtemp(prefix="tftjax-es-")
    _OWN_FOLDERS.append(folder)
    path = Path(folder) / f"es_{SHORT_ROWS}.parquet"
    bars = read_bars(default_parquet())
    write_bars(bars.slice(0, SHORT_ROWS), path)
    return str(path)


def call(main, *args):
    """The exit code of an entry point run in-process (its output: capsys). In-process runs
    share the worker's compiled programs; a fresh process is for what only one can show."""
    try:
        return main([str(a) for a in args])
    except SystemExit as e:  # argparse's own exits (--help)
        return e.code


def random_bars(n: int, seed: int = 0, start: str = "2013-09-02T08:00") -> Bars:
    """A random-walk bar table on a 1-minute grid with a 2-hour gap every 400 bars."""
    rng = np.random.default_rng(seed)
    step = np.full(n, 60 * 10**9, dtype=np.int64)
    step[::400] = 2 * 3600 * 10**9
    ts = np.datetime64(start, "ns").astype(np.int64) + np.cumsum(step)
    close = 1000.0 * np.exp(np.cumsum(rng.normal(0, 1e-3, n)))
    open_ = np.concatenate([[close[0]], close[:-1]]) * np.exp(rng.normal(0, 2e-4, n))
    high = np.maximum(open_, close) * (1 + rng.exponential(5e-4, n))
    low = np.minimum(open_, close) * (1 - rng.exponential(5e-4, n))
    volume = np.round(rng.lognormal(5, 1, n))
    volume[rng.random(n) < 0.05] = 0.0
    return Bars("random.parquet", ts, open_, high, low, close, volume)


def write_table(path, columns: dict) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


def bars_columns(bars: Bars) -> dict:
    return {
        "ts": pa.array(bars.ts, type=pa.int64()).cast(pa.timestamp("ns")),
        "open": bars.open, "high": bars.high, "low": bars.low,
        "close": bars.close, "volume": bars.volume,
    }  # fmt: skip


@pytest.fixture(scope="session")
def predict_run(tmp_path_factory):
    """The tiny model of one epoch on :func:`short_es` (copied to ``ROOT/bars.parquet``: its
    series is named ``bars``), in ``ROOT/run``: what the forecast tests ask."""
    import shutil

    from tiny import TINY_TRAIN

    root = tmp_path_factory.mktemp("predict")
    shutil.copy(short_es(), root / "bars.parquet")
    assert (
        call(
            __import__("tftjax.train").train.main,
            *TINY_TRAIN,
            "--epochs",
            "1",
            "--workdir",
            root / "run",
            "--parquet-file",
            root / "bars.parquet",
        )
        == 0
    )
    return root


def _mapped_regions() -> int:
    """The process's memory mappings (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Every executable XLA:CPU loads keeps its kernels' code mapped (a few mappings per
    kernel; a TFT train step is thousands): a long-lived xdist worker that kept every
    module's programs passed Linux's ``vm.max_map_count`` (65,530) after ~60 full-tier tests
    and XLA aborted inside a compile or a cache read (SIGABRT/SIGSEGV; measured: 63,839
    mappings in the last sample before the abort). The programs a module compiled are freed
    when it ends; its shared steps are module fixtures, torn down before this."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture(autouse=True)
def _mappings_below_the_limit():
    """And inside a module that compiles many programs: free them once the process holds
    half the kernel's limit of mappings (later calls recompile, or read the persistent
    cache)."""
    yield
    if _mapped_regions() > _max_map_count() // 2:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()


@pytest.fixture(scope="session")
def small_bars() -> Bars:
    return random_bars(1500, seed=1)


def leaf_errors(a, b) -> list[tuple[str, float]]:
    """Each leaf's largest difference from ``b``'s, relative to ``b``'s largest entry, by
    path (a kernel's gradients against autodiff's); every leaf of ``b`` must be nonzero, so
    that a gradient that never reaches its leaf fails instead of comparing zeros."""
    import jax

    out = []
    for (path, u), v in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
        assert np.any(v != 0), jax.tree_util.keystr(path)  # every gradient reaches its leaf
        out.append((jax.tree_util.keystr(path), np.abs(u - v).max() / np.abs(v).max()))
    return out


def on_gpu() -> bool:
    import jax

    return jax.default_backend() in ("gpu", "cuda", "rocm")


def pytest_collection_modifyitems(config, items):
    # Longest first: xdist's loadgroup hands out the groups (most tests first), then the
    # single tests in collection order; a heavy single test collected late ran alone at the
    # end of the slow tier while the other worker idled (about 90 s of its 16 minutes).
    # Stable: every worker collects the same order, as xdist requires.
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)
    if on_gpu():
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def matmul_mantissa_bits() -> int:
    """Significant bits of a float32 matmul at the backend's default precision: TF32's 11 on
    an NVIDIA GPU, float32's 24 elsewhere (what a default-precision tolerance derives from)."""
    return 11 if on_gpu() else 24


def random_inputs(cfg, batch: int, seed: int = 0):
    """Standard-normal (static, historical, known, target) of a batch for the TFT of ``cfg``."""
    import jax

    ks = jax.random.split(jax.random.key(seed), 4)
    t = cfg.data.encoder_steps + cfg.data.decoder_steps
    return (
        jax.random.normal(ks[0], (batch, cfg.model.num_static)),
        jax.random.normal(ks[1], (batch, cfg.data.encoder_steps, cfg.model.num_historical)),
        jax.random.normal(ks[2], (batch, t, cfg.model.num_known)),
        jax.random.normal(ks[3], (batch, cfg.data.decoder_steps)),
    )


# --- The compile ledger (opt in: TFTJAX_TEST_COMPILES=DIR) -------------------------------
# Every test's tracing, lowering and XLA compile seconds, and the persistent cache's hits
# and misses, one JSON line per test in DIR/<worker>.jsonl (experiments/suite_compiles.py
# sums them). The CLI subprocesses do not load conftest: their compiles are not counted.
_LEDGER_DIR = os.environ.get("TFTJAX_TEST_COMPILES")
_ledger: dict = {}


def _ledger_listeners() -> None:
    import jax.monitoring as monitoring

    seconds = {
        "/jax/core/compile/jaxpr_trace_duration": "trace_s",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
        "/jax/core/compile/backend_compile_duration": "compile_s",
        "/jax/compilation_cache/compile_time_saved_sec": "saved_s",
    }
    counts = {
        "/jax/compilation_cache/cache_hits": "hits",
        "/jax/compilation_cache/cache_misses": "misses",
    }

    def on_duration(event, duration, **kwargs):
        if event in seconds:
            _ledger[seconds[event]] = _ledger.get(seconds[event], 0.0) + duration
        if event == "/jax/core/compile/backend_compile_duration":
            name = str(kwargs.get("fun_name", "?"))
            n, s = _ledger.setdefault("programs", {}).get(name, (0, 0.0))
            _ledger["programs"][name] = (n + 1, s + duration)

    def on_event(event, **kwargs):
        if event in counts:
            _ledger[counts[event]] = _ledger.get(counts[event], 0) + 1

    monitoring.register_event_duration_secs_listener(on_duration)
    monitoring.register_event_listener(on_event)


if _LEDGER_DIR:
    _ledger_listeners()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        import json
        import time

        _ledger.clear()
        t0 = time.perf_counter()
        yield
        record = {"test": item.nodeid, "wall_s": time.perf_counter() - t0, **_ledger}
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(_LEDGER_DIR).mkdir(parents=True, exist_ok=True)
        with open(Path(_LEDGER_DIR) / f"{worker}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
