"""The GPU census of a compiled program (tftjax.memory.hlo_cost), against hand counts: a
hand-written optimised HLO module with a while loop, an in-place stacked output, a sliced
read and a cuBLAS GEMM; and a program XLA:CPU compiled, whose matmul FLOPs are known.
Also ``--cost``'s refusals and, with the CUDA plugin, the command end to end."""

import json

import jax
import jax.numpy as jnp
import pytest
from conftest import call

from tftjax.memory import __main__ as memory_cli
from tftjax.memory import targets
from tftjax.memory.cost import CALIBRATION, MEASURED, StepCost, calibrated, fit
from tftjax.memory.hlo_cost import Program, shape_bytes
from tftjax.models.kernels import fused
from tftjax.models.kernels.mode import KernelMode


def on_h100() -> jax.sharding.Sharding:
    """Placement on the H100 compile-only device (needs JAX's CUDA plugin)."""
    return jax.sharding.SingleDeviceSharding(targets.compile_only_device("h100"))


def triton_calls(text: str) -> list[str]:
    """The Triton kernel calls of a compiled GPU program's HLO text."""
    return [ln for ln in text.splitlines() if 'custom_call_target="__gpu$xla.gpu.triton"' in ln]


def test_shape_bytes():
    assert shape_bytes("(f32[2,3]{1,0}, bf16[4], pred[], s8[0])") == 24 + 8 + 1 + 0


HLO = """HloModule hand, is_scheduled=true

%fused_step (param_0: f32[7,32,16], param_1: s32[], param_2: f32[32,16]) -> f32[7,32,16] {
  %param_0 = f32[7,32,16]{2,1,0} parameter(0)
  %param_2 = f32[32,16]{1,0} parameter(2)
  %tanh = f32[32,16]{1,0} tanh(%param_2)
  %bitcast = f32[1,32,16]{2,1,0} bitcast(%tanh)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %dus = f32[7,32,16]{2,1,0} dynamic-update-slice(%param_0, %bitcast, %param_1, %zero, %zero)
}

%fused_read (p0: f32[7,32,16], p1: s32[]) -> f32[32,16] {
  %p0 = f32[7,32,16]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = f32[1,32,16]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,32,16}
  ROOT %b = f32[32,16]{1,0} bitcast(%ds)
}

%fused_inc (q0: s32[]) -> s32[] {
  %q0 = s32[] parameter(0)
  %one = s32[] constant(1)
  ROOT %add = s32[] add(%q0, %one)
}

%body (arg: (s32[], f32[32,16], f32[16,16], f32[7,32,16])) -> (s32[], f32[32,16], f32[16,16], f32[7,32,16]) {
  %arg = (s32[], f32[32,16]{1,0}, f32[16,16]{1,0}, f32[7,32,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %h = f32[32,16]{1,0} get-tuple-element(%arg), index=1
  %w = f32[16,16]{1,0} get-tuple-element(%arg), index=2
  %stack = f32[7,32,16]{2,1,0} get-tuple-element(%arg), index=3
  %gemm = (f32[32,16]{1,0}, s8[1024]{0}) custom-call(%h, %w), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %hw = f32[32,16]{1,0} get-tuple-element(%gemm), index=0
  %new = f32[7,32,16]{2,1,0} fusion(%stack, %i, %hw), kind=kLoop, calls=%fused_step
  %next = s32[] fusion(%i), kind=kLoop, calls=%fused_inc
  ROOT %t = (s32[], f32[32,16]{1,0}, f32[16,16]{1,0}, f32[7,32,16]{2,1,0}) tuple(%next, %hw, %w, %new)
}

%cond (c: (s32[], f32[32,16], f32[16,16], f32[7,32,16])) -> pred[] {
  %c = (s32[], f32[32,16]{1,0}, f32[16,16]{1,0}, f32[7,32,16]{2,1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %seven = s32[] constant(7)
  ROOT %lt = pred[] compare(%ci, %seven), direction=LT
}

ENTRY %main (x: f32[32,16], w: f32[16,16], s: f32[7,32,16]) -> f32[32,16] {
  %x = f32[32,16]{1,0} parameter(0)
  %w = f32[16,16]{1,0} parameter(1)
  %s = f32[7,32,16]{2,1,0} parameter(2)
  %c0 = s32[] constant(0)
  %init = (s32[], f32[32,16]{1,0}, f32[16,16]{1,0}, f32[7,32,16]{2,1,0}) tuple(%c0, %x, %w, %s)
  %loop = (s32[], f32[32,16]{1,0}, f32[16,16]{1,0}, f32[7,32,16]{2,1,0}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(f)/while"}, backend_config={"known_trip_count":{"n":"7"}}
  %out = f32[7,32,16]{2,1,0} get-tuple-element(%loop), index=3
  %c3 = s32[] constant(3)
  ROOT %row = f32[32,16]{1,0} fusion(%out, %c3), kind=kLoop, calls=%fused_read
}
"""


