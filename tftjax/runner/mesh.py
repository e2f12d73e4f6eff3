"""Data parallelism over a device mesh, and multi-host start-up.

One jitted train step serves 1..N devices: the step is compiled with the shardings of a
:class:`Parallel` (a 1-D ``jax.sharding.Mesh`` with axis ``"data"``):

* the batch of window starts is sharded over ``data`` (each device gathers and runs
  ``B / N`` windows; XLA inserts the all-reduce of the gradients),
* parameters, optimizer state, activation observers and the dropout key are replicated,
* the on-device feature matrix is replicated, or sharded by rows when a replica would
  take more than :data:`FEATURE_SHARE` of a device's memory (``--feature-layout``; see
  :func:`gather_rows_sharded`: the gather of windows then costs one reduce-scatter).

Several hosts: :func:`initialize` calls ``jax.distributed.initialize`` from
``--coordinator/--num-processes/--process-id``, from ``JAX_COORDINATOR_ADDRESS`` (with
``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``), or inside an ``srun`` step of several tasks or an
``mpirun`` job, where JAX reads the environment itself (``TFTJAX_DISTRIBUTED=0`` opts out). Every process computes the same global batch order (same seed)
and feeds only its own rows (:meth:`Parallel.batch`,
``jax.make_array_from_process_local_data``), so a run on P processes sees exactly the
batches of a run on one.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tftjax.errors import ConfigError
from tftjax.runner.devices import device_limit

AXIS = "data"
FEATURE_SHARE = 0.25
"""A replica of the feature arrays may take this share of a device's memory limit; above
it (``--feature-layout auto``) they are sharded by rows."""
LAYOUTS = ("auto", "replicated", "rows")


# --------------------------------------------------------------------------- multi-host
def wants_distributed(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """Whether flags or the environment ask for a multi-process run."""
    if coordinator or num_processes or process_id is not None:
        return True
    if os.environ.get("TFTJAX_DISTRIBUTED") == "0":  # opt out of the environment's hints
        return False
    return bool(os.environ.get("JAX_COORDINATOR_ADDRESS")) or _cluster_tasks() > 1


def _cluster_tasks() -> int:
    """Tasks of the job step this process runs in: ``srun`` sets SLURM_STEP_NUM_TASKS (a
    batch script's own environment, outside ``srun``, does not: a plain run there stays one
    process), ``mpirun`` OMPI_COMM_WORLD_SIZE."""
    for var in ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        try:
            n = int(os.environ.get(var, "1") or 1)
        except ValueError:
            continue
        if n > 1:
            return n
    return 1


def initialize(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """``jax.distributed.initialize`` when asked for (flags, ``JAX_COORDINATOR_ADDRESS``,
    a SLURM or Open MPI job of several tasks); call it before anything else touches JAX.
    Returns whether a multi-process runtime is up.

    Raises:
      ConfigError: incomplete flags, or the coordinator cannot be reached.
    """
    if not wants_distributed(coordinator, num_processes, process_id):
        return False
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = int(os.environ["JAX_PROCESS_ID"])
    given = {
        "--coordinator": coordinator,
        "--num-processes": num_processes,
        "--process-id": process_id,
    }
    if _cluster_tasks() == 1 and None in given.values():
        missing = [k for k, v in given.items() if v is None]
        raise ConfigError(
            f"a multi-process run needs --coordinator HOST:PORT, --num-processes "
            f"and --process-id (missing: {', '.join(missing)}); or run under "
            "SLURM/Open MPI, where JAX reads them from the environment"
        )
    if coordinator is not None and ":" not in coordinator:
        raise ConfigError(f"--coordinator {coordinator!r} must be HOST:PORT, e.g. node0:1234")
    if num_processes is not None and num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise ConfigError(f"--process-id {process_id} is not in [0, {num_processes})")
    try:
        jax.distributed.initialize(
            coordinator,
            num_processes,
            process_id,
            initialization_timeout=int(os.environ.get("TFTJAX_INIT_TIMEOUT", "300")),
        )
    except (RuntimeError, ValueError) as e:  # XlaRuntimeError is a RuntimeError
        raise ConfigError(
            f"jax.distributed.initialize ({coordinator}, process {process_id} of "
            f"{num_processes}) failed: {str(e).splitlines()[0][:200]}"
        ) from None
    return True


def is_primary() -> bool:
    """Process 0: the one that writes logs, metrics, summaries and plots."""
    return jax.process_index() == 0


# --------------------------------------------------------------------------- the mesh
@dataclasses.dataclass(frozen=True)
class Parallel:
    """A 1-D data-parallel mesh and the shardings of the train and eval steps. Equal meshes
    compare (and hash) equal, so that the steps compiled for one are reused by every run of
    the process on the same devices."""

    mesh: Mesh
    layout: str = "replicated"
    """Of the feature arrays: ``replicated``, ``rows``, or ``auto`` (decided by
    :meth:`for_features` from their size)."""

    @property
    def feature_rows_sharded(self) -> bool:
        return self.layout == "rows"

    def for_features(self, feature_bytes: int) -> Parallel:
        """This mesh with the feature layout decided: ``auto`` becomes ``rows`` when a replica
        would take more than :data:`FEATURE_SHARE` of a device's reported memory limit
        (never on CPU, which reports none), else ``replicated``."""
        if self.layout != "auto":
            return self
        limit = device_limit(self.mesh.devices.flat[0])
        rows = limit is not None and self.size > 1 and feature_bytes > FEATURE_SHARE * limit
        return Parallel(self.mesh, "rows" if rows else "replicated")

    @property
    def size(self) -> int:
        return self.mesh.devices.size

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def batch_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(AXIS))

    @property
    def micro_batch_sharding(self) -> NamedSharding:
        """``[K, B/K]`` accumulated micro-batches: each sharded over the devices."""
        return NamedSharding(self.mesh, P(None, AXIS))

    @property
    def rows_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(AXIS))

    def data_shardings(self):
        """Shardings of :class:`~tftjax.data.DeviceData` (every field by rows, or replicated)."""
        from tftjax.data import DeviceData

        r = self.rows_sharding if self.feature_rows_sharded else self.replicated
        return DeviceData._make([r] * len(DeviceData._fields))  # a pytree of shardings

    def describe(self) -> str:
        kinds = sorted({d.device_kind for d in self.mesh.devices.flat})
        procs = jax.process_count()
        if self.size == 1:
            return f"1 device ({', '.join(kinds)})"
        return (
            f"{self.size} devices ({', '.join(kinds)}"
            + (f", {procs} processes" if procs > 1 else "")
            + "), batch sharded over them; "
            + {
                "rows": "feature rows sharded over them",
                "replicated": "features replicated",
                "auto": "feature layout decided by their size",
            }[self.layout]
        )

    # ---- placing arrays
    def replicate(self, tree: Any) -> Any:
        """Every leaf as a replicated global array (host values must be the same on every
        process); PRNG key arrays stay key arrays."""
        return jax.tree.map(lambda x: _global(x, self.replicated), tree)

    def batch(self, idx: np.ndarray) -> jax.Array:
        """The global batch ``idx [B]`` (the same on every process) sharded over the devices;
        each process places only its own rows."""
        idx = np.asarray(idx)
        check_divisible(idx.shape[0], self.size)
        if jax.process_count() == 1:
            return jax.device_put(idx, self.batch_sharding)
        # this process's devices hold one contiguous block of rows (the mesh lists the devices
        # process by process): feed only that block
        index_map = self.batch_sharding.addressable_devices_indices_map(idx.shape)
        rows = [s[0] for s in index_map.values() if s is not None]
        lo = min(r.start or 0 for r in rows)
        hi = max(idx.shape[0] if r.stop is None else r.stop for r in rows)
        return jax.make_array_from_process_local_data(self.batch_sharding, idx[lo:hi], idx.shape)

    def put_data(self, features) -> Any:
        """The feature arrays on the mesh: replicated or sharded by rows (padded to a multiple
        of the device count; padding rows are never read)."""
        from tftjax.data import DeviceData
        from tftjax.data.windows import device_arrays

        arrays = device_arrays(features)
        if self.feature_rows_sharded:
            n = arrays[0].shape[0]
            pad = -n % self.size
            arrays = [np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)]) for a in arrays]
        shardings: list = list(self.data_shardings())
        return DeviceData._make([_global(a, s) for a, s in zip(arrays, shardings)])


def _global(x, sharding: NamedSharding) -> jax.Array:
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        return jax.random.wrap_key_data(_global(jax.random.key_data(x), sharding), impl=impl)
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def make_parallel(devices: int | None = None, layout: str = "auto") -> Parallel:
    """The mesh of the first ``devices`` local devices of every process (default: all), and
    the feature layout (``auto`` is decided by :meth:`Parallel.for_features`).

    Raises:
      ConfigError: more devices asked for than there are, or an unknown layout.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"--feature-layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    local = jax.local_devices()
    n = len(local) if devices is None else devices
    if not 1 <= n <= len(local):
        raise ConfigError(
            f"--devices {n}: this process sees {len(local)} "
            f"{local[0].platform.upper()} device{'s' if len(local) > 1 else ''}"
            + (
                " (CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N simulates N)"
                if local[0].platform == "cpu"
                else ""
            )
        )
    if jax.process_count() == 1:
        devs = local[:n]
    else:
        by_proc: dict[int, list] = {}
        for d in jax.devices():
            by_proc.setdefault(d.process_index, []).append(d)
        devs = [d for p in sorted(by_proc) for d in sorted(by_proc[p], key=lambda d: d.id)[:n]]
    # Mesh, not jax.make_mesh: the device order is ours (each process's devices one
    # contiguous block of the batch, which Parallel.batch feeds), and the axis stays in
    # "auto" sharding mode (make_mesh defaults to explicit axes in this JAX)
    return Parallel(Mesh(np.array(devs), (AXIS,)), layout)


