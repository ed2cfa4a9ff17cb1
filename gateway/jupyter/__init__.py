"""Jupyter's kernel API on replgate sessions, in Jupyter Kernel Gateway's shape (``/api/...``).

The routes are in :mod:`gateway.routers.jupyter`; this package is the adapter behind them:
kernelspecs and kernel models (:mod:`._kernels`), the channels WebSocket (:mod:`._channels`),
and Jupyter's message framing (:mod:`.protocol`).
"""

from gateway.jupyter._kernels import (
    DEFAULT_KERNEL,
    JupyterRoute,
    find_profile,
    kernel_model,
    kernelspec,
    kernelspecs,
    serve_channels,
)

__all__ = [
    "DEFAULT_KERNEL",
    "JupyterRoute",
    "find_profile",
    "kernel_model",
    "kernelspec",
    "kernelspecs",
    "serve_channels",
]
