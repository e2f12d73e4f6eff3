"""What the devices say about themselves: memory limits and statistics.

The mesh (:mod:`tftjax.runner.mesh`) and the memory planner (:mod:`tftjax.memory`) both
ask the device how much it may hold; the answer lives here, below both.
"""

from __future__ import annotations

import jax


def memory_stats(device=None) -> dict | None:
    """``device.memory_stats()`` (``bytes_in_use``, ``peak_bytes_in_use``, ``bytes_limit`` on
    a GPU), or None where the backend keeps none (CPU)."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # backends without the API
        return None
    return dict(stats) if stats else None


def device_limit(device=None) -> int | None:
    """The bytes JAX may allocate on ``device`` (``memory_stats()["bytes_limit"]``: the
    preallocated fraction on a GPU), or None where the backend does not say (CPU)."""
    stats = memory_stats(device)
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None