def test_the_census_of_a_hand_written_program():
    c = Program(HLO).census()
    # launches: per trip the GEMM, the stacking fusion and the counter (3) times 7, the
    # condition's compare 8 times, and the entry's read fusion: 21 + 8 + 1
    assert c.kernels == 30
    # FLOPs: 7 GEMMs of [32,16] x [16,16]: 7 * 2*32*16*16
    assert c.flops == 7 * 2 * 32 * 16 * 16
    a = 32 * 16 * 4  # bytes of one [32,16] f32 step
    per_trip = (
        (a + 16 * 16 * 4)
        + (a + 1024)  # GEMM: reads h and w, writes its result and workspace
        + (4 + a)
        + a  # stacking: reads i and the step (not the [7,..] buffer), writes one step
        + 4
        + 4
    )  # counter: reads and writes one s32
    cond = 4 + 4 + 1  # the compare reads the counter and the constant 7, writes a pred
    read = 4 + a + a  # the entry's read: the index, one slice of the stack, the row written
    assert c.hbm_bytes == 7 * per_trip + 8 * cond + read
    assert c.loops == [("jit(f)/while", 7, pytest.approx((7 * 3 + 8) / 7))]


def test_the_matmul_flops_of_a_compiled_scan():
    """XLA:CPU's own program: a 9-step scan of [B, n] @ [n, n] and its gradient. XLA's cost
    analysis counts the body once; the census multiplies it by the trip count."""
    b, n, t = 8, 32, 9

    def f(w, x):
        def body(h, _):
            return jnp.tanh(h @ w), None

        return jax.lax.scan(body, x, None, length=t)[0].sum()

    args = (jnp.ones((n, n)), jnp.ones((b, n)))
    text = jax.jit(jax.grad(f)).lower(*args).compile().as_text()
    c = Program(text).census()
    # forward h @ w, backward dh @ wᵀ and hᵀ @ dh: 3 matmuls of 2·b·n·n per step
    assert c.flops == 3 * t * 2 * b * n * n
    assert any(trips == t for _, trips, _ in c.loops)


def test_the_roofline_passes_through_the_measured_points():
    roof = calibrated()
    h200 = targets.spec("h200")
    for b, k, nbytes, flops in CALIBRATION:
        c = StepCost("off", "f32", b, "h100", k, nbytes, flops, 0)
        assert roof.samples_per_s(
            c, h200.bandwidth_bytes_s, 0.5 * h200.tensor_flops_bf16
        ) == pytest.approx(MEASURED["samples_per_s"][b], rel=1e-9)
    assert 1e-6 < roof.launch_s < 10e-6  # a few microseconds per launch
    with pytest.raises(ValueError, match="unphysical"):
        fit(
            [
                (StepCost("off", "f32", 1, "h", 10, 10**9, 0, 0), 1.0),
                (StepCost("off", "f32", 2, "h", 20, 10**9, 0, 0), 0.5),
            ],
            h200,
        )


def test_cost_without_a_target_exits_2(tmp_path, capsys):
    rc = call(memory_cli.main, "--cost", "--preset", "tiny", "--out", tmp_path / "o")
    err = capsys.readouterr().err
    assert rc == 2 and "--cost needs --target NAME" in err and err.count("\n") == 1, err


@pytest.mark.skipif(targets.available(), reason="the CUDA plugin is installed here")
def test_cost_without_the_cuda_plugin_names_the_extra(tmp_path, capsys):
    rc = call(
        memory_cli.main, "--cost", "--target", "h100", "--preset", "tiny", "--out", tmp_path / "o"
    )
    err = capsys.readouterr().err
    assert rc == 2 and "tftjax[cuda12]" in err and err.count("\n") == 1, err


