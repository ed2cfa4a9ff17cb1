"""What the gateway and the node both stand on: the database and its migrations, the store's
core and the sessions' records, settings, the policy loader, keys, the error table, tracing
and metrics.

Below ``gateway`` and ``node``, above ``kernel_pool``: it imports neither of the first two
(``tests/common/test_floors.py``). This ``__init__`` imports nothing, so that a light module
here (``common.paths``, read by the agents' client) stays light.
"""
