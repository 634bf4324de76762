"""InterruptScope: cancel that cuts sockets, processes, agent turns and threads.

Stdlib only. A host creates a scope per unit of work, binds it around the
worker (``bind_scope`` or ``scope.run``), and everything the work starts
registers with the bound scope; ``scope.cancel()`` cuts it all, including what
tries to start after the cancel. See ``InterruptScope`` for the details and
``_errors`` for the exception tree.

The modules: ``_interrupt_scope`` (the scope: cancel, registering, the
ledger), ``_registration`` (a registration and its kinds), ``_cuttables``
(what can be cut; sockets and objects), ``_process`` (process groups, /proc,
``scope.popen``), ``_reaper`` (kills our process groups if we die first),
``_threads`` (owned threads, the executor, escalation), ``_shield`` (a
commit section keeps a cancel from its thread until it ends),
``_binding`` (the ContextVar), ``_timers`` (clocks), ``_timeline`` (the
unwind's events), ``_errors`` (the exception tree).
"""

from wirecut.scope._binding import (
    NULL_REGISTRATION,
    NullRegistration,
    bind_scope,
    check,
    committing,
    current_scope,
    register,
    register_process,
    register_socket,
    sleep,
    wait,
)
from wirecut.scope._cuttables import Interruptible, cut_socket
from wirecut.scope._errors import Interrupted
from wirecut.scope._interrupt_scope import InterruptScope, ScopeState
from wirecut.scope._process import (
    ProcStat,
    ScopedPopen,
    kill_process_group,
    proc_stat,
)
from wirecut.scope._reaper import unwatch_group, watch_group
from wirecut.scope._registration import Registration
from wirecut.scope._threads import ScopeExecutor
from wirecut.scope._timeline import TimelineEvent
from wirecut.scope._timers import MockClock

__all__ = [
    "NULL_REGISTRATION",
    "InterruptScope",
    "Interrupted",
    "Interruptible",
    "MockClock",
    "NullRegistration",
    "ProcStat",
    "Registration",
    "ScopeExecutor",
    "ScopeState",
    "ScopedPopen",
    "TimelineEvent",
    "bind_scope",
    "check",
    "committing",
    "current_scope",
    "cut_socket",
    "kill_process_group",
    "proc_stat",
    "register",
    "register_process",
    "register_socket",
    "sleep",
    "unwatch_group",
    "wait",
    "watch_group",
]
