"""bf16 compute without silent upcasts: a census of every matmul in the bf16 train step
(forward and backward, every tier), read from its jaxpr.

A float32 × bfloat16 product is computed by promoting the bfloat16 side to float32 (jnp's
type promotion), so a float32 operand anywhere but the named float32 islands means some
part of the network silently runs in float32. The islands are the quantile head (its
parameters stay float32, models/tft.py FLOAT32_MODULES). Matmuls whose operands are
bfloat16 and which accumulate in float32 (``preferred_element_type``: the attention logits,
the VSN's weighted sum) are what bf16 compute should do and pass.
"""

import jax
import jax.numpy as jnp
import pytest

from tftjax.config import preset
from tftjax.memory.analysis import abstract_inputs
from tftjax.training import make_train_step

ISLANDS = ("quantiles",)


def _dots(jaxpr, out):
    """(name stack, operand dtypes, result dtype) of every dot_general in ``jaxpr`` and the
    jaxprs inside it (scans, checkpoints, custom VJPs, nested jits)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(
                (
                    str(eqn.source_info.name_stack),
                    tuple(v.aval.dtype for v in eqn.invars),
                    eqn.outvars[0].aval.dtype,
                )
            )
        for sub in jax.core.jaxprs_in_params(eqn.params):
            _dots(sub, out)
    return out


def census(cfg, batch: int = 4):
    state, data, idx, key = abstract_inputs(cfg, batch, 64)
    closed = jax.make_jaxpr(make_train_step(cfg))(state, data, idx, key)
    return _dots(closed.jaxpr, [])


@pytest.mark.parametrize("tier", ["off", "aggressive"])
def test_every_bf16_matmul_outside_the_head_has_bfloat16_operands(tier):
    dots = census(preset("tiny", remat=tier, precision="bf16"))
    assert len(dots) > 50  # the forward and backward matmuls of the whole network
    upcast = [(s, d) for s, d, _ in dots if jnp.float32 in d and not any(i in s for i in ISLANDS)]
    assert not upcast, f"{len(upcast)} float32 matmuls outside the head, e.g. {upcast[:5]}"
    # and the head is float32, as it should be (its parameters are not cast)
    assert any(jnp.float32 in d for s, d, _ in dots if "quantiles" in s)


def test_the_census_sees_a_promotion():
    """The census is not vacuous: a float32 context added to a bfloat16 GRN (what the static
    contexts did before) shows as float32 matmuls in its forward and backward passes."""
    from tftjax.models.layers import GRN

    grn = GRN(8, 8)
    x = jnp.ones((4, 8), jnp.bfloat16)
    params = jax.tree.map(
        lambda a: a.astype(jnp.bfloat16),
        grn.init(jax.random.key(0), x, jnp.ones((4, 8), jnp.bfloat16)),
    )

    def loss(p, ctx):
        return grn.apply(p, x, ctx).astype(jnp.float32).sum()

    for ctx_dtype, flagged in ((jnp.bfloat16, False), (jnp.float32, True)):
        ctx = jnp.ones((4, 8), ctx_dtype)
        dots = _dots(jax.make_jaxpr(jax.grad(loss))(params, ctx).jaxpr, [])
        assert dots
        assert any(jnp.float32 in d for _, d, _ in dots) is flagged, (ctx_dtype, dots)


def test_the_lstm_recurrent_gradient_sums_in_float32():
    """Both LSTMs' kernel gradients are one GEMM each over all steps, of bfloat16 operands
    into float32 (tftjax.models.recurrence), not a bfloat16 sum over the steps."""
    cfg = preset("tiny", remat="off", precision="bf16")
    state, data, idx, key = abstract_inputs(cfg, 4, 64)
    closed = jax.make_jaxpr(make_train_step(cfg))(state, data, idx, key)
    d = cfg.model.hidden
    shapes = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general" and eqn.outvars[0].aval.shape == (d, 4 * d):
                shapes.append((tuple(v.aval.dtype for v in eqn.invars), eqn.outvars[0].aval.dtype))
            for sub in jax.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(closed.jaxpr)
    # w_h's and w_i's (the LSTM's input is the VSN's [.., d] output too) of both LSTMs
    assert shapes == [((jnp.bfloat16, jnp.bfloat16), jnp.float32)] * 4, shapes