@pytest.mark.slow  # two GPU compiles of the tiny model: ~35 s each; .ci/run's full tier has the plugin
@pytest.mark.heavy
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
def test_cost_reports_each_tier_on_a_target_and_full_holds_less_than_off(tmp_path, capsys):
    # the two ends of the ladder (every tier's order on CPU: models/test_remat.py's
    # test_tiers_save_less_and_less; every tier's GPU plan: test_remat.py's gpu tiers)
    tiers = ("off", "full")
    rc = call(
        memory_cli.main,
        "--cost",
        "--target",
        "h100",
        "--preset",
        "tiny",
        "--tiers",
        ",".join(tiers),
        "--batch-sizes",
        "64",
        "--out",
        tmp_path,
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = json.loads((tmp_path / "cost.json").read_text())["points"]
    assert [(r["tier"], r["batch_size"]) for r in rows] == [(t, 64) for t in tiers]
    # full a real saving on off's temp bytes (measured at 9f5c0a0, tiny b64 on the H100
    # spec: full 0.36 of off). With every Pallas kernel it is not (at fe9e616, bf16: full
    # 10,143,360 bytes against off's 10,140,544): the kernels keep only their inputs
    temp = [r["temp_bytes"] for r in rows]
    assert temp[1] <= 0.5 * temp[0], temp
    for r in rows:
        # two LSTM loops forward and two backward, each step launching kernels
        assert len(r["loops"]) >= 4 and r["kernels"] > sum(t for _, t, _ in r["loops"])
        assert r["hbm_bytes"] > 0 and r["flops"] > 0 and r["estimated_samples_per_s"] > 0


# The census of 4458bed's five per-family flags (--vsn-kernel pallas --lstm-kernel pallas
# --grn-kernel pallas --attention-kernel pallas --optimizer-kernel pallas), tiny, bf16, off, batch
# 64, compiled for the H100 with jax 0.10.2: `python -m tftjax.memory --preset tiny --target h100
# --cost --tiers off --batch-sizes 64 --precision bf16` and the five flags, at 4458bed.
FIVE_FLAGS_AT_4458BED = {
    "kernels": 248,
    "hbm_bytes": 84_694_300,
    "flops": 2_149_297_280,
    "temp_bytes": 10_140_544,
}


@pytest.mark.slow  # a GPU compile of the tiny model with every kernel: ~70 s
@pytest.mark.heavy
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
@pytest.mark.skipif(jax.__version__ != "0.10.2", reason="the record is of jax 0.10.2's compiler")
def test_one_kernel_switch_compiles_the_program_of_the_five_flags(tmp_path, capsys):
    # the same launches, HBM bytes, FLOPs and temp bytes: the same program (the program is a
    # function of the config, and the five old flags, still accepted, give the same config:
    # tests/runner/test_loop.py::test_flags_come_from_the_config_dataclasses)
    rc = call(
        memory_cli.main,
        "--preset",
        "tiny",
        "--target",
        "h100",
        "--cost",
        "--tiers",
        "off",
        "--batch-sizes",
        "64",
        "--precision",
        "bf16",
        "--kernels",
        "pallas",
        "--out",
        tmp_path,
    )
    assert rc == 0, capsys.readouterr().out
    (point,) = json.loads((tmp_path / "cost.json").read_text())["points"]
    assert {k: point[k] for k in FIVE_FLAGS_AT_4458BED} == FIVE_FLAGS_AT_4458BED


@pytest.mark.slow  # a GPU compile of the kernels alone: ~10 s; .ci/run's full tier has the plugin
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_pallas_vsn_compiles_for_the_h100_as_two_triton_kernels(dtype):
    from tftjax.models.kernels import pallas_vsn

    # TFT-225's widths; 32 row tiles in 8 backward splits: no padded rows
    m, n, dv, d = 33, 2048, 8, 128
    s = on_h100()
    shapes = fused.stacked_shapes(m, dv, d)
    p = {k: jax.ShapeDtypeStruct(v, jnp.dtype(dtype), sharding=s) for k, v in shapes.items()}
    x = jax.ShapeDtypeStruct((m, n), jnp.float32, sharding=s)
    keep = jax.ShapeDtypeStruct((m, n, dv), jnp.bool_, sharding=s)

    def loss(p, x, w, keep):
        return jnp.sum(pallas_vsn.weighted_grn_sum(p, x, w, keep, 0.1, interpret=False) ** 2)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(p, x, x, keep).compile()
    text = compiled.as_text()
    calls = triton_calls(text)
    # the forward, the recomputing backward, and the sum of its splits' partial gradients
    # (folded and padded inside the kernels: nothing else per parameter)
    assert sorted(c.split('name = "')[1].split('"')[0] for c in calls) == [
        "sum_splits",
        "vsn_grn_sum_bwd",
        "vsn_grn_sum_fwd",
    ]
    assert Program(text).census().kernels <= 8
    # nothing [m, N, d] lives between them: temp bytes under one such float32 tensor
    assert compiled.memory_analysis().temp_size_in_bytes < m * n * d * 4
    # the census reads the kernels' stated FLOPs: forward once, backward three times, at
    # d_v padded to Triton's smallest dot (16)
    assert Program(text).census().flops == 4 * pallas_vsn.matmul_flops(m, n, 16, d)


@pytest.mark.slow  # a GPU compile of the recurrences alone: a few seconds
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
def test_the_pallas_lstm_is_one_triton_kernel_each_way_on_the_h100():
    from tftjax.models.recurrence import lstm_recurrence

    t, b, f, d = 60, 256, 128, 128  # TFT-225's encoder + decoder steps, batch 256, bf16
    s = on_h100()
    sds = lambda shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=s)
    args = (
        sds((t, b, f)),
        sds((f, 4 * d)),
        sds((4 * d,)),
        sds((d, 4 * d), jnp.float32),
        sds((b, d), jnp.float32),
        sds((b, d)),
    )

    def loss(*a):
        (c, h), hs = lstm_recurrence(*a, False, KernelMode.COMPILED)
        return jnp.sum(c) + jnp.sum(hs.astype(jnp.float32))

    text = jax.jit(jax.grad(loss, argnums=tuple(range(6)))).lower(*args).compile().as_text()
    calls = triton_calls(text)
    assert sorted(c.split('name = "')[1].split('"')[0] for c in calls) == ["lstm_bwd", "lstm_fwd"]
    c = Program(text).census()
    # no per-step loop is left, and the whole gradient is a few dozen launches, not 7 × 2T
    assert c.loops == [] and c.kernels < 40, (c.kernels, c.loops)


