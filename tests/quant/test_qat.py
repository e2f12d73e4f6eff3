"""Quantization-aware training in the TFT: gradients under every remat tier equal the
no-remat QAT gradients leaf by leaf, observers (moving average, freeze, once per step),
the int8 matmuls against numpy, int8 inference against fake-quant, export → load →
same predictions, exact resume, --init-from and PTQ, and the bad-input refusals."""

import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO, call, random_inputs, short_es, xla_optimised
from safetensors.numpy import load_file
from tiny import TINY_TRAIN, raw_state, tiny_tft

from tftjax import evaluate as evaluate_cli
from tftjax import export as export_cli
from tftjax import train as train_cli
from tftjax.config import ConfigError, preset
from tftjax.models.compute import quant_spec
from tftjax.models.tft import TFT, init_variables
from tftjax.quant.core import (
    MinMax,
    activation_qparams,
    fake_quant,
    fake_quant_weight,
    int8_bmm,
    int8_dense,
    quantize_activation,
    quantize_weight,
    update_observers,
)
from tftjax.quant.tree import int8_variables
from tftjax.serving import export as export_lib
from tftjax.stats import losses
from tftjax.training.trainer import to_int8

B = 8


@pytest.fixture(scope="module", autouse=True)
def optimised():
    # QAT compiles with XLA's usual optimisation, not the suite's little (conftest.py): at
    # -O0 XLA:CPU gives NaN gradients for QAT (e.g. in static_enrichment under the encoders'
    # remat, and after a few steps of a QAT run) where the optimised program, and the same
    # program run op by op, are finite and equal to the no-remat gradients.
    # and full float32 matmuls on every backend (the tier equalities; TF32 on NVIDIA GPUs)
    with xla_optimised(), jax.default_matmul_precision("highest"):
        yield


# Under `pytest -n 2 --dist loadgroup` each group runs on one worker, so the module
# fixtures (and their compiles) are built once.
MODEL = pytest.mark.xdist_group("qat_model")
RUN = pytest.mark.xdist_group("qat_run")


def small(tier="off", **kw):
    # Few input variables: the same layers as TFT-225, a fraction of the compile time.
    # vsn_chunk=3 chunks (and pads) every VSN in the tiers that chunk.
    return preset(
        "tiny", num_static=3, num_historical=7, num_known=4, qat=True, remat=tier, vsn_chunk=3, **kw
    )


def inputs(cfg, seed):
    return random_inputs(cfg, B, seed)


def observed(module, spec, variables, *args, mutable=(), **kw):
    """A training step's observers: the forward records each observed tensor's range
    (``quant_batch``), then every observer moves once (what the train step does)."""
    out, rec = module.apply(variables, *args, mutable=["quant_batch", *mutable], **kw)
    return out, update_observers(variables["quant_stats"], rec.get("quant_batch", {}), spec), rec


def observe_step(cfg):
    return jax.jit(lambda v, x: observed(TFT(cfg), quant_spec(cfg), v, *x[:3])[1])


def predict(cfg, mode, variables, x):
    return _predict(cfg, mode)(variables, tuple(x[:3]))


@functools.lru_cache(maxsize=None)
def _predict(cfg, mode):
    # a trained run's model has an instrument vocabulary: its windows' rows (0, its series)
    return jax.jit(
        lambda v, x: TFT(cfg, mode).apply(v, *x, True, jnp.zeros(x[0].shape[0], jnp.int32))[0]
    )


def counts(stats):
    # MinMax leaves (GetAttrKey) or restored as plain dicts (DictKey)
    return {
        int(c)
        for p, a in jax.tree_util.tree_flatten_with_path(stats)[0]
        if getattr(p[-1], "name", getattr(p[-1], "key", None)) == "count"
        for c in np.ravel(a)
    }


# The heavy fixtures are cached per process (not only per module): xdist may tear module
# fixtures down between batches of work, and each rebuild is minutes of compiles.
@pytest.fixture(scope="module")
def model():
    return _model()


