"""What a train step costs a GPU, without one: ``python -m tftjax.memory --target h100 --cost``.

For each tier and batch size the step is compiled for the target (a compile-only device,
:mod:`tftjax.memory.targets`) and its optimised program is read (:mod:`.hlo_cost`):

- kernels launched per step, while-loop trip counts multiplied out;
- HBM bytes per step and per sample (each launch's reads and writes);
- matmul FLOPs;
- XLA's temp bytes (the memory plan);
- a roofline estimate of the step's time: ``kernels × τ + bytes ÷ (η · bandwidth) + FLOPs ÷
  peak``, with ``τ`` (seconds per launch) and ``η`` (the share of the card's bandwidth a
  launch reaches) fitted to the step times measured on one H200 (:data:`MEASURED`), and the
  peak the target's dense tensor-core rate (bf16; TF32 half of it).

The fit has two constants and the H200 gave two f32 points, so it passes through both: its
error on them is zero by construction and says nothing about its extrapolation. What it
does give is the split of today's step into a launch floor and a per-sample memory term,
and how a design that changes the kernel count or the bytes moves the time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftjax.config import TFTConfig
from tftjax.memory.hlo_cost import Program


@dataclasses.dataclass(frozen=True)
class StepCost:
    tier: str
    precision: str
    batch_size: int
    target: str
    kernels: int
    hbm_bytes: int
    flops: int
    temp_bytes: int
    loops: tuple = ()
    """(op name, trips, kernels per trip) per while loop."""

    @property
    def bytes_per_sample(self) -> float:
        return self.hbm_bytes / self.batch_size

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["bytes_per_sample"] = self.bytes_per_sample
        d["loops"] = [list(x) for x in self.loops]
        return d


def step_cost(cfg: TFTConfig, batch_size: int, rows: int, target: str) -> StepCost:
    """The census of ``cfg``'s train step at ``batch_size`` compiled for GPU ``target``."""
    from tftjax.memory.analysis import compile_step, for_target, release_executables

    with for_target(target):
        compiled = compile_step(cfg, batch_size, rows)
        text = compiled.as_text()
        temp = int(compiled.memory_analysis().temp_size_in_bytes)
    del compiled
    release_executables()
    c = Program(text).census()
    return StepCost(
        cfg.execution.remat,
        cfg.execution.precision,
        batch_size,
        target,
        int(c.kernels),
        int(c.hbm_bytes),
        int(c.flops),
        temp,
        tuple((n, t, round(k, 2)) for n, t, k in c.loops),
    )


CALIBRATION = (
    # (batch, kernels, HBM bytes, FLOPs): the census of the step that ran on the H200
    # (TFT-225, off, f32), compiled for the h100 spec at revision 6c77bb1 (its temp bytes,
    # 7,112 MiB at batch 256, are the H200's measured ones)
    (64, 2366, 14_925_950_140, 18_189_223_552),
    (256, 2473, 58_914_278_208, 72_756_894_208),
)
MEASURED = {
    "device": "h200",
    "what": "TFT-225 train step, remat off, float32, jax 0.11.2 (CUDA 13), one NVIDIA H200",
    "samples_per_s": {64: 6839.0, 256: 13734.0},
}
"""The GPU step times the roofline is fitted to: the only GPU measurements the project has
(docs/precision-gpu.md)."""


@dataclasses.dataclass(frozen=True)
class Roofline:
    launch_s: float
    """Seconds per kernel launch (τ)."""
    bandwidth_share: float
    """η: the share of the card's HBM bandwidth the step's launches reach."""
    source: str

    def seconds(self, c: StepCost, bandwidth: float, flops_s: float) -> float:
        return (
            c.kernels * self.launch_s
            + c.hbm_bytes / (self.bandwidth_share * bandwidth)
            + c.flops / flops_s
        )

    def samples_per_s(self, c: StepCost, bandwidth: float, flops_s: float) -> float:
        return c.batch_size / self.seconds(c, bandwidth, flops_s)

    def split(self, c: StepCost, bandwidth: float, flops_s: float) -> dict:
        """The step's predicted seconds by term."""
        return {
            "launches_s": c.kernels * self.launch_s,
            "bytes_s": c.hbm_bytes / (self.bandwidth_share * bandwidth),
            "flops_s": c.flops / flops_s,
        }


