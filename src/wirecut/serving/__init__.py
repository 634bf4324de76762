"""Serving the apps' HTTP: uvicorn on a thread or in the foreground.

An app layer shared by the console, the proxy, the simulator, ``local`` and
the proof tools; it imports none of them. ``Server`` is uvicorn told when it
listens and what to end before its own shutdown, ``ServerThread`` runs it on a
background thread.
"""

from wirecut.serving._uvicorn import Server, ServerThread, http_base, listen

__all__ = ["Server", "ServerThread", "http_base", "listen"]