@functools.lru_cache(maxsize=None)
def _model():
    """Params and observers that have seen one batch (so every quantizer is active). The
    batch the tests step with is another: a step quantizes with the ranges from before it,
    and with this one's own ranges its extreme values would sit exactly on the clip edges,
    where a remat tier's last-ulp differences flip the straight-through mask."""
    cfg = small()
    x = inputs(cfg, 0)
    v = init_variables(cfg, jax.random.key(1))
    assert counts(v["quant_stats"]) == {0}
    return cfg, x, {"params": v["params"], "quant_stats": observe_step(cfg)(v, inputs(cfg, 1))}


def loss_and_grads(tier, variables, x):
    cfg = small(tier)

    def loss(p):
        (pred, _), stats, _ = observed(
            TFT(cfg),
            quant_spec(cfg),
            {"params": p, "quant_stats": variables["quant_stats"]},
            *x[:3],
            False,
            rngs={"dropout": jax.random.key(7, impl="rbg")},
        )
        return losses.quantile_loss(x[3], pred, cfg.head.quantiles), stats

    (value, stats), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(variables["params"])
    return float(value), stats, grads


@pytest.fixture(scope="module")
def reference(model):
    return _reference()


@functools.lru_cache(maxsize=None)
def _reference():
    _, x, v = _model()
    return loss_and_grads("off", v, x)


@pytest.mark.slow
@MODEL
def test_qat_gradients_reach_every_leaf(reference, model):
    _, _, grads = reference
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        assert np.any(np.asarray(g) != 0), jax.tree_util.keystr(path)
    # and they differ from the float model's: the fake-quant is in the graph
    cfg, x, v = model
    float_pred, fake_pred = predict(cfg, "float", v, x), predict(cfg, "fake", v, x)
    assert float(jnp.abs(float_pred - fake_pred).max()) > 1e-4


# offload is aggressive's plan on CPU (tests/models/test_remat.py checks that); minimal's one
# mechanism (the LSTM step checkpointed inside its scan) is part of both tiers tested
@pytest.mark.slow
@MODEL
@pytest.mark.parametrize("tier", ["aggressive", "full"])
def test_remat_tiers_give_the_no_remat_qat_gradients(tier, model, reference):
    _, x, v = model
    ref_loss, ref_stats, ref_grads = reference
    value, stats, grads = loss_and_grads(tier, v, x)
    # The tiers chunk the VSNs (vsn_chunk=3), so their float32 sums round off differently in
    # the last ulp, and an activation that sits within that of a rounding boundary lands one
    # int8 step away (~1e-5 of the values near the top of the grid; the fake-quant's
    # straight-through mask and every value downstream follow). One such flip moves one of
    # the B·T terms of a weight gradient's sum by about a step: ~1e-4 of the leaf at most.
    # The bounds allow ten flips; a wrong recomputation or a lost gradient is off by O(1).
    assert value == pytest.approx(ref_loss, rel=1e-4)
    flat_ref = jax.tree_util.tree_flatten_with_path(ref_grads)[0]
    flat = dict(jax.tree_util.tree_flatten_with_path(grads)[0])
    assert len(flat) == len(flat_ref)
    floor = 1e-6 * max(np.linalg.norm(np.asarray(g)) for _, g in flat_ref)
    for path, g_ref in flat_ref:
        g, g_ref = np.asarray(flat[path], np.float64), np.asarray(g_ref, np.float64)
        assert np.any(g != 0), f"{tier}: {jax.tree_util.keystr(path)} frozen"
        assert np.linalg.norm(g - g_ref) <= max(1e-3 * np.linalg.norm(g_ref), floor), (
            f"{tier}: {jax.tree_util.keystr(path)}"
        )
    # the observers moved once in this step (count 1 → 2), not again in the recomputation,
    # and to the same values as without remat (up to the flips above: the moving average
    # takes 0.01 of a batch range, so a flip moves an observer by 0.01 of a step at most)
    assert counts(stats) == {2}
    chex.assert_trees_all_close(stats, ref_stats, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@MODEL
def test_observers_follow_the_moving_average_and_freeze(model):
    cfg, _, v = model
    cfg = cfg.override(qat_freeze_after=2)
    params = {"params": v["params"]}
    stats = init_variables(cfg, jax.random.key(1))["quant_stats"]
    history, lo, hi = [], None, None
    # independent reference: the quantile head's input is the output gate's output, captured
    # in the same forward pass; PyTorch's moving average written out (one compile: the
    # function is made once, outside the loop)
    step = jax.jit(
        lambda v, x: observed(
            TFT(cfg),
            quant_spec(cfg),
            v,
            *x[:3],
            capture_intermediates=True,
            mutable=["intermediates"],
        )
    )
    for seed in (10, 11, 12):
        x = inputs(cfg, seed)
        _, stats, upd = step({**params, "quant_stats": stats}, x)
        head_in = np.asarray(upd["intermediates"]["output_gate"]["__call__"][0])
        if len(history) < 2:
            lo = head_in.min() if lo is None else lo + 0.01 * (head_in.min() - lo)
            hi = head_in.max() if hi is None else hi + 0.01 * (head_in.max() - hi)
        history.append(jax.device_get(stats))
        obs = stats["quantiles"]["kernel_in"]
        np.testing.assert_allclose([float(obs.min), float(obs.max)], [lo, hi], rtol=1e-5)
    assert [counts(h) for h in history] == [{1}, {2}, {2}]
    moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), history[0], history[1])
    assert all(jax.tree.leaves(moved))  # every observer moved in step 2 ...
    chex.assert_trees_all_equal(history[1], history[2])  # ... and none after the freeze


