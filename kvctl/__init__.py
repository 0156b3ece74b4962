"""kvctl: configure, start, check and hard-reset vLLM servers that offload KV cache to Mooncake.

Importing kvctl is cheap: no vllm, torch, mooncake, typer or rich. The Python API
(`kvctl.hard_reset`, `kvctl.hard_reset_async`, `kvctl.ResetFailed`, `kvctl.probe`, `kvctl.probe_async`,
`kvctl.update_weights`, `kvctl.update_weights_async`, `kvctl.WeightsUpdateFailed`,
`kvctl.check_salt_isolation[_async]`, and for training loops
`kvctl.take_evidence[_async]`, `kvctl.check_evidence[_async]`, `kvctl.update_window_async`, `kvctl.Evidence`)
loads on first use. No submodule of kvctl may take one of these names: once imported, it would shadow
the function (tests/unit/reset/test_probe.py checks).
"""

from __future__ import annotations

from typing import Any

from kvctl._version import __version__ as __version__  # the public face

_API = ("hard_reset", "hard_reset_async", "ResetFailed", "probe", "probe_async", "update_weights",
        "update_weights_async", "WeightsUpdateFailed", "check_salt_isolation", "check_salt_isolation_async")
# inside a training loop (kvctl/api/loop.py)
_LOOP_API = ("take_evidence", "take_evidence_async", "check_evidence", "check_evidence_async",
             "update_window_async", "Evidence")


def __getattr__(name: str) -> Any:
    if name in _API:
        from kvctl import api

        return getattr(api, name)
    if name in _LOOP_API:
        from kvctl.api import loop as api_loop
        from kvctl.reset.evidence import Evidence

        return Evidence if name == "Evidence" else getattr(api_loop, name)
    raise AttributeError(f"module 'kvctl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, *_LOOP_API])
