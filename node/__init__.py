"""replgate on many machines: the node agent that runs sessions, and the gateway's way to them.

- :mod:`node.wire`: the port's requests and answers as they cross the network;
- :mod:`node.server`: ``replgate node``, serving a host's kernel pool over mutual TLS;
- :mod:`node.remote`: the gateway's side, a :class:`~kernel_pool.SessionPort` per remote session;
- :mod:`node.registry`: nodes, their heartbeats and capacity, placement and fencing, in the
  shared database;
- :mod:`node.tls`: the certificates a local cluster uses.
"""