@pytest.mark.slow  # the QAT model (qat_model, with the slow tier's)
@MODEL
def test_int8_matmuls_equal_the_dequantized_product():
    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 1.0, size=(6, 5, 9)).astype(np.float32)
    w = rng.normal(size=(9, 4)).astype(np.float32)
    s, zp = activation_qparams(MinMax(jnp.float32(x.min()), jnp.float32(x.max()), 1))
    qw, sw = quantize_weight(jnp.asarray(w), 1)
    assert qw.dtype == jnp.int8 and sw.shape == (1, 4)
    qx = quantize_activation(jnp.asarray(x), s, zp)
    want = ((np.asarray(qx, np.float64) - float(zp)) * float(s)) @ (
        np.asarray(qw, np.float64) * np.asarray(sw, np.float64)
    )
    got = int8_dense(qx, s, zp, qw, sw)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=1e-6)
    # same as the fake-quant product
    fq = jnp.asarray(fake_quant(jnp.asarray(x), s, zp)) @ fake_quant_weight(jnp.asarray(w), 1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fq), rtol=1e-5, atol=1e-6)
    # per-variable (stacked) version: [m, N, i] × [m, i, o]
    xb = rng.normal(size=(3, 7, 5)).astype(np.float32) * np.float32([[[1]], [[5]], [[0.1]]])
    wb = rng.normal(size=(3, 5, 6)).astype(np.float32)
    sb, zb = activation_qparams(MinMax(jnp.asarray(xb.min((1, 2))), jnp.asarray(xb.max((1, 2))), 1))
    qwb, swb = quantize_weight(jnp.asarray(wb), (0, 2))
    assert swb.shape == (3, 1, 6)
    qxb = quantize_activation(jnp.asarray(xb), sb[:, None, None], zb[:, None, None])
    want = np.einsum(
        "mni,mio->mno",
        (np.asarray(qxb, np.float64) - np.asarray(zb)[:, None, None])
        * np.asarray(sb)[:, None, None],
        np.asarray(qwb, np.float64) * np.asarray(swb),
    )
    np.testing.assert_allclose(
        np.asarray(int8_bmm(qxb, sb, zb, qwb, swb)), want, rtol=2e-6, atol=1e-6
    )


