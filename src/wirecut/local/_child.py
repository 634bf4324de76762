"""The server child: ``python -m wirecut.local._child --model PATH ...``.

xllamacpp ships llama.cpp's server only as an in-process ``Server`` class (no
``llama-server`` binary), so ``LocalServer`` runs it in this separate Python
process: it can be killed as a whole and its decoding threads never share the
console's GIL. Only ``wirecut.local._server`` starts this module.

Protocol with the parent:

- stdout: exactly one JSON line ``{"address": "http://HOST:PORT"}`` once the
  model is loaded and the HTTP server listens; nothing else.
- stdin: the parent keeps the write end open and never writes. End of file
  means the parent is gone (exited, crashed or killed), so the child exits at
  once: the server dies with its parent even without a signal.
- stderr: llama.cpp's log.
- ``--pdeathsig-parent PID``: also ask Linux for SIGKILL when the parent
  goes (``PR_SET_PDEATHSIG``); the parent passes it only from its main thread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading


def _exit_when_parent_goes() -> None:
    # The raw fd, not sys.stdin: a daemon thread blocked inside a buffered
    # reader makes interpreter shutdown abort after a failed start.
    while os.read(0, 4096):
        pass  # the parent never writes; EOF means it closed the pipe or died
    os._exit(0)


def _die_with_parent(parent_pid: int) -> None:
    """Linux only: get SIGKILL when the parent (the thread that forked us) ends."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    # The parent may have died before prctl: then we were already reparented.
    if os.getppid() != parent_pid:
        os._exit(0)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m wirecut.local._child")
    parser.add_argument("--model", required=True)
    parser.add_argument("--chat-template", default="")  # "": the GGUF's own
    parser.add_argument("--alias", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--n-parallel", type=int, required=True)
    parser.add_argument("--ctx-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--ubatch-size", type=int, default=None)
    parser.add_argument("--pdeathsig-parent", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Load the model, serve, report the address, then wait for the parent to go."""
    args = _parse(argv)
    if args.pdeathsig_parent is not None:
        _die_with_parent(args.pdeathsig_parent)
    # Started before the (GIL-holding, seconds-long) model load so that a
    # parent dying meanwhile is noticed as soon as the load lets go.
    watcher = threading.Thread(target=_exit_when_parent_goes, name="parent-watch", daemon=True)
    watcher.start()

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.n_parallel
    params.n_ctx = args.ctx_size  # shared by the slots: each gets ctx_size / n_parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    # llama.cpp acts on a cancelled task only between batches of n_batch prompt
    # tokens: the batch size bounds how long a prefill cut holds the slot
    # (docs/cancellation-limits.md).
    if args.batch_size is not None:
        params.n_batch = args.batch_size
    if args.ubatch_size is not None:
        params.n_ubatch = args.ubatch_size
    params.endpoint_slots = True
    params.endpoint_metrics = True
    if args.chat_template:
        # A built-in template by name (Gemma's GGUF carries none). With jinja
        # on, "gemma" would be read as a literal Jinja template (the prompt
        # becomes the word "gemma"). Without a name: the GGUF's own, in Jinja.
        params.use_jinja = False
        params.chat_template = args.chat_template

    # Stays referenced until we exit: its destructor stops llama.cpp.
    server = xllamacpp.Server(params)
    sys.stdout.write(json.dumps({"address": server.listening_address}) + "\n")
    sys.stdout.flush()
    watcher.join()


if __name__ == "__main__":
    main()
