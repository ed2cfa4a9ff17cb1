"""Jupyter's kernel API on replgate sessions, in Jupyter Kernel Gateway's shape (``/api/...``).

The routes are in :mod:`gateway.routers.jupyter`; this package is the adapter behind them:
kernelspecs and kernel models (:mod:`._kernels`), the channels WebSocket (:mod:`._channels`),
the passes onto it for clients that send no key there (:mod:`._passes`), and Jupyter's message
framing (:mod:`.protocol`).
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
from gateway.jupyter._passes import ChannelPasses, channel_passes, peer

__all__ = [
    "DEFAULT_KERNEL",
    "ChannelPasses",
    "JupyterRoute",
    "channel_passes",
    "find_profile",
    "kernel_model",
    "kernelspec",
    "kernelspecs",
    "peer",
    "serve_channels",
]