def check_divisible(batch: int, devices: int, what: str = "--batch-size") -> None:
    if batch % devices:
        raise ConfigError(
            f"{what} {batch} is not divisible by the {devices} devices of the "
            f"mesh: use a multiple of {devices} (e.g. {batch + devices - batch % devices}) "
            "or --devices N"
        )


# --------------------------------------------------------------------------- row-sharded gather
def gather_rows_sharded(
    par: Parallel, data, starts: jax.Array, encoder_steps: int, decoder_steps: int
):
    """:func:`tftjax.data.gather` for feature arrays sharded by rows (``starts [B]`` sharded
    over the devices). Each device gathers, for the whole global batch, the rows it holds
    (zeros elsewhere); one reduce-scatter sums the devices' parts (exact: one term per
    element is non-zero) and leaves every device its own ``B / N`` windows. A device's
    temporary is the global batch's windows, never the feature matrix."""
    from tftjax.data import Batch, DeviceData

    spec = DeviceData._make([P(AXIS)] * len(DeviceData._fields))

    def local(d: DeviceData, s):
        everyone = jax.lax.all_gather(s, AXIS, tiled=True)  # [B] window starts
        n_local = d.historical.shape[0]
        lo = jax.lax.axis_index(AXIS) * n_local
        e, T = encoder_steps, encoder_steps + decoder_steps
        rows = everyone[:, None] + jnp.arange(T, dtype=everyone.dtype)
        last = everyone + (e - 1)

        def take(a, r):  # rows r of the global array, zero where another device holds them
            own = (r >= lo) & (r < lo + n_local)
            x = jnp.take(a, jnp.clip(r - lo, 0, n_local - 1), axis=0)
            return jnp.where(own.reshape(own.shape + (1,) * (x.ndim - own.ndim)), x, 0)

        parts = (
            take(d.historical, rows[:, :e]),
            take(d.known, rows[:, :e]),
            take(d.future, last)[:, :decoder_steps],
            take(d.target, last)[:, :decoder_steps],
            take(d.scale, last),
            take(d.static, last),
            take(d.anchor, last)[:, :decoder_steps],
            take(d.anchor_z, last),
            take(d.instrument, last),
        )
        hist, known_e, known_d, target, scale, static, anchor, anchor_z, instrument = (
            jax.lax.psum_scatter(p, AXIS, scatter_dimension=0, tiled=True) for p in parts
        )
        return Batch(
            static,
            hist,
            jnp.concatenate([known_e, known_d], axis=1),
            target,
            scale,
            anchor,
            anchor_z,
            instrument,
        )

    out = Batch._make([P(AXIS)] * len(Batch._fields))
    return jax.shard_map(
        local, mesh=par.mesh, in_specs=(spec, P(AXIS)), out_specs=out, check_vma=False
    )(data, starts)