def _module_cases():
    from tftjax.models.layers import LSTM, Dense
    from tftjax.models.vsn import VariableSelection

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(0.3, 1.0, size=(16, 12)), jnp.float32)
    seq = jnp.asarray(rng.normal(size=(4, 9, 7)), jnp.float32)
    carry = (
        jnp.asarray(rng.normal(size=(4, 8)), jnp.float32),
        jnp.asarray(rng.normal(size=(4, 8)), jnp.float32),
    )
    ctx = jnp.asarray(rng.normal(size=(4, 1, 8)), jnp.float32)
    vsn = (lambda q: VariableSelection(7, 3, 8, chunk=4, quant=q), (seq, ctx))
    return {
        "dense": (lambda q: Dense(5, quant=q), (x,)),
        "lstm": (lambda q: LSTM(8, quant=q), (carry, seq)),
        # 7 variables in chunks of 4: the padded variable runs through the int8 path too;
        # the selection GRN with its embeddings folded (models/folded.py)
        "vsn": vsn,
        "vsn_options": vsn,
    }


OPTIONS = dict(act_symmetric=True, weight_granularity="tensor", stacked_scales="variable")


@pytest.mark.slow  # the QAT model (qat_model, with the slow tier's)
@MODEL
@pytest.mark.parametrize("name", ["dense", "lstm", "vsn", "vsn_options"])
def test_int8_layer_within_one_step_of_fake_quant(name):
    # Each quantized layer kind alone (Dense, LSTM input and recurrence, stacked per-variable
    # GRNs with the folded selection GRN), with the default scales and with the options
    # (symmetric activations, per-tensor weights, per-variable stacked scales): the int8 path
    # (int8 operands, int32 accumulation) gives outputs within one quantisation step of the
    # fake-quant forward. Steps: the Dense's output grid s_x·s_w (per channel); otherwise the
    # coarsest activation grid inside.
    from tftjax.quant.core import QuantSpec

    make, args = _module_cases()[name]
    opts = OPTIONS if name.endswith("_options") else {}
    fake_spec, int8_spec = QuantSpec("fake", **opts), QuantSpec("int8", **opts)
    v = jax.jit(make(fake_spec).init)(jax.random.key(0), *args)
    _, stats, _ = jax.jit(lambda v: observed(make(fake_spec), fake_spec, v, *args))(v)
    v = {"params": v["params"], "quant_stats": stats}
    fake = jax.jit(lambda v: make(fake_spec).apply(v, *args))(v)
    i8 = {
        **jax.jit(int8_variables, static_argnums=1)(v["params"], int8_spec),
        "quant_stats": v["quant_stats"],
    }
    assert {a.dtype for a in jax.tree.leaves(i8["params"])} >= {jnp.dtype(jnp.int8)}
    got = jax.jit(lambda v: make(int8_spec).apply(v, *args))(i8)
    scales = [
        np.max(np.asarray(activation_qparams(st, fake_spec.symmetric)[0]))
        for st in jax.tree.leaves(v["quant_stats"], is_leaf=lambda t: isinstance(t, MinMax))
    ]
    if name.startswith("dense"):
        step = float(scales[0]) * np.asarray(i8["weight_scale"]["kernel"]).reshape(-1)
    else:
        step = max(scales)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(fake)):
        diff = np.abs(np.asarray(a) - np.asarray(b))
        assert np.all(diff <= step), (name, diff.max(), step)
        assert diff.max() > 0 or name.startswith("dense")  # (really different code)


