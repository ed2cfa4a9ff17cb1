"""replgate's kernel pool: warm, hardened, containerized Jupyter kernels for agents.

Usable on its own from any async Python::

    pool = KernelPool(PoolSettings(state_dir=Path("state")))
    await pool.start()
    session = await pool.create_session()
    result = await session.execute("1 + 1")   # Execution(status="ok", outputs=[...])
    await pool.close()

Names are imported lazily, so ``kernel_pool.events`` stays light (pydantic only) for clients.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BackendError": "kernel_pool.exceptions",
    "CapacityError": "kernel_pool.exceptions",
    "Event": "kernel_pool.events",
    "Execution": "kernel_pool.events",
    "ExecutionHandle": "kernel_pool.session",
    "ExecutionStatus": "kernel_pool.events",
    "InvalidRequest": "kernel_pool.exceptions",
    "KernelPool": "kernel_pool.pool",
    "KernelPoolError": "kernel_pool.exceptions",
    "OutputCaps": "kernel_pool.config",
    "PoolSettings": "kernel_pool.config",
    "Profile": "kernel_pool.config",
    "QueueFull": "kernel_pool.exceptions",
    "Session": "kernel_pool.session",
    "SessionClosed": "kernel_pool.exceptions",
    "SessionNotFound": "kernel_pool.exceptions",
    "SessionStatus": "kernel_pool.session",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernel_pool' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