@pytest.mark.slow  # a GPU compile of the optimizer alone: a few seconds
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
def test_the_pallas_optimizer_is_a_few_triton_kernels_on_the_h100():
    from tftjax.config import TrainConfig
    from tftjax.training.optimizer import make_optimizer

    # 60 leaves in two update kernels, named as the TFT's (decayed and spared), of one element
    # to several blocks; AdamW with its decay mask and a schedule
    tx = make_optimizer(
        TrainConfig(decay_all=False, lr_schedule="cosine", warmup_steps=2), 10, "pallas", False
    )
    s = on_h100()
    shapes = [(128, 128), (128,), (7,), (220, 8, 32)] * 15
    names = ["kernel", "bias", "ln_scale", "glu_k"] * 15
    params = {
        f"layer{i}": {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=s)}
        for i, (k, v) in enumerate(zip(names, shapes))
    }
    state = jax.eval_shape(tx.init, params)
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state)
    compiled = jax.jit(tx.step, donate_argnums=(0, 2)).lower(params, params, state).compile()
    text = compiled.as_text()
    calls = triton_calls(text)
    names = sorted(c.split('name = "')[1].split('"')[0] for c in calls)
    assert names == ["adamw_grad_norm"] + ["adamw_update"] * 2, names
    # optax's chain is one reduction and one update fusion per leaf (2 x 60 launches); here
    # the kernels, the partial sums' reduction and the scalars' fusions: no per-leaf copies
    # (the updates are in place in the donated buffers)
    assert Program(text).census().kernels <= len(calls) + 6


@pytest.mark.slow  # a GPU compile of the four GRNs alone: ~25 s (Triton, 16 backward branches)
@pytest.mark.heavy
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
def test_the_static_grns_are_two_triton_kernels_on_the_h100():
    from tftjax.models.kernels import pallas_grn

    # TFT-225's four static context GRNs at batch 256, as bf16 runs them: a bf16 input,
    # float32 parameters cast inside the kernels, dropout on
    d, n = 128, 256
    s = on_h100()
    sds = lambda shape, t=jnp.float32: jax.ShapeDtypeStruct(shape, t, sharding=s)
    shapes = dict(
        fc2_k=(d, d),
        fc2_b=(d,),
        fc1_k=(d, d),
        fc1_b=(d,),
        glu_k=(d, 2 * d),
        glu_b=(2 * d,),
        ln_scale=(d,),
        ln_bias=(d,),
    )
    ps = [{k: sds(v) for k, v in shapes.items()} for _ in range(4)]
    x, keeps = sds((n, d), jnp.bfloat16), [sds((n, d), jnp.bool_)] * 4

    def loss(ps, x, keeps):
        outs = pallas_grn.grn_stack(ps, x, keeps, 0.1, interpret=False)
        return sum(jnp.sum(o.astype(jnp.float32)) for o in outs)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))  # the loss too: the forward runs
    text = step.lower(ps, x, keeps).compile().as_text()
    calls = triton_calls(text)
    assert sorted(c.split('name = "')[1].split('"')[0] for c in calls) == [
        "grn_stack_bwd",
        "grn_stack_fwd",
    ]
    # XLA runs the four GRNs forward and backward as about 80 launches; here the two
    # kernels, the keep masks' stacking and the K input gradients' sum, and this loss's own
    # (per output a reduction and its cotangent's broadcast): 14 at jax 0.10.2
    assert Program(text).census().kernels <= 16