@pytest.mark.slow  # the QAT model (qat_model, with the slow tier's)
@MODEL
def test_quant_options_against_numpy():
    # symmetric activations, per-tensor weights and per-variable stacked scales against
    # numpy's round-and-clip written out (PyTorch's formulas; the reciprocal in float32)
    from tftjax.quant.core import QuantSpec

    rng = np.random.default_rng(3)
    f32 = np.float32
    x = rng.normal(0.7, 2.0, size=200).astype(f32)
    s, zp = activation_qparams(MinMax(jnp.float32(x.min()), jnp.float32(x.max()), 1), True)
    s_np = f32(max(-min(x.min(), 0), max(x.max(), 0)) / f32(127.5))
    assert float(zp) == 0 and float(s) == pytest.approx(float(s_np), rel=1e-7)
    want = np.clip(np.round(x * (f32(1) / f32(s))), -128, 127) * f32(s)
    np.testing.assert_array_equal(np.asarray(fake_quant(jnp.asarray(x), s, zp)), want)
    assert QuantSpec().axes("kernel") == (1,) and QuantSpec().axes("glu_k") == (0, 2)
    w = rng.normal(size=(6, 4)).astype(f32)
    axes = QuantSpec(weight_granularity="tensor").axes("kernel")
    assert axes == () and QuantSpec(weight_granularity="tensor").axes("w_h") == ()
    q, sw = quantize_weight(jnp.asarray(w), axes)
    sw_np = f32(np.abs(w).max() / f32(127))
    sw = np.asarray(sw)
    assert sw.shape == (1, 1) and float(sw[0, 0]) == pytest.approx(float(sw_np), rel=1e-7)
    np.testing.assert_array_equal(np.asarray(q), np.clip(np.round(w * (f32(1) / sw)), -127, 127))
    wb = (rng.normal(size=(3, 5, 6)) * np.array([1, 5, 0.1])[:, None, None]).astype(f32)
    axes = QuantSpec(stacked_scales="variable").axes("glu_k")
    assert axes == (0,) and QuantSpec(stacked_scales="variable").axes("emb_k") == (0,)
    q, sw = quantize_weight(jnp.asarray(wb), axes)
    sw_np = (np.abs(wb).max((1, 2)) / f32(127))[:, None, None]
    np.testing.assert_allclose(np.asarray(sw), sw_np, rtol=1e-7)
    np.testing.assert_array_equal(
        np.asarray(q), np.clip(np.round(wb * (f32(1) / np.asarray(sw))), -127, 127)
    )


@pytest.mark.slow
@MODEL
def test_int8_model_tracks_the_fake_quant_model(model):
    # Whole model: every quantizer of the int8 path sees the same integers up to float
    # round-off, but a value within round-off of a rounding boundary can land one step away
    # and move what follows; predictions agree closely, not bit for bit.
    cfg, x, v = model
    fake = predict(cfg, "fake", v, x)
    i8 = {
        **jax.jit(int8_variables, static_argnums=1)(v["params"], quant_spec(cfg, "int8")),
        "quant_stats": v["quant_stats"],
    }
    assert all(
        a.dtype == jnp.int8
        for a in jax.tree.leaves(
            jax.tree_util.tree_map_with_path(
                lambda p, a: a if p[-1].key == "kernel" else None, i8["params"]
            )
        )
    )
    got = predict(cfg, "int8", i8, x)
    assert float(jnp.abs(got - fake).max()) <= 0.05 * float(jnp.std(fake))


# ------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def qat_run(tmp_path_factory):
    return _qat_run(tmp_path_factory.getbasetemp())


@functools.lru_cache(maxsize=None)
def _qat_run(base):
    root = Path(tempfile.mkdtemp(prefix="qat-", dir=base))
    rc = call(train_cli.main, *tiny_tft("--qat", "--epochs", "2", "--workdir", root / "run"))
    assert rc == 0
    return root


