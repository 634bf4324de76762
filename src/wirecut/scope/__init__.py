"""InterruptScope: cancel that cuts sockets, processes, agent turns and threads.

Stdlib only. A host creates a scope per unit of work, binds it around the
worker (``bind_scope`` or ``scope.run``), and everything the work starts
registers with the bound scope; ``scope.cancel()`` cuts it all, including what
tries to start after the cancel. See ``InterruptScope`` for the details and
``_errors`` for the exception tree.
"""

from wirecut.scope._binding import (
    NULL_REGISTRATION,
    NullRegistration,
    bind_scope,
    check,
    current_scope,
    register,
    register_process,
    register_socket,
    sleep,
    wait,
)
from wirecut.scope._cuttables import cut_socket
from wirecut.scope._errors import Interrupted
from wirecut.scope._interrupt_scope import (
    Interruptible,
    InterruptScope,
    Registration,
    ScopedPopen,
    ScopeExecutor,
    ScopeState,
)

__all__ = [
    "NULL_REGISTRATION",
    "InterruptScope",
    "Interrupted",
    "Interruptible",
    "NullRegistration",
    "Registration",
    "ScopeExecutor",
    "ScopeState",
    "ScopedPopen",
    "bind_scope",
    "check",
    "current_scope",
    "cut_socket",
    "register",
    "register_process",
    "register_socket",
    "sleep",
    "wait",
]
