"""RPC endpoints, one module per kind of object; importing this package registers them all.

Each module registers its handlers in ``node.endpoints.registry`` as it is
imported; the server wraps every entry of ``METHODS`` and ``STREAMS``.
"""

from node.endpoints import (  # noqa: F401 - imported for their registrations
    acl,
    allocs,
    clients,
    deployments,
    evals,
    events,
    jobs,
    nodes,
    operator,
    queues,
    snapshot,
    system,
    workers,
)
