"""GPUs to compile for without one: ``python -m tftjax.memory --target h100``.

XLA compiles for an NVIDIA target on any machine with the CUDA plugin installed
(``pip install "tftjax[cuda12]"``; no GPU, no driver needed): a compile-only device is
made from a ``GpuTargetConfig`` text proto, the step is lowered against
``ShapeDtypeStruct``s placed on it, and ``memory_analysis()`` reads the compiled plan. So
"will it fit on my 24 GB card?" is answered before renting one.

The specs below are written from the vendors' published figures (compute capability,
SM count, memory size and bandwidth, L2, shared memory per SM, boost clock), except the
H100's, which is what the CUDA runtime reports for an H100 80GB HBM3 (the same fields XLA
keeps under ``xla/tools/hlo_opt/gpu_specs``). XLA uses them to choose fusions, tilings
and the memory plan; the bytes a step needs do not depend on the clock or bandwidth.
Checked: TFT-225 at batch 256 compiled for the ``h100`` spec gives the temp bytes that
a real H200 gave for the same steps to within 1% (see api_notes in the design notes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tftjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """The figures of a GPU that XLA's compiler reads."""

    name: str
    description: str
    compute_capability: tuple[int, int]
    sm_count: int
    memory_bytes: int
    bandwidth_bytes_s: float
    l2_bytes: int
    shared_per_sm: int
    shared_per_block_optin: int
    clock_ghz: float
    fpus_per_sm: int
    source: str
    tensor_flops_bf16: float = 0.0
    """Dense bf16 tensor-core FLOP/s (float32 accumulation; the vendor's figure without
    sparsity): the roofline's compute term (tftjax.memory.cost)."""
    """Where the figures come from."""

    def target_config(self) -> str:
        """The ``GpuTargetConfig`` text proto of this GPU."""
        major, minor = self.compute_capability
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_per_sm}
  threads_per_core_limit: {1536 if (major, minor) in ((8, 6), (8, 9)) else 2048}
  core_count: {self.sm_count}
  fpus_per_core: {self.fpus_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.bandwidth_bytes_s)}
  l2_cache_size: {self.l2_bytes}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: {self.shared_per_block_optin}
  cuda_compute_capability {{
    major: {major}
    minor: {minor}
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
runtime_version {{
  major: 12
  minor: 8
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 7
}}
device_description_str: "{self.description}"
"""


GiB = 1 << 30
TARGETS: dict[str, GPUSpec] = {
    "h100": GPUSpec(
        "h100",
        "NVIDIA H100 80GB HBM3",
        (9, 0),
        132,
        84_929_347_584,
        3.35232e12,
        50 * 2**20,
        233_472,
        232_448,
        1.98,
        128,
        "CUDA runtime of an H100 80GB HBM3 (SXM)",
        989.4e12,
    ),
    "h200": GPUSpec(
        "h200",
        "NVIDIA H200",
        (9, 0),
        132,
        141 * 10**9,
        4.8e12,
        50 * 2**20,
        233_472,
        232_448,
        1.98,
        128,
        "NVIDIA H200 SXM datasheet (141 GB HBM3e, 4.8 TB/s); Hopper SM as H100",
        989.4e12,
    ),
    "a100": GPUSpec(
        "a100",
        "NVIDIA A100-SXM4-80GB",
        (8, 0),
        108,
        80 * GiB,
        2.039e12,
        40 * 2**20,
        167_936,
        166_912,
        1.41,
        64,
        "NVIDIA A100 datasheet (80 GB HBM2e SXM, 2,039 GB/s, 108 SMs, 40 MB L2)",
        312e12,
    ),
    "rtx4090": GPUSpec(
        "rtx4090",
        "NVIDIA GeForce RTX 4090",
        (8, 9),
        128,
        24 * GiB,
        1.008e12,
        72 * 2**20,
        102_400,
        101_376,
        2.52,
        128,
        "NVIDIA Ada Lovelace whitepaper (24 GB GDDR6X, 1,008 GB/s, 128 SMs, 72 MB L2)",
        165.2e12,
    ),
    "a4000": GPUSpec(
        "a4000",
        "NVIDIA RTX A4000",
        (8, 6),
        48,
        16 * GiB,
        448e9,
        4 * 2**20,
        102_400,
        101_376,
        1.56,
        128,
        "NVIDIA RTX A4000 datasheet (16 GB GDDR6, 448 GB/s, 48 SMs)",
        76.7e12,
    ),
}


def spec(name: str) -> GPUSpec:
    """The spec of ``--target NAME``.

    Raises:
      ConfigError: not a known target.
    """
    try:
        return TARGETS[name.lower()]
    except KeyError:
        raise ConfigError(
            f"--target {name!r} is not a known GPU; choose one of: {', '.join(TARGETS)}"
        ) from None


def compile_only_device(name: str) -> Any:
    """A compile-only device for GPU ``name`` (its ``jax.Device``: place
    ``ShapeDtypeStruct``s on it with ``SingleDeviceSharding``, then lower and compile).

    Raises:
      ConfigError: an unknown target, or no CUDA plugin installed (the cuda12 extra).
    """
    s = spec(name)
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(
            platform="cuda", topology="1x1x1", target_config=s.target_config()
        )
    except Exception as e:  # no plugin, or an incompatible one
        raise ConfigError(
            f"--target {name}: compiling for a GPU needs the CUDA plugin of this "
            f"jax (pip install 'tftjax[cuda12]'): {str(e).splitlines()[0][:160]}"
        ) from None
    return topo.devices[0]


def jax_pool_fraction() -> float:
    """The share of a GPU's memory JAX's allocator may use in a run on it (its
    ``bytes_limit``): ``XLA_PYTHON_CLIENT_MEM_FRACTION`` of this environment, else JAX's
    default 0.75 (preallocated, or the cap when ``XLA_PYTHON_CLIENT_PREALLOCATE=false``).

    Raises:
      ConfigError: the variable is not a fraction in (0, 1].
    """
    import os

    text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")
    try:
        frac = float(text)
    except ValueError:
        frac = -1.0
    if not 0.0 < frac <= 1.0:
        raise ConfigError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r}: give a fraction in (0, 1]")
    return frac


def available() -> bool:
    """Whether this installation can compile for a GPU target (the CUDA plugin loads)."""
    try:
        compile_only_device("h100")
    except ConfigError:
        return False
    return True
