"""The console's commands on a Ray cluster (extra ``ray``): ``ClusterRunner`` and its hosts.

The same ``Runner`` contract as ``CommandRunner``: the console, its
WebSocket, the lifecycle table and the terminal frame stay in the serve
process; the commands run in command-host actors on the cluster's nodes,
and their cancel goes through wirecut's own control path, not Ray's. See
docs/cluster.md.

Importing this package imports Ray: an ``ImportError`` means the extra is
not installed.
"""

from wirecut.console.cluster._connect import (
    ClusterUnavailable,
    address_problem,
    connect,
    disconnect,
)
from wirecut.console.cluster._host import (
    CommandHost,
    HostConfig,
    HostIdentity,
    HostReceipt,
    NodeWarden,
)
from wirecut.console.cluster._pool import NAMESPACE, Host, HostPool, HostState
from wirecut.console.cluster._remote import Outcome, RemoteJob
from wirecut.console.cluster._runner import (
    LEASE_SECONDS,
    ClusterRunner,
    ProviderSpec,
    RemoteCommand,
    placement,
)

__all__ = [
    "LEASE_SECONDS",
    "NAMESPACE",
    "ClusterRunner",
    "ClusterUnavailable",
    "CommandHost",
    "Host",
    "HostConfig",
    "HostIdentity",
    "HostPool",
    "HostReceipt",
    "HostState",
    "NodeWarden",
    "Outcome",
    "ProviderSpec",
    "RemoteCommand",
    "RemoteJob",
    "address_problem",
    "connect",
    "disconnect",
    "placement",
]
