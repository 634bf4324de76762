"""The proof tools: ``wirecut repro``, ``wirecut doctor`` and ``wirecut bench``.

They let a user see the promise kept on their own machine and provider, and
measure it against what hosts do today. Their output formats are fixed in
docs/proof-tools.md (and the protocol): scripts read them.

- ``run_repro``: the seed incident replayed through the console, and the
  facts of its cancel (``_repro``);
- ``run_doctor``: which provider this is, and whether a cut frees its slot
  (``_doctor``, ``_watchers``);
- ``run_bench``: cancel latencies and leftovers of wirecut and three
  baselines (``_bench``, ``_chart``), on the simulator;
- ``SimProcess`` and ``ConsoleProcess``: the simulator and a console in
  processes of their own, as the bench measures them.

The baselines (``_naive``) use plain ``httpx`` and the official ``openai``
SDK, never wirecut's scoped clients. This package sits just below the CLI:
it imports the console, the simulator, the provider client and the store.
"""

from wirecut.proof._console_process import ConsoleProcess
from wirecut.proof._doctor import Check, CheckMode, DoctorError, DoctorReport, run_doctor
from wirecut.proof._repro import ReproError, ReproFacts, ReproReport, run_repro
from wirecut.proof._sim_process import SimProcess
from wirecut.proof._urls import url_problem
from wirecut.proof._watchers import ProviderKind

__all__ = [
    "Check",
    "CheckMode",
    "ConsoleProcess",
    "DoctorError",
    "DoctorReport",
    "ProviderKind",
    "ReproError",
    "ReproFacts",
    "ReproReport",
    "SimProcess",
    "run_doctor",
    "run_repro",
    "url_problem",
]
