"""Jupyter's kernel API on replgate sessions, in Jupyter Kernel Gateway's shape (``/api/...``).

The routes are in :mod:`gateway.routers.jupyter`; this package is the adapter behind them:
kernelspecs and kernel models (:mod:`._kernels`), the channels WebSocket (:mod:`._channels`),
the passes onto it for clients that send no key there (:mod:`._passes`), and Jupyter's message
framing (:mod:`.protocol`).
"""

from gateway.jupyter._kernels import (
    DEFAULT_KERNEL,
    KERNEL_LANGUAGE_KEY,
    JupyterRoute,
    find_kernelspec,
    interrupt_kernel,
    kernel_language,
    kernel_model,
    kernelspec,
    kernelspecs,
    restart_kernel,
    serve_channels,
)
from gateway.jupyter._passes import ChannelPasses, channel_passes, peer

__all__ = [
    "DEFAULT_KERNEL",
    "KERNEL_LANGUAGE_KEY",
    "ChannelPasses",
    "JupyterRoute",
    "channel_passes",
    "find_kernelspec",
    "interrupt_kernel",
    "kernel_language",
    "kernel_model",
    "kernelspec",
    "kernelspecs",
    "peer",
    "restart_kernel",
    "serve_channels",
]
