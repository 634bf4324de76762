"""The console: a host that runs commands on a thread pool and cancels them for real.

``runner`` owns the worker threads, the futures and the scopes (it knows
nothing about WebSockets); ``commands`` holds commands as values, the
command set and its parser, and the built-in commands; ``server`` is the
Starlette app (``/api/console``, ``/api/health``, ``/metrics``, the web
page) that ``wirecut serve`` runs;
``terminal`` is the ``wirecut console`` client, which speaks only the protocol.
"""