@pytest.mark.slow  # a GPU compile of a gate and a GRN alone: ~30 s (Triton)
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
def test_a_gate_and_a_grn_are_three_triton_kernels_each_on_the_h100():
    from tftjax.models.kernels import pallas_gated

    # TFT-225's LSTM gate and static enrichment at batch 256 (15,360 rows), as bf16 runs
    # them: bf16 inputs, float32 parameters cast inside the kernels, dropout on
    d, n = 128, 256 * 60
    s = on_h100()
    sds = lambda shape, t=jnp.float32: jax.ShapeDtypeStruct(shape, t, sharding=s)
    shapes = dict(
        fc2_k=(d, d),
        fc2_b=(d,),
        fc1_k=(d, d),
        fc1_b=(d,),
        glu_k=(d, 2 * d),
        glu_b=(2 * d,),
        ln_scale=(d,),
        ln_bias=(d,),
    )
    gate = {k: sds(shapes[k]) for k in pallas_gated.GATE_NAMES}
    grn = {k: sds(v) for k, v in shapes.items()}
    a, b, keep = sds((n, d), jnp.bfloat16), sds((n, d), jnp.bfloat16), sds((n, d), jnp.bool_)

    def loss(gate, grn, a, b, keep):
        y = pallas_gated.gated_rows(gate, a, b, keep, 0.1, grn=False, interpret=False)
        z = pallas_gated.gated_rows(grn, y, b, keep, 0.1, grn=True, interpret=False)
        return jnp.sum(z.astype(jnp.float32))

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    text = step.lower(gate, grn, a, b, keep).compile().as_text()
    calls = triton_calls(text)
    assert sorted(c.split('name = "')[1].split('"')[0] for c in calls) == [
        "gated_rows_bwd",
        "gated_rows_bwd",
        "gated_rows_fwd",
        "gated_rows_fwd",
        "sum_splits",
        "sum_splits",
    ]
    # XLA runs the two blocks forward and backward as about 60 launches; here the six
    # kernels, the keep mask's conversion, the two b gradients' sum, and this loss's own
    # (the reduction and its cotangent's broadcast)
    assert Program(text).census().kernels <= 14


@pytest.mark.slow  # a GPU compile of the attention alone: ~10 s (Triton)
@pytest.mark.skipif(
    not targets.available(), reason="needs jax's CUDA plugin (pip install 'tftjax[cuda12]')"
)
def test_the_attention_is_two_triton_kernels_on_the_h100():
    from tftjax.models.kernels import pallas_attention
    from tftjax.models.tft import causal_mask

    # TFT-225's attention at batch 256 in bf16: 10 queries over 60 keys, 4 heads of 32,
    # dropout on the weights
    b, h, dh, te, td = 256, 4, 32, 50, 10
    s = on_h100()
    sds = lambda shape, t=jnp.bfloat16: jax.ShapeDtypeStruct(shape, t, sharding=s)
    q, k, v = sds((b, td, h * dh)), sds((b, te + td, h * dh)), sds((b, te + td, dh))
    keep = sds((b, h, td, te + td), jnp.bool_)

    def loss(q, k, v, keep):
        out = pallas_attention.attend(
            q, k, v, causal_mask(te, td), keep, 0.1, heads=h, interpret=False
        )
        return jnp.sum(out.astype(jnp.float32))

    text = (
        jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        .lower(q, k, v, keep)
        .compile()
        .as_text()
    )
    calls = triton_calls(text)
    assert sorted(c.split('name = "')[1].split('"')[0] for c in calls) == [
        "attention_bwd",
        "attention_fwd",
    ]
    # XLA runs it forward and backward as about 25 launches; here the two kernels, the keep
    # mask's conversion, and this loss's own (the reduction and its cotangent's broadcast)
    assert Program(text).census().kernels <= 6
