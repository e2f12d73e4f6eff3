"""On a GPU only (``-m gpu``; skipped elsewhere): the backend behaves as the precision and
memory code assumes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.config import preset
from tftjax.runner.devices import memory_stats

pytestmark = pytest.mark.gpu


def test_default_float32_matmuls_are_tf32_and_highest_is_float32():
    a = jax.random.normal(jax.random.key(0), (256, 256))
    b = jax.random.normal(jax.random.key(1), (256, 256))
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    scale = np.abs(exact).max()
    with jax.default_matmul_precision("default"):
        d = np.asarray(jnp.dot(a, b))
    with jax.default_matmul_precision("highest"):
        h = np.asarray(jnp.dot(a, b))
    assert np.abs(h - exact).max() <= 2.0**-20 * scale  # float32
    assert 2.0**-20 * scale < np.abs(d - exact).max() <= 2.0**-8 * scale  # TF32's 11 bits


def test_the_device_reports_its_memory():
    stats = memory_stats()
    assert stats and {"bytes_in_use", "peak_bytes_in_use", "bytes_limit"} <= set(stats)


def test_every_tier_at_most_off_on_this_gpu():
    from tftjax.memory import analyse

    temp = {
        t: analyse(preset("tiny", remat=t), 64, 2000).temp_bytes
        for t in ("off", "minimal", "aggressive", "full")
    }
    assert all(v <= temp["off"] for v in temp.values()), temp
