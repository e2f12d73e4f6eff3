"""PTQ calibration (issue 27): what each method records of a tensor against numpy, how the
batches are reduced, and the refusals."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import call, short_es

from tftjax.config import ConfigError, preset
from tftjax.models.layers import dense
from tftjax.quant.calib import MSE_SHRINK
from tftjax.quant.core import MinMax, QuantSpec
from tftjax.quant.ptq import calibrate, check_calibration


class One(nn.Module):
    quant: QuantSpec

    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", nn.initializers.ones, (x.shape[-1], 2))
        return dense(self, "kernel", x, w, self.quant)


def np_fake_quant(x, lo, hi):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    s = max((hi - lo) / 255, np.finfo(np.float32).eps)
    zp = np.clip(-128 - np.round(lo / s), -128, 127)
    return (np.clip(np.round(x / s) + zp, -128, 127) - zp) * s


@pytest.fixture(scope="module")
def x():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(40, 25)).astype(np.float32)
    v[3, 7] = 40.0  # one outlier
    return v


def record(x, method, stats=None):
    m = One(QuantSpec("fake", calibrate=method))
    params = m.init(jax.random.key(0), jnp.asarray(x))["params"]
    variables = {"params": params}
    if stats is not None:
        variables["quant_stats"] = {"kernel_in": stats}
    y, rec = m.apply(variables, jnp.asarray(x), mutable=["quant_calib"])
    # activations stay float while calibrating (the weights are fake-quantized ones: exact)
    np.testing.assert_allclose(np.asarray(y), x.sum(-1, keepdims=True).repeat(2, -1), rtol=1e-5)
    return np.asarray(rec["quant_calib"]["kernel_in"])


def test_minmax_and_percentile_records_against_numpy(x):
    np.testing.assert_allclose(record(x, "minmax"), [x.min(), x.max()])
    np.testing.assert_allclose(
        record(x, "percentile:99"), [np.percentile(x, 1), np.percentile(x, 99)], rtol=1e-5
    )
    assert record(x, "percentile:99")[1] < 5 < x.max()  # the outlier sets no range


def test_mse_records_each_candidates_error_against_numpy(x):
    lo, hi = float(x.min()), float(x.max())
    got = record(x, "mse", MinMax(jnp.float32(lo), jnp.float32(hi), jnp.int32(1)))
    want = [
        np.sum((np_fake_quant(x.astype(np.float64), a * lo, a * hi) - x) ** 2) for a in MSE_SHRINK
    ]
    np.testing.assert_allclose(got, want, rtol=2e-3)
    # the candidate it picks is numpy's best up to that same 2e-3 (two candidates whose errors
    # lie closer than the float32 sums' round-off may come out in either order)
    assert want[int(np.argmin(got))] <= min(want) * (1 + 2e-3)


@pytest.mark.slow  # compiles every method's reduction
def test_calibrate_reduces_the_batches_as_its_method_says():
    from tftjax.data import load_dataset, to_device
    from tftjax.models.tft import init_variables
    from tftjax.quant.ptq import _paths, _record_step

    cfg = preset("tiny")
    ds = load_dataset(short_es(), cfg.data)
    params = init_variables(cfg, jax.random.key(1))["params"]
    data = to_device(ds.features)
    starts = ds.splits.train
    out = {}
    for method in ("minmax",):  # (mse's choice per tensor: the module-level test above)
        qcfg, stats = calibrate(cfg, params, data, starts, 3, 32, method=method)
        out[method] = _paths(stats, lambda v: isinstance(v, MinMax))
    # per-batch records by the same step, reduced by hand: min/max, and the percentiles' mean
    from tftjax.data import epoch_batches

    idx, mask = epoch_batches(starts, 32, seed=0, epoch=1)
    full = [i for i, m in zip(idx, mask) if m.all()][:3]
    like = init_variables(qcfg, jax.random.key(0))["quant_stats"]
    recs = {
        m: [
            _paths(
                jax.device_get(
                    _record_step(qcfg, m)(
                        {"params": params, "quant_stats": like}, data, jnp.asarray(i, jnp.int32)
                    )
                )
            )
            for i in full
        ]
        for m in ("minmax",)
    }
    per_variable = 0
    for name, mm in out["minmax"].items():
        r = np.array([b[name] for b in recs["minmax"]])  # [batches, (m,) 2]
        np.testing.assert_allclose(mm.min, r[..., 0].min(0), rtol=1e-6)
        np.testing.assert_allclose(mm.max, r[..., 1].max(0), rtol=1e-6)
        assert np.all(np.asarray(mm.count) == 3)
        per_variable += np.ndim(mm.min) == 1
    assert per_variable >= 2  # the stacked GRNs' per-variable observers are calibrated too
    assert ("encoder", "lstm", "w_h_in") in out["minmax"] or any(
        k[-1] == "w_h_in" for k in out["minmax"]
    )  # and the LSTM's recurrent input


@pytest.mark.parametrize(
    "method,ok",
    [
        ("minmax", True),
        ("mse", True),
        ("percentile:99.99", True),
        ("percentile:101", False),
        ("percentile:x", False),
        ("histogram", False),
    ],
)
def test_check_calibration(method, ok):
    if ok:
        assert check_calibration(method) == method
    else:
        with pytest.raises(ConfigError):
            check_calibration(method)


@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["--int8", "--calibrate", "4", "--calibration", "percentile:101"],
            "--calibration percentile:101: the percentile must be in (50, 100)",
        ),
        (["--int8", "--calibrate", "0"], "--calibrate must be >= 1 batch, got 0"),
    ],
)
def test_bad_calibration_flags_exit_2_with_one_line(tmp_path, capsys, args, expect):
    from tftjax import evaluate

    rc = call(evaluate.main, "--checkpoint", tmp_path / "none", *args)
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1, err
