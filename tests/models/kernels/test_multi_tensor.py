"""Element-wise work over many arrays as one Pallas kernel (tftjax.models.kernels.multi_tensor), in
Pallas' interpreter, against numpy: arrays of one element to several blocks with partial
last blocks, cut into several kernels; the bf16 parameter copies and the sum over a
kernel's row splits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.models.kernels import multi_tensor

INTERPRET = jax.default_backend() not in ("gpu", "cuda", "rocm")
SHAPES = [(1,), (5, 8), (256,), (257,), (3, 300), (16, 16, 4), (7,)]


@pytest.fixture(autouse=True)
def small_kernels(monkeypatch):
    # 7 arrays in 3 kernels; blocks of 256: 1 to 4 blocks an array, most with a tail
    monkeypatch.setattr(multi_tensor, "GROUP", 3)
    monkeypatch.setattr(multi_tensor, "BLOCK", 256)


def _arrays(seed):
    keys = jax.random.split(jax.random.key(seed), len(SHAPES))
    return [jax.random.normal(k, s) for k, s in zip(keys, SHAPES)]


def test_cast_equals_astype_element_for_element():
    xs = _arrays(0)
    got = jax.jit(lambda xs: multi_tensor.cast(xs, jnp.bfloat16, interpret=INTERPRET))(xs)
    for x, y in zip(xs, got):
        assert y.dtype == jnp.bfloat16 and y.shape == x.shape
        # one rounding, as astype's: the same bits
        np.testing.assert_array_equal(
            np.asarray(y.astype(jnp.float32)),
            np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32)),
        )


@pytest.mark.parametrize("splits", [1, 5])
def test_sum_splits_equals_numpy(splits):
    parts = [jnp.stack([a * (j + 1) for j in range(splits)]) for a in _arrays(1)]
    dtypes = [jnp.float32, jnp.bfloat16] * 3 + [jnp.float32]
    got = jax.jit(lambda ps: multi_tensor.sum_splits(ps, dtypes, interpret=INTERPRET))(parts)
    for p, dt, y in zip(parts, dtypes, got):
        ref = np.asarray(p, np.float64).sum(axis=0)
        assert y.dtype == dt and y.shape == ref.shape
        # float32 sums of S terms: relative error ≤ S·2⁻²⁴ of the terms' absolute sum;
        # bf16 outputs add one rounding, 2⁻⁹ of the value
        bound = splits * 2.0**-24 * np.abs(np.asarray(p, np.float64)).sum(axis=0)
        if dt == jnp.bfloat16:
            bound = bound + 2.0**-8 * np.abs(ref)
        assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= bound + 1e-30)
