"""The Pallas VSN kernels (tftjax.models.kernels.pallas_vsn), run in Pallas' interpreter on CPU (and
compiled by Triton where the tests run on a GPU: experiments/gpu_check.py), against
the reference: autodiff of the plain stacked GRNs (tftjax.models.vsn.stacked_grn), in
float32 and bfloat16, with and without dropout, with padded columns and rows and split
backward programs. The compile for the H100 target is in tests/memory/test_hlo_cost.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_fused import stacked_params

from tftjax.models.dropout import keep_mask
from tftjax.models.kernels import pallas_vsn
from tftjax.models.kernels.mode import KernelMode
from tftjax.models.vsn import stacked_grn


@pytest.fixture(scope="module", autouse=True)
def highest():
    # the reference at full float32 on every backend (NVIDIA GPUs default to TF32 matmuls)
    with jax.default_matmul_precision("highest"):
        yield


def leaf_errors(a, b):
    """Per leaf: max |a − b| over max |b| (float64)."""
    out = []
    for (path, u), v in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
        assert np.any(u != 0), jax.tree_util.keystr(path)  # every gradient reaches its leaf
        out.append((jax.tree_util.keystr(path), np.abs(u - v).max() / max(np.abs(v).max(), 1e-30)))
    return out


def _case(m, n, dv, d, dropout, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 5)
    p = jax.tree.map(lambda a: a.astype(dtype), stacked_params(ks[0], m, dv, d))
    x = jax.random.normal(ks[1], (m, n))
    w = jax.nn.softmax(jax.random.normal(ks[2], (m, n)), axis=0)
    keep = keep_mask(ks[3], dropout, (m, n, dv)) if dropout else None
    r = jax.random.normal(ks[4], (n, d))
    return p, x, w, keep, r


def _both(p, x, w, keep, r, dropout, block_rows, target_programs=pallas_vsn.TARGET_PROGRAMS):
    def ref(p, x, w):  # float32 on the same (possibly bf16-rounded) parameters
        p32 = jax.tree.map(lambda a: a.astype(jnp.float32), p)
        return jnp.sum(stacked_grn(p32, x, w, keep, dropout)[0].astype(jnp.float32) * r)

    def pal(p, x, w):
        # interpreted on CPU; compiled (Triton) where the tests run on a GPU (gpu_check)
        out = pallas_vsn.weighted_grn_sum(
            p, x, w, keep, dropout, block_rows=block_rows, target_programs=target_programs
        )
        assert out.dtype == jnp.float32 and out.shape == (x.shape[1], r.shape[1])
        return jnp.sum(out * r)

    grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    return grad(pal)(p, x, w), grad(ref)(p, x, w)


@pytest.mark.parametrize(
    "m,n,dv,d,dropout,block_rows,programs",
    [
        (5, 45, 4, 16, 0.0, 16, 264),  # d_v padded 4 → 16; 3 row tiles, padded rows, R = 3
        (7, 45, 4, 12, 0.3, 8, 264),  # d padded 12 → 16 (LayerNorm masked); dropout
        (3, 100, 3, 8, 0.3, 16, 12),  # 7 tiles (prime) → 8 in 4 backward splits of 2 tiles each
    ],
)
def test_pallas_vsn_value_and_every_gradient_equal_autodiff_float32(
    m, n, dv, d, dropout, block_rows, programs
):
    # Same function in another summation order: float32 round-off only. Each value is a sum
    # of at most max(N, m·d) ≈ 10² products of O(1) terms through a few layers: relative
    # error a few times 10²·2⁻²⁴ ≈ 6e-6 of the leaf's scale; 2e-5 as test_fused.py.
    p, x, w, keep, r = _case(m, n, dv, d, dropout, jnp.float32)
    (v, g), (v_ref, g_ref) = _both(p, x, w, keep, r, dropout, block_rows, programs)
    assert abs(float(v) - float(v_ref)) <= 2e-5 * abs(float(v_ref))
    for name, err in leaf_errors(g, g_ref):
        assert err <= 2e-5, (name, err)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_pallas_vsn_bfloat16_matmul_operands_against_float32_reference(dropout):
    # bf16 parameters: the kernel feeds its matmuls bf16 operands (h, η forward; dη, dh and
    # the weight-gradient operands backward) with float32 sums, and returns bf16 parameter
    # gradients. The reference is float32 on the same bf16 parameters. Each bf16 rounding
    # is relative u = 2⁻⁹; a value passes at most two forward and four backward operand
    # roundings plus the gradient's own, through O(1) gains (LayerNorm, σ', ELU' ≤ 1):
    # error ≲ 7u·(a few) ≈ 2⁻⁵ of the leaf's scale. A kernel that dropped a term or
    # misplaced a padded column errs by O(1).
    p, x, w, keep, r = _case(6, 40, 4, 16, dropout, jnp.bfloat16, seed=1)
    (v, g), (v_ref, g_ref) = _both(p, x, w, keep, r, dropout, 16)
    assert all(a.dtype == jnp.bfloat16 for a in jax.tree.leaves(g[0]))
    assert abs(float(v) - float(v_ref)) <= 2**-5 * abs(float(v_ref))
    errs = leaf_errors(g, g_ref)
    for name, err in errs:
        assert err <= 2**-5, (name, err)
    # and bf16 is really in play: the errors are far above float32 round-off
    assert max(e for _, e in errs) > 1e-4


def test_pallas_vsn_saves_only_its_inputs_and_states_its_flops():
    # The backward recomputes from (x, w, mask, parameters): no [m, N, d] residual.
    from jax._src.ad_checkpoint import saved_residuals

    m, n, dv, d = 5, 64, 4, 16
    p, x, w, _, _ = _case(m, n, dv, d, 0.0, jnp.float32)
    f = lambda p, x, w: jnp.sum(
        pallas_vsn.weighted_grn_sum(p, x, w, None, 0.0, block_rows=16, interpret=True)
    )
    biggest = max(np.prod(a.shape) for a, _ in saved_residuals(f, p, x, w))
    # x or w ([m, N]) or a padded kernel ([m, 16, 16]); nothing of m·N·d (5,120 here)
    assert biggest <= max(m * n, m * 16 * 16) < m * n * d
    # hand count: fc1 [4×4] and the GLU's halves [4×16] each, per variable and row, ×2
    assert pallas_vsn.matmul_flops(m, n, dv, d) == 2 * m * n * (16 + 2 * 64)


@pytest.mark.slow  # a CLI run with the kernels interpreted
def test_train_runs_with_pallas_kernels_and_says_they_are_interpreted(tmp_path, capsys):
    # end to end through the CLI: one epoch of the tiny model with the LSTMs and the
    # attention as Pallas kernels (interpreted on CPU), a finite loss and a saved final
    # checkpoint. The VSN kernel is left out here (interpreted, it doubles this test's 16 s);
    # the TFT runs it in tests/models/test_remat.py's pallas tier, and the optimizer's kernels run
    # end to end in tests/runner/test_loop.py's resume.
    import json

    from conftest import call
    from tiny import tiny_tft

    from tftjax import train as train_cli

    wd = tmp_path / "run"
    assert (
        call(
            train_cli.main,
            *tiny_tft(
                "--epochs",
                "1",
                "--lstm-kernel",
                "pallas",
                "--attention-kernel",
                "pallas",
                "--workdir",
                wd,
            ),
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "--kernels pallas --kernels-exclude vsn,grn,optimizer runs in Pallas' interpreter"
    ) in out
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    assert losses and all(np.isfinite(x) for x in losses)
    assert (wd / "checkpoints" / "tft_final_epoch1").is_dir()


@pytest.mark.skipif(
    jax.default_backend() not in ("gpu", "cuda", "rocm"),
    reason="needs a GPU (the compiled Triton kernels at TFT-225's widths)",
)
def test_the_compiled_kernels_at_tft225_widths_on_a_gpu():
    # What the interpreter cannot show: Triton's code for these shapes (gpu_check runs it).
    # float32 at the highest precision: sums over up to 2,048 rows, relative error
    # ≲ n·2⁻²⁴ ≈ 1.2e-4 of a leaf's scale, ×4 for the layers it passes. (bf16 is checked at
    # small widths above: over thousands of rows its rounding errors no longer stay within a
    # bound argued per leaf, since some leaves are sums that cancel.)
    dtype, tol = jnp.float32, 5e-4
    from tftjax.models.recurrence import _project, _scan, lstm_recurrence

    p, x, w, keep, r = _case(33, 2048, 8, 128, 0.1, dtype, seed=2)
    (v, g), (v_ref, g_ref) = _both(p, x, w, keep, r, 0.1, pallas_vsn.BLOCK_ROWS)
    assert abs(float(v) - float(v_ref)) <= tol * abs(float(v_ref))
    for name, err in leaf_errors(g, g_ref):
        assert err <= tol, (name, err)
    ks = jax.random.split(jax.random.key(5), 4)
    t, b, f, d = 60, 256, 128, 128
    args = (
        jax.random.normal(ks[0], (t, b, f)).astype(dtype),
        (jax.random.normal(ks[1], (f, 4 * d)) / f**0.5).astype(dtype),
        jnp.zeros((4 * d,), dtype),
        jax.random.normal(ks[2], (d, 4 * d)) / d**0.5,
        jnp.zeros((b, d)),
        jnp.zeros((b, d), dtype),
    )

    def lstm_loss(kernel):
        def f(*a):
            (c, h), hs = lstm_recurrence(*a, False, kernel)
            return jnp.sum(c) + jnp.sum(jnp.sin(hs.astype(jnp.float32)))

        return f

    def ref(*a):
        (c, h), hs, _, _ = _scan(_project(*a[:3]), *a[3:])
        return jnp.sum(c) + jnp.sum(jnp.sin(hs.astype(jnp.float32)))

    ga = jax.jit(jax.grad(lstm_loss(KernelMode.COMPILED), argnums=tuple(range(6))))(*args)
    gb = jax.jit(jax.grad(ref, argnums=tuple(range(6))))(*args)
    for name, err in leaf_errors(ga, gb):
        assert err <= tol, (name, err)
