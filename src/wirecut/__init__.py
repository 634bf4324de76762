"""wirecut: a console for LLM-agent commands whose cancel really cancels.

The layers, bottom up (dependencies point down only):

- ``wirecut.scope``: InterruptScope, binding, cuttables, ledger (stdlib only).
- ``wirecut.http``: an httpx transport whose sockets register with the bound scope.
- ``wirecut.provider``: the OpenAI-compatible chat client.
- ``wirecut.agent``: AIAgent and its tools.
- ``wirecut.simulator``: a llama.cpp-like provider for tests, repro and bench.
- ``wirecut.local``: the embedded real llama.cpp with a small model from PyPI.
"""

__version__ = "0.1.0"