@pytest.mark.slow
@RUN
def test_qat_summary_export_and_evaluate(qat_run, capsys):
    summary = json.loads((qat_run / "run" / "summary.json").read_text())
    assert set(summary["variants"]) == {"float", "int8"}
    t = summary["model"]["test"]["loss"]
    assert summary["variants"]["int8"]["test"]["loss"] == pytest.approx(t, rel=0.02)
    assert summary["variants"]["float"]["test"]["loss"] != t
    out = qat_run / "export"
    capsys.readouterr()
    assert (
        call(export_cli.main, "--checkpoint", qat_run / "run", "--out", out, "--samples", 32) == 0
    )
    assert "x smaller" in capsys.readouterr().out
    exp = export_lib.load(out)
    ckpt = sorted((qat_run / "run" / "checkpoints").glob("tft_final_epoch*"))[-1]
    state = raw_state(ckpt)
    chex.assert_trees_all_equal(exp.float_variables["params"], state["params"])
    chex.assert_trees_all_equal(
        export_lib.flatten(exp.variables["quant_stats"], ""),
        export_lib.flatten(state["quant_stats"], ""),
    )
    # export → load → the same int8 predictions as the int8 path of the checkpoint
    cfg = exp.cfg
    x = inputs(cfg, 3)
    want = {
        **to_int8(state["params"], quant_spec(cfg, "int8")),  # (int8_variables, jitted)
        "quant_stats": state["quant_stats"],
    }
    # as host arrays in the export's own tree (observers as MinMax): one compiled predict
    want = export_lib.unflatten(jax.device_get(export_lib.flatten(want, "v")))["v"]
    a, b = predict(cfg, "int8", want, x), predict(cfg, "int8", exp.variables, x)
    chex.assert_trees_all_equal(a, b)
    assert call(evaluate_cli.main, "--checkpoint", out) == 0
    printed = capsys.readouterr().out
    assert "TFT int8 (export)" in printed and "TFT: float, no quant" in printed
    # the export rebuilt in plain numpy (a fresh process: no jax, flax or tftjax imported)
    # reproduces tftjax's int8 outputs on the bundled ES windows it holds
    ref = REPO / "experiments" / "int8_numpy_reference.py"
    r = subprocess.run(
        [sys.executable, str(ref), "--export", str(out), "--json"], capture_output=True, text=True
    )
    assert r.returncode in (0, 1), r.stderr  # 1: not every window within one step
    got = json.loads(r.stdout)
    # Window by window: within one output step, or a rounding flip. numpy's exp and tanh and
    # XLA's own approximations may differ in the last ulp (per CPU and per compile), and a
    # value that then lies within that of a rounding boundary takes the other int8 code and
    # moves everything after it in its window, in no other window (measured: every window
    # exact with the quick tier's compile; 1 of 8 off by 179 steps as users compile). With
    # p = 1/8 a window, more than half of 32 windows flip with probability ~1e-7 (binomial);
    # a wrong rebuild (an op, a scale, a layout) misses every window.
    assert got["imported"] == [] and got["windows"] == 32, got
    assert got["windows_within_one_step"] >= 16, got
    samples = load_file(str(out / "samples.safetensors"))
    assert samples["int8_output"].shape == (32, cfg.data.decoder_steps, len(cfg.head.quantiles))
    # a float-only export: one line, exit 2
    import shutil

    f32_only = out.parent / "float_only"
    shutil.copytree(out, f32_only)
    (f32_only / "model_int8.safetensors").unlink()
    r = subprocess.run(
        [sys.executable, str(ref), "--export", str(f32_only)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "holds float32 weights only" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
@RUN
def test_qat_resume_equals_the_uninterrupted_run(qat_run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(qat_run / "run", copy)
    for name in ("tft_epoch_2", "tft_final_epoch2"):
        shutil.rmtree(copy / "checkpoints" / name)
    assert call(train_cli.main, "--resume", "--workdir", copy, "--no-progress") == 0
    a = raw_state(copy / "checkpoints" / "tft_epoch_2")
    chex.assert_trees_all_equal(a, raw_state(qat_run / "run" / "checkpoints" / "tft_epoch_2"))
    assert counts(a["quant_stats"]) == {6}  # 2 epochs × 3 steps, one observation each


@pytest.mark.slow
@RUN
def test_init_from_a_float_run_and_ptq(qat_run, tmp_path, capsys):
    flt = tmp_path / "float"
    # a float run at the suite's own compile and precision (this module's fixture sets
    # "highest"): the suite's other tiny runs compile these steps
    with xla_optimised(False), jax.default_matmul_precision(None):
        assert call(train_cli.main, *tiny_tft("--epochs", "1", "--workdir", flt)) == 0
    capsys.readouterr()
    assert call(evaluate_cli.main, "--checkpoint", flt, "--int8", "--calibrate", "2") == 0
    printed = capsys.readouterr().out
    assert (
        "calibrated on 2 training batches (minmax, PTQ)" in printed
        and "TFT: int8 inference" in printed
    )
    for args, expect in (
        (["--int8", "--act-symmetric"], "--act-symmetric choose how a PTQ"),
        (
            ["--int8", "--calibrate", "2", "--stacked-scales", "bogus"],
            "--stacked-scales must be one of channel, variable, got 'bogus'",
        ),
    ):
        assert call(evaluate_cli.main, "--checkpoint", flt, *args) == 2
        err = capsys.readouterr().err
        assert expect in err and err.count("\n") == 1, err
    from tftjax.config import TFTConfig
    from tftjax.data import load_dataset
    from tftjax.training import initial_weights

    # --init-from a float run: its weights, observers empty
    summary = json.loads((qat_run / "run" / "summary.json").read_text())
    qcfg = TFTConfig.from_json(summary["identity"]["model"])
    ds = load_dataset(short_es(), qcfg.data)
    init = initial_weights(flt, qcfg, ds)
    float_ckpt = sorted((flt / "checkpoints").glob("tft_final_epoch*"))[-1]
    chex.assert_trees_all_equal(init.params, raw_state(float_ckpt)["params"])
    assert init.quant_stats is None and init.source["qat"] is False
    # QAT → QAT of the same layers: the observers come along (ranges kept, their count
    # restarted at 1 so that --qat-freeze-after counts this run's steps)
    ft = qat_run / "run"
    init = initial_weights(ft, qcfg, ds)
    saved = raw_state(sorted((ft / "checkpoints").glob("tft_final_epoch*"))[-1])["quant_stats"]
    assert counts(saved) == {6} and counts(init.quant_stats) == {1}
    chex.assert_trees_all_equal(
        export_lib.flatten(saved, "")["/quantiles/kernel_in/max"],
        export_lib.flatten(init.quant_stats, "")["/quantiles/kernel_in/max"],
    )


@RUN
@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["--qat", "--qat-freeze-after", "-1"],
            "--qat-freeze-after must be >= 1 (observers need one batch), got -1",
        ),
        (
            ["--qat", "--qat-layers", "attention/*", "lstm_enc"],
            "--qat-layers lstm_enc matches no layer",
        ),
        (["--qat-freeze-after", "5"], "need --qat"),
        (["--qat", "--init-from", "nowhere"], "--init-from nowhere: no such checkpoint"),
        (
            ["--qat", "--stacked-scales", "bogus"],
            "--stacked-scales must be one of channel, variable, got 'bogus'",
        ),
        (
            ["--qat", "--weight-granularity", "row"],
            "--weight-granularity must be one of channel, tensor",
        ),
        (["--act-symmetric"], "need --qat (or a PTQ --calibrate)"),
    ],
)
def test_bad_qat_flags_exit_2(args, expect, tmp_path, capsys):
    rc = call(train_cli.main, *TINY_TRAIN, "--workdir", tmp_path / "run", *args)
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@RUN
def test_init_from_another_model_and_bad_exports_exit_2(qat_run, tmp_path, capsys):
    rc = call(
        train_cli.main,
        *tiny_tft(),
        "--hidden-size",
        "8",
        "--qat",
        "--init-from",
        qat_run / "run",
        "--workdir",
        tmp_path / "run",
    )
    err = capsys.readouterr().err
    assert rc == 2 and "another model than this run's: model.hidden: 16 there, 8 now" in err, err
    from tiny import other_file

    rc = call(
        train_cli.main,
        *TINY_TRAIN,
        "--qat",
        "--init-from",
        qat_run / "run",
        "--parquet-file",
        other_file(tmp_path),
        "--workdir",
        tmp_path / "run",
    )
    err = capsys.readouterr().err
    # other data that does not continue the parent's: refused (tftjax.training.finetune)
    assert rc == 2 and "other.parquet: its first bar" in err and "continues its parent" in err, err
    rc = call(export_cli.main, "--checkpoint", tmp_path / "missing", "--out", tmp_path / "o")
    err = capsys.readouterr().err
    assert rc == 2 and "no such checkpoint" in err and not (tmp_path / "o").exists()
    rc = call(export_cli.main, "--checkpoint", qat_run / "run", "--out", qat_run / "run")
    assert rc == 2 and "not an empty folder" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        preset("tiny", qat_layers=())
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@RUN
def test_a_qat_checkpoint_from_before_the_folded_layout_is_refused(qat_run, tmp_path, capsys):
    """A QAT run saved before quant_format (its selection observers held the flat
    embeddings' ranges): evaluate and --resume refuse it in one line; --init-from keeps its
    weights and drops its observers."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(qat_run / "run", old)
    newer = tmp_path / "newer"  # 917d886 until quant_format: the layout told by its settings
    shutil.copytree(qat_run / "run", newer)
    for run, fields in (
        (old, ("quant_format", "stacked_scales", "weight_granularity", "act_symmetric")),
        (newer, ("quant_format",)),
    ):
        for meta in run.glob("checkpoints/*/meta/metadata"):
            m = json.loads(meta.read_text())
            model = m["identity"]["model"]  # written flat, as tftjax wrote it then (schema 1)
            m["identity"]["model"] = {
                k: v
                for part in ("model", "head", "quant", "execution", "data")
                for k, v in model[part].items()
            }
            for f in fields:
                (m["identity"] if f == "quant_format" else m["identity"]["model"]).pop(f)
            meta.write_text(json.dumps(m))
    for main, args in (
        (evaluate_cli.main, ["--checkpoint", old, "--int8"]),
        (train_cli.main, ["--resume", "--workdir", old, "--epochs", "3", "--no-progress"]),
    ):
        assert call(main, *args) == 2
        err = capsys.readouterr().err
        assert "before quantization format 2" in err and err.count("\n") == 1, err
    from tftjax.config import TFTConfig
    from tftjax.data import load_dataset
    from tftjax.training import initial_weights

    summary = json.loads((old / "summary.json").read_text())
    qcfg = TFTConfig.from_json(summary["identity"]["model"])
    ds = load_dataset(short_es(), qcfg.data)
    init = initial_weights(old, qcfg, ds)
    assert init.quant_stats is None and "observers start empty" in init.note
    # a run of the folded layout that predates the marker: its observers are kept, and its
    # identity reads as format 2 (a resume compares it equal to a new run's)
    assert initial_weights(newer, qcfg, ds).quant_stats is not None
    from tftjax.runner.checkpoints import read_meta
    from tftjax.training.task import TFTTask

    ck = sorted((newer / "checkpoints").glob("tft_final_epoch*"))[-1]
    assert TFTTask.normalize_identity(read_meta(ck)["identity"])["quant_format"] == 2


@pytest.mark.slow  # the QAT model (qat_model, with the slow tier's)
@MODEL
def test_layer_patterns_choose_what_is_quantized():
    cfg = small(qat_layers=("attention/*", "lstm_*/w_h", "*_vsn/glu_k"))
    # shapes and dtypes say it all: nothing here needs to be compiled
    v = jax.eval_shape(lambda k: init_variables(cfg, k), jax.random.key(0))
    observed = {
        "/".join(str(getattr(k, "key", "")) for k in p[:-1])
        for p, _ in jax.tree_util.tree_flatten_with_path(v["quant_stats"])[0]
    }
    vsns = {f"{n}_vsn/glu_k_in" for n in ("static", "encoder", "decoder")}
    assert (
        observed
        == {f"attention/{n}/kernel_in" for n in ("query", "key", "value", "out")}
        | {"lstm_encoder/w_h_in", "lstm_decoder/w_h_in"}
        | vsns
    )
    i8 = jax.eval_shape(lambda p: int8_variables(p, quant_spec(cfg, "int8")), v["params"])
    int8_leaves = {
        jax.tree_util.keystr(p)
        for p, a in jax.tree_util.tree_flatten_with_path(i8["params"])[0]
        if a.dtype == jnp.int8
    }
    assert int8_leaves == {
        f"['attention']['{n}']['kernel']" for n in ("query", "key", "value", "out")
    } | {f"['lstm_{n}']['w_h']" for n in ("encoder", "decoder")} | {
        f"['{n}_vsn']['glu_k']" for n in ("static", "encoder", "decoder")
    }


def test_export_refuses_zero_sample_windows(tmp_path, capsys):
    rc = call(
        export_cli.main, "--checkpoint", tmp_path / "run", "--out", tmp_path / "o", "--samples", 0
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--samples must be >= 1 window, got 0" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
