"""The flavour-free building blocks of ``wirecut.http``, for the layers built on it.

``wirecut.adapters`` binds them to httpx2/httpcore2 (the openai SDK) and to
urllib3 (requests); ``wirecut.provider`` and ``wirecut.proxy`` validate
their timeouts with ``check_seconds`` and their base URLs with
``check_http_url``. Nothing here is public API.
"""

from wirecut.http._backend import (
    ScopedBackendCore,
    ScopedStreamCore,
    check_seconds,
)
from wirecut.http._per_scope import PerScope
from wirecut.http._socket_hold import SocketHold
from wirecut.http._thirdparty import (
    httpcore_flavour,
    require_private,
    socket_io_refs,
)
from wirecut.http._transport import (
    ReleasingStreamCore,
    ScopedTransportCore,
    scoped_client,
)
from wirecut.http._url import check_http_url

__all__ = [
    "PerScope",
    "ReleasingStreamCore",
    "ScopedBackendCore",
    "ScopedStreamCore",
    "ScopedTransportCore",
    "SocketHold",
    "check_http_url",
    "check_seconds",
    "httpcore_flavour",
    "require_private",
    "scoped_client",
    "socket_io_refs",
]
