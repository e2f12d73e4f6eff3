"""Fake-quant: forward against a numpy round-and-clip reference, the straight-through
backward against ``g · mask`` exactly (absmax element included), per-channel scales on
any axis, and composition with jit, remat and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.quant.core import channel_scale, fake_quant, fake_quant_weight


def np_fake_quant(x, s, zp, qmin, qmax):
    r = np.round(x / s) + zp  # float32 like the op; numpy rounds half to even, as XLA does
    return (np.clip(r, qmin, qmax) - zp) * s, (r >= qmin) & (r <= qmax)


@pytest.mark.parametrize(
    "s,zp,qmin,qmax", [(0.05, 0.0, -128, 127), (0.02, 13.0, 0, 255), (0.1, -3.0, -127, 127)]
)
def test_forward_and_backward_per_tensor(s, zp, qmin, qmax):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(64, 33)) * 0.4 * (qmax - qmin) * s).astype(np.float32)
    x[0, :4] = np.float32(s) * np.float32([0.5, 1.5, -2.5, 0.0])  # halves: to even
    g = rng.normal(size=x.shape).astype(np.float32)
    want, mask = np_fake_quant(x, np.float32(s), np.float32(zp), qmin, qmax)
    args = (jnp.float32(s), jnp.float32(zp))
    y, vjp = jax.vjp(lambda v: fake_quant(v, *args, qmin, qmax), jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(y), want, rtol=0, atol=1e-6)
    assert 0 < mask.sum() < mask.size  # both sides of the clip are exercised
    np.testing.assert_array_equal(np.asarray(vjp(jnp.asarray(g))[0]), g * mask)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_channel_absmax_element_keeps_its_gradient(axis):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(5, 7, 3)).astype(np.float32) * rng.uniform(0.01, 10, size=(1, 7, 1))
    s = channel_scale(jnp.asarray(w), axis)
    assert s.shape == tuple(n if a == axis % 3 else 1 for a, n in enumerate(w.shape))
    absmax = np.abs(w).max(axis=tuple(a for a in range(3) if a != axis % 3), keepdims=True)
    np.testing.assert_allclose(np.asarray(s), absmax / 127, rtol=1e-6)
    g = rng.normal(size=w.shape).astype(np.float32)
    y, vjp = jax.vjp(lambda v: fake_quant_weight(v, axis), jnp.asarray(w))
    want, _ = np_fake_quant(w, np.asarray(s), 0.0, -127, 127)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6, atol=1e-7)
    # every weight lies within its channel's range, the absmax ones exactly at ±127:
    # all of them pass the gradient (a mask |w| <= 127·s may drop the absmax element)
    np.testing.assert_array_equal(np.asarray(vjp(jnp.asarray(g))[0]), g)
    q = np.round(w / np.asarray(s))
    assert (np.abs(q) == 127).sum() >= w.shape[axis] and np.abs(q).max() == 127


def test_values_outside_the_range_get_no_gradient_and_scales_none():
    x = jnp.array([-10.0, -1.27, -1.0, 0.0, 1.27, 1.2749, 1.3, 10.0])
    s = jnp.float32(0.01)
    gx, gs, gz = jax.grad(
        lambda v, sc, z: fake_quant(v, sc, z, -127, 127).sum(), argnums=(0, 1, 2)
    )(x, s, jnp.float32(0.0))
    np.testing.assert_array_equal(np.asarray(gx), [0, 1, 1, 1, 1, 1, 0, 0])
    assert float(gs) == 0.0 and float(gz) == 0.0


def test_composes_with_jit_remat_scan_and_vmap():
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ fake_quant_weight(w, -1)) ** 2)

    ref = jax.grad(loss)(w, x)
    for f in (jax.jit(jax.grad(loss)), jax.grad(jax.checkpoint(loss))):
        np.testing.assert_allclose(np.asarray(f(w, x)), np.asarray(ref), rtol=1e-5, atol=1e-6)

    def scanned(w, x):  # a checkpointed scan body, as the remat tiers use
        body = jax.checkpoint(lambda c, xi: (c + loss(w, xi[None]), None))
        return jax.lax.scan(body, 0.0, x)[0]

    np.testing.assert_allclose(
        np.asarray(jax.grad(scanned)(w, x)), np.asarray(ref), rtol=1e-5, atol=1e-6
    )
    per_row = jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, x[:, None])
    np.testing.assert_allclose(np.asarray(per_row.sum(0)), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_moving_average_observer_and_qparams_by_hand():
    from tftjax.quant.core import activation_qparams, init_minmax, observe

    rng = np.random.default_rng(3)
    batches = [rng.normal(2.0, 1.0, size=(4, 5)).astype(np.float32) for _ in range(5)]
    stats = init_minmax()
    lo = hi = None
    for b in batches:  # the reference, written out
        lo = b.min() if lo is None else lo + 0.01 * (b.min() - lo)
        hi = b.max() if hi is None else hi + 0.01 * (b.max() - hi)
        stats = jax.jit(observe)(stats, jnp.asarray(b))
    np.testing.assert_allclose([float(stats.min), float(stats.max)], [lo, hi], rtol=1e-6)
    scale, zp = activation_qparams(stats)
    lo0, hi0 = min(lo, 0.0), max(hi, 0.0)
    assert float(scale) == pytest.approx((hi0 - lo0) / 255, rel=1e-6)
    assert float(zp) == np.clip(-128 - np.round(lo0 / ((hi0 - lo0) / 255)), -128, 127)
    # the range includes 0, and 0 is exactly representable
    assert float(fake_quant(jnp.float32(0.0), scale, zp)) == 0.0
    pos = activation_qparams(observe(init_minmax(), jnp.array([1.0, 3.0])))
    assert float(pos[1]) == -128 and float(pos[0]) == pytest.approx(3.0 / 255)


def test_an_observer_fed_one_inf_stays_finite():
    """Issue 27: a non-finite value is ignored by the observer (one inf would set the range
    for good), and a batch with nothing finite leaves the statistics as they were."""
    from tftjax.quant.core import activation_qparams, init_minmax, observe

    x = np.array([[-1.0, 2.0], [np.inf, 0.5], [np.nan, -3.0]], np.float32)
    s = observe(init_minmax(), jnp.asarray(x))
    assert float(s.min) == -3.0 and float(s.max) == 2.0 and int(s.count) == 1
    s2 = observe(s, jnp.asarray([np.inf, -np.inf, np.nan], np.float32))
    assert (float(s2.min), float(s2.max), int(s2.count)) == (-3.0, 2.0, 1)
    scale, zp = activation_qparams(s2)
    assert np.isfinite(float(scale)) and np.isfinite(float(zp))
    # per-variable observers: a variable with nothing finite keeps its own statistics
    v = observe(init_minmax((2,)), jnp.asarray([[1.0, 2.0], [np.inf, np.nan]], np.float32))
    np.testing.assert_array_equal(np.asarray(v.max), [2.0, 0.0])
    np.testing.assert_array_equal(np.asarray(v.count), [1, 0])


def test_fake_quant_floors_its_scale():
    from tftjax.quant.core import SCALE_FLOOR, fake_quant

    x = jnp.asarray([0.0, 1e-9, -2.0, 3.0], jnp.float32)
    y = fake_quant(x, jnp.float32(0.0), jnp.float32(0.0))
    assert np.isfinite(np.asarray(y)).all()
    # the same as the floor scale, by a numpy round-and-clip
    want = (np.clip(np.round(np.asarray(x) / SCALE_FLOOR), -128, 127)) * SCALE_FLOOR
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
    g = jax.grad(lambda v: fake_quant(v, jnp.float32(0.0), jnp.float32(0.0)).sum())(x)
    assert np.isfinite(np.asarray(g)).all()
