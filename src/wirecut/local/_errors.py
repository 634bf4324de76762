"""The exceptions of the local layer.

The tree::

    Exception
    └── LocalError               anything that keeps the embedded llama.cpp from running
        ├── LocalUnavailable     the extra `local` is not installed (or is broken),
        │                        or no model could be had; the message says how to
        │                        install it
        ├── ModelFetchError      fetching the default model failed (pip failed, a
        │                        hash differed); the caller falls back to Gemma
        └── LocalServerError     the llama.cpp child did not start, died, or did not
                                 answer /health in time; the message carries the
                                 tail of its stderr

Third-party failures (a missing chunk package, a checksum mismatch, a child that
exits) are translated into this tree where they happen, with ``raise ... from``.
"""

from __future__ import annotations

__all__ = ["INSTALL_HINT", "LocalError", "LocalServerError", "LocalUnavailable", "ModelFetchError"]

#: How to get the extra; part of every ``LocalUnavailable`` message.
INSTALL_HINT = "install it with: pip install 'wirecut[local]'"


class LocalError(Exception):
    """Base class of the local layer's errors."""


class LocalUnavailable(LocalError):
    """The extra ``local`` (xllamacpp and the Gemma-3-270M packages) is missing."""

    def __init__(self, detail: str = "the embedded llama.cpp is not installed") -> None:
        super().__init__(f"{detail}; {INSTALL_HINT}")


class ModelFetchError(LocalError):
    """The default model could not be fetched into the cache; one line saying why.

    Nothing is left in the cache under the model's name.
    """


class LocalServerError(LocalError):
    """The llama.cpp server child failed to start or stopped answering.

    ``stderr_tail`` holds the last lines the child wrote to stderr (also part of
    the message), ``returncode`` its exit status when it had exited.
    """

    def __init__(
        self, message: str, *, stderr_tail: str = "", returncode: int | None = None
    ) -> None:
        full = message
        if returncode is not None:
            full += f" (exit status {returncode})"
        if stderr_tail:
            full += "\n--- llama.cpp stderr (tail) ---\n" + stderr_tail
        super().__init__(full)
        self.stderr_tail = stderr_tail
        self.returncode = returncode
