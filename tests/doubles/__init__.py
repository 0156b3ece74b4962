"""Test doubles (fakes that speak the real HTTP protocols) for kvctl's tests.

``vllm_double`` holds an HTTP TEST DOUBLE of vLLM's OpenAI-compatible server and of the
Mooncake master's admin port. They are stand-ins for tests, never used by kvctl itself, and
they import nothing from kvctl (so the tests that use them are not circular).
"""

from .vllm_double import *  # noqa: F403 - the public names are vllm_double.__all__
from .vllm_double import __all__  # noqa: F401
