"""replgate for agents: ``from replgate import Sandbox``.

    from replgate import Sandbox

    with Sandbox.create() as sbx:          # the gateway of this machine (see below)
        print(sbx.run_code("print(21 * 2)").stdout)

The client of :mod:`gateway.client`, under the package's own name: ``Sandbox`` (blocking) and
``AsyncSandbox``, the execution and file models, the errors, and the tools for a model.
``Sandbox.create()`` with no arguments finds the gateway of this machine as ``replgate mcp``
does: ``REPLGATE_URL`` and ``REPLGATE_API_KEY``, else ``http://127.0.0.1:8000`` and the key
``replgate serve`` keeps in its state folder (``REPLGATE_STATE_DIR``, by default
``~/.local/state/replgate``). Like ``gateway.client``, it needs no server package.
"""

from gateway.client import *  # noqa: F403  (the client's public names, exactly)
from gateway.client import __all__ as __all__
