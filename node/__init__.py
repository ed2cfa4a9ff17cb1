"""replgate on many machines: the node agent that runs sessions, and the gateway's way to them.

- :mod:`node.wire`: the port's requests and answers as they cross the network;
- :mod:`node.server`, :mod:`node.channel_server`, :mod:`node.agent`: ``replgate node``, serving
  a host's kernel pool over mutual TLS (requests, the executions' channel, registration);
- :mod:`node.placement`: the gateway's side, :class:`~node.placement.RemoteNodes`, a
  :class:`~kernel_pool.SessionHost` over the nodes; :mod:`node.recovery`, its sessions placed
  again when their node is lost or drained;
- :mod:`node.remote`, :mod:`node.client`: a :class:`~kernel_pool.SessionPort` per remote
  session, and one node's requests and channel;
- :mod:`node.registry`: nodes, their heartbeats and capacity, placement and fencing, in the
  shared database;
- :mod:`node.tls`: the certificates a local cluster uses.

Below ``gateway``, above ``common`` and ``kernel_pool``: nothing here imports ``gateway``.
"""