def peak_flops(spec, precision: str) -> float:
    """The target's dense tensor-core rate for ``precision`` (f32 runs TF32 on the tensor
    cores at XLA:GPU's default precision: half the bf16 rate)."""
    return spec.tensor_flops_bf16 * (1.0 if precision == "bf16" else 0.5)


def fit(points: list[tuple[StepCost, float]], spec) -> Roofline:
    """τ and η through measured ``(census, seconds)`` points of one device (``spec``): least
    squares on ``seconds − FLOPs/peak = kernels·τ + bytes·(1/(η·bandwidth))``.

    Raises:
      ValueError: a fit without physical meaning (τ or η not positive), or fewer than two
        points.
    """
    if len(points) < 2:
        raise ValueError("the roofline needs at least two measured points")
    a = np.array([[c.kernels, c.hbm_bytes] for c, _ in points], dtype=np.float64)
    y = np.array([s - c.flops / peak_flops(spec, c.precision) for c, s in points])
    (tau, inv_bw), *_ = np.linalg.lstsq(a, y, rcond=None)
    if tau <= 0 or inv_bw <= 0:
        raise ValueError(
            f"the roofline fit is unphysical (τ={tau:.3g} s, 1/bandwidth="
            f"{inv_bw:.3g} s/B): the census does not explain the measured times"
        )
    share = 1.0 / (inv_bw * spec.bandwidth_bytes_s)
    return Roofline(
        float(tau),
        float(share),
        f"fitted to {MEASURED['what']} at batch "
        + ", ".join(str(b) for b in MEASURED["samples_per_s"]),
    )


def calibrated() -> Roofline:
    """The roofline through the H200's measured f32 points (:data:`CALIBRATION`)."""
    from tftjax.memory.targets import spec

    points = [
        (StepCost("off", "f32", b, "h100", k, nbytes, flops, 0), b / MEASURED["samples_per_s"][b])
        for b, k, nbytes, flops in CALIBRATION
    ]
    return fit(points, spec(MEASURED["device"]))


def report(
    cfg: TFTConfig, tiers: list[str], batch_sizes: list[int], rows: int, target: str, out
) -> list[dict]:
    """``--cost``: each tier's and batch size's census on ``target`` and the roofline's
    estimate of its samples/s there, printed and written to ``out/cost.json``."""
    import json
    from pathlib import Path

    from tftjax.memory.targets import spec

    s, roof = spec(target), calibrated()
    rows_out = []
    print(
        f"compiled for {s.description} (compile-only, no GPU ran); roofline: "
        f"{roof.launch_s * 1e6:.2f} us per launch, {roof.bandwidth_share:.2f} of "
        f"{s.bandwidth_bytes_s / 1e12:.2f} TB/s, {peak_flops(s, cfg.execution.precision) / 1e12:.0f} "
        f"TFLOP/s ({roof.source})"
    )
    print(
        f"{'tier':<11}{'batch':>6}{'kernels':>9}{'HBM MB/sample':>15}{'GFLOP':>9}"
        f"{'temp MiB':>10}{'est. samples/s':>16}"
    )
    for tier in tiers:
        for b in batch_sizes:
            c = step_cost(cfg.override(remat=tier), b, rows, target)
            bw, pk = s.bandwidth_bytes_s, peak_flops(s, cfg.execution.precision)
            est = roof.samples_per_s(c, bw, pk)
            row = {
                **c.as_dict(),
                "estimated_samples_per_s": est,
                "estimate_split_s": roof.split(c, bw, pk),
            }
            rows_out.append(row)
            print(
                f"{tier:<11}{b:>6}{c.kernels:>9,}{c.bytes_per_sample / 1e6:>15.1f}"
                f"{c.flops / 1e9:>9.1f}{c.temp_bytes / 2**20:>10,.0f}{est:>16,.0f}",
                flush=True,
            )
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "cost.json").write_text(
        json.dumps(
            {
                "target": target,
                "precision": cfg.execution.precision,
                "roofline": dataclasses.asdict(roof),
                "measured": {
                    **MEASURED,
                    "samples_per_s": {str(k): v for k, v in MEASURED["samples_per_s"].items()},
                },
                "points": rows_out,
            },
            indent=2,
        )
    )
    return rows_out
