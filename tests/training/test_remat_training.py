"""Training is the same with or without remat: every tier, trained from one seed for the same
epochs, ends at the weights of ``off`` (to float32 round-off), leaf by leaf."""

import jax
import numpy as np
import pytest
from conftest import short_es
from tiny import CHUNKED_TFT as CFG
from tiny import CHUNKED_TRAIN as TC

from tftjax.data import load_dataset
from tftjax.models import remat
from tftjax.training import leaf_differences, train_epochs


@pytest.fixture(scope="module", autouse=True)
def highest():
    # equality at full float32 on every backend (NVIDIA GPUs default to TF32 matmuls)
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="module")
def es():
    return load_dataset(short_es(), CFG.data)


@pytest.fixture(scope="module")
def off(es):
    return train_epochs(CFG.override(remat="off"), TC, es)


@pytest.mark.slow
@pytest.mark.xdist_group("remat_training")
@pytest.mark.parametrize("tier", [t for t in remat.TIERS if t != "off"])
def test_every_tier_trains_to_the_weights_of_off(tier, es, off):
    state, history = train_epochs(CFG.override(remat=tier), TC, es)
    ref_state, ref_history = off
    np.testing.assert_allclose(history, ref_history, rtol=1e-6)
    diff = leaf_differences(state.params, ref_state.params)
    assert len(diff) > 50
    worst = max(diff, key=diff.get)
    # 6 Adam steps (lr 1e-3, dropout on): each leaf within 1e-4 of its own scale
    assert diff[worst] < 1e-4, (worst, diff[worst])
    moved = leaf_differences(state.params, _initial())
    assert min(moved.values()) > 0  # every leaf trained: none frozen by a tier


def _initial():
    import jax

    from tftjax.training import create_train_state

    return create_train_state(CFG, TC, jax.random.key(TC.seed)).params
