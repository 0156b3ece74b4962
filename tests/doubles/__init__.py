"""HTTP TEST DOUBLES of vLLM's OpenAI-compatible server and of the Mooncake master's admin port.

These are *test doubles*, not vLLM and not Mooncake. They exist so kvctl's fleet reset can be
tested against hundreds of replicas and against faults real servers cannot be made to produce
(a replica that fails twice then succeeds, one that hangs, one that stops listening, one that
answers 200 with ``{"success": false}``). They are stand-ins for tests, never used by kvctl itself.

They speak the real endpoints and payloads, and they encode vLLM's per-version behaviour
*here*, from the project's field facts (vLLM's and Mooncake's released sources, FACTS.md
sections 2-4). They deliberately do not import anything from ``kvctl``: the double stands in
for vLLM, so sharing kvctl's capability table would make every test circular.

Layout
------
* :mod:`tests.doubles.vllm` -- :class:`VllmDouble`, the state and HTTP behaviour of one vLLM API
  server, with its :class:`Counters`, its cache model and vLLM's per-version facts
  (:func:`parse_version`, the ``V_*`` constants, the connector sets).
* :mod:`tests.doubles.master` -- :class:`MasterDouble`, the admin/metrics HTTP port of one
  ``mooncake_master``, and :class:`OldMasterFront`, a pre-0.3.12.post1 master (no HTTP
  ``remove_all``) in front of a real one.
* :mod:`tests.doubles.store` -- :class:`SharedStore`, the Mooncake store shared by replicas: a
  set of block keys.
* :mod:`tests.doubles.faults` -- :class:`Faults`, per-server fault injection, mutable at runtime
  from the test thread, and :class:`Call`, one request as a double received it.
* :mod:`tests.doubles.server` -- ``DoubleServer``, what every double shares (call log, faults,
  port), and the small HTTP/Prometheus helpers.
* :mod:`tests.doubles.fleet` -- :class:`DoubleFleet`, runs every server of a test in ONE
  background thread with its own asyncio loop, each server on its own ``127.0.0.1`` port
  (loopback only), so plain sync tests and code that calls ``asyncio.run`` can both talk to them.
* ``fake_vllm.py`` -- a TEST DOUBLE of a vLLM interpreter (run by path), serving a
  :class:`VllmDouble`.
"""

from .faults import Call, Faults
from .fleet import DoubleFleet
from .master import MasterDouble, OldMasterFront
from .store import SharedStore
from .vllm import Counters, VllmDouble, parse_version

__all__ = [
    "Call",
    "Counters",
    "DoubleFleet",
    "Faults",
    "MasterDouble",
    "OldMasterFront",
    "SharedStore",
    "VllmDouble",
    "parse_version",
]
