"""The optimizer step as Pallas kernels (tftjax.models.kernels.pallas_adamw), in Pallas'
interpreter, against optax's ``chain(clip_by_global_norm, adamw)`` and ``apply_updates``
(the independent reference): a parameter tree named like the TFT's (decayed and undecayed
leaves), cut into four update kernels, with leaves of one element to several blocks and
partial last blocks; clipping on and off, both schedules, decay on every leaf and on the
weight matrices only. And the train step's use of them, traced."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tftjax.config import TrainConfig
from tftjax.models.kernels import multi_tensor, pallas_adamw
from tftjax.training.optimizer import decay_mask, make_optimizer

# Tolerance. Every element-wise expression is optax's own, in the same order, in float32;
# only the global norm is summed in another order (per block, then the partial sums,
# instead of per leaf, then the leaves). Both are tree sums of ~5,000 squares: relative error
# ≲ log2(n)·2⁻²⁴ ≈ 1e-6 each. The clipped gradient g/‖g‖ carries that error linearly into
# mu, twice into nu (g²), and at most 1.5x into the update (mu/√nu); each element-wise step
# adds ≤ ½ ulp (6e-8) over about ten steps. 1e-5 of the value (plus 1e-6 of the leaf's
# scale for values that pass near 0) is ≥ 3x the sum of these.
RTOL, ATOL = 1e-5, 1e-6
# compiled Triton kernels on a GPU (experiments/gpu_check.py runs this file there), the
# interpreter elsewhere
INTERPRET = jax.default_backend() not in ("gpu", "cuda", "rocm")


@pytest.fixture(scope="module")
def params():
    shapes = {
        "static_vsn": {"emb_k": (5, 8), "emb_b": (5, 8), "glu_k": (5, 8, 32), "ln_scale": (5, 16)},
        "lstm_encoder": {"w_i": (16, 64), "w_h": (16, 64), "b": (64,)},
        "enrichment": {
            "fc1": {"kernel": (16, 16), "bias": (16,)},
            "norm": {"scale": (16,), "bias": (16,)},
        },
        "quantiles": {"kernel": (16, 7), "bias": (7,)},
        "tail": {"kernel": (1000, 3)},
        "one": {"bias": (1,)},
    }
    leaves, tree = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(jax.random.key(0), len(leaves))
    return tree.unflatten([0.1 * jax.random.normal(k, s) for k, s in zip(keys, leaves)])


@pytest.fixture(autouse=True)
def small_kernels(monkeypatch):
    # 14 leaves in 4 update kernels; blocks of 256: 1 to 12 blocks a leaf, most with a tail
    monkeypatch.setattr(pallas_adamw, "GROUP", 4)
    monkeypatch.setattr(multi_tensor, "BLOCK", 256)


def _grads(params, seed: int, scale: float):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return tree.unflatten([scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def _close(a, b, what):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind in "iu":
            assert np.array_equal(x, y), (what, path)
            continue
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        err = np.abs(x - y) - (RTOL * np.abs(y) + ATOL * scale)
        assert err.max(initial=0.0) <= 0, (what, jax.tree_util.keystr(path), float(err.max()))


@pytest.mark.parametrize(
    "tc",
    [
        TrainConfig(learning_rate=1e-2, weight_decay=0.1, grad_clip=1.0, decay_all=True),
        TrainConfig(
            learning_rate=3e-3,
            weight_decay=0.05,
            grad_clip=1.0,
            decay_all=False,
            lr_schedule="cosine",
            warmup_steps=1,
        ),
    ],
    ids=["constant-decay-all", "cosine-warmup-masked"],
)
@pytest.mark.parametrize("backend", ["pallas", "flat"])
def test_three_steps_match_optax_with_clipping_on_and_off(params, tc, backend):
    # the optimizer's two fused backends (the kernels; one flat buffer in XLA) against optax
    tx = make_optimizer(tc, total_steps=10)
    fused = make_optimizer(tc, 10, backend, INTERPRET)
    assert len(jax.tree.leaves(params)) > 3 * pallas_adamw.GROUP  # four update kernels
    assert max(x.size for x in jax.tree.leaves(params)) > 10 * multi_tensor.BLOCK
    if not tc.decay_all:  # the mask decays some leaves and spares others
        assert len(set(jax.tree.leaves(decay_mask(params)))) == 2

    run = jax.jit(fused.step)

    @jax.jit
    def reference(p, g, s):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, optax.global_norm(g)

    p_k = p_r = params
    s_k = s_r = tx.init(params)
    # gradient norms ~80 (clipped to 1), then ~0.008 (not clipped), then ~80 again
    for t, scale in enumerate((1.0, 1e-4, 1.0)):
        g = _grads(params, t, scale)
        p_k, s_k, n_k = run(p_k, g, s_k)
        p_r, s_r, n_r = reference(p_r, g, s_r)
        assert (float(n_r) < tc.grad_clip) == (scale < 1e-2)  # the case meant
        assert abs(float(n_k) - float(n_r)) <= 2e-6 * float(n_r), t
        assert jax.tree.structure(s_k) == jax.tree.structure(s_r)  # optax's state, as is
        _close(p_k, p_r, f"params after step {t + 1}")
        _close(s_k, s_r, f"optimizer state after step {t + 1}")
    # the parameters moved by far more than the tolerance: the comparison can fail
    moved = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(p_k), jax.tree.leaves(params))
    )
    assert moved > 100 * ATOL


def test_bfloat16_gradients_are_converted_inside_the_kernels(params):
    # the bf16 step hands the optimizer the gradients of the parameters' bfloat16 copies:
    # the same step as optax on those gradients converted to float32 (exactly)
    tc = TrainConfig(learning_rate=1e-2, weight_decay=0.1, grad_clip=1.0)
    tx = make_optimizer(tc)
    g = jax.tree.map(lambda a: a.astype(jnp.bfloat16), _grads(params, 5, 1.0))
    fused = make_optimizer(tc, None, "pallas", INTERPRET)
    p_k, s_k, n_k = jax.jit(fused.step)(params, g, tx.init(params))
    g32 = jax.tree.map(lambda a: a.astype(jnp.float32), g)
    u, s_r = tx.update(g32, tx.init(params), params)
    _close(p_k, optax.apply_updates(params, u), "params")
    _close(s_k, s_r, "optimizer state")
    assert abs(float(n_k) - float(optax.global_norm(g32))) <= 2e-6 * float(n_k)


def test_the_optimizer_is_an_optax_transformation_whatever_runs_it(params):
    # every backend keeps optax's state and gives optax's updates through ``update``
    tc = TrainConfig(learning_rate=1e-2, weight_decay=0.1, grad_clip=1.0)
    g = _grads(params, 3, 1.0)
    ref = make_optimizer(tc)
    u_ref, s_ref = ref.update(g, ref.init(params), params)
    for backend in ("flat", "pallas"):
        tx = make_optimizer(tc, None, backend, INTERPRET)
        assert tx.hyper.clip == tc.grad_clip and tx.backend == backend
        u, s = jax.jit(tx.update)(g, tx.init(params), params)
        _close(optax.apply_updates(params, u), optax.apply_updates(params, u_ref), backend)
        _close(s, s_ref, backend)
    assert make_optimizer(tc) is make_optimizer(tc)  # one object: jit's cache hits


def test_a_non_float32_leaf_is_refused(params):
    tx = make_optimizer(TrainConfig(), None, "pallas", INTERPRET)
    p = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    with pytest.raises(TypeError, match="float32"):
        tx.step(p, p, tx.init(params))


def test_the_train_step_runs_the_kernels_and_keeps_the_state_as_it_was():
    # The train step's branch (tftjax.training.steps), traced, not compiled (the interpreted
    # kernels take ~20 s to compile; their arithmetic is checked above), under bf16 compute:
    # the kernels are in its program, and the state comes out with the structure, shapes and
    # dtypes it went in with (float32), which is what a checkpoint holds and --resume
    # restores, whichever --optimizer-kernel wrote it.
    from tftjax.config import preset
    from tftjax.memory.analysis import abstract_inputs
    from tftjax.training.steps import make_train_step

    cfg = preset(
        "tiny",
        precision="bf16",
        kernels="pallas",
        kernels_exclude=("vsn", "lstm", "grn", "attention"),
    )
    state, data, idx, key = abstract_inputs(cfg, 8, 64)
    jaxpr, (new, metrics) = jax.make_jaxpr(make_train_step(cfg), return_shape=True)(
        state, data, idx, key
    )
    groups = -(-len(jax.tree.leaves(state.params)) // pallas_adamw.GROUP)
    assert str(jaxpr).count("name=adamw_grad_norm") == 1
    # bf16: the parameters' bfloat16 copies made by the cast kernel, and the gradients
    # with respect to them reach the optimizer in bfloat16 (converted inside its kernels)
    assert str(jaxpr).count("name=cast_params") >= 1
    assert str(jaxpr).count("name=adamw_update") == groups
    assert jax.tree.structure(new) == jax.tree.structure(state)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), new) == jax.tree.map(
        lambda a: (a.shape, a.dtype), state
    )
    assert metrics["grad_norm"].shape == () and metrics["grad_norm"].dtype == jnp.float32


def test_the_run_names_the_kernels_it_interprets():
    from tftjax.config import preset

    assert preset("tiny").execution.describe_kernels() == ""
    assert preset("tiny", kernels="pallas").execution.describe_kernels() == "--kernels pallas"
    three = preset("tiny", vsn_kernel="pallas", lstm_kernel="pallas", optimizer_kernel="pallas")
    assert three.execution.describe_kernels() == (
        "--kernels pallas --kernels-exclude grn,attention"
    )
