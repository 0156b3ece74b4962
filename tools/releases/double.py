"""The same request sequence sent to the vLLM test double configured as one release, and its
answers compared with the real server's (status codes, JSON shapes and types, metric names, and the
values the sequence observes: cache hits, pause, labels)."""

from __future__ import annotations

from typing import Any

from tests.doubles import DoubleFleet, VllmDouble

from . import sequence
from .sequence import Exchange, Transcript

# Metric families the double need not expose: the real server's old names for what the double
# models under the new ones are compared, these are not (kvctl reads cache_config_info only for the
# block size, which it also gets from /server_info).
_METRICS_NOT_MODELLED = frozenset({"vllm:cache_config_info"})


def double_for(release: str, model: str, *, dev_mode: bool) -> VllmDouble:
    """The double as the tier's real server runs: this release, no KV connector, prompt token
    details on (kvctl serve's flag), the served model's name."""
    return VllmDouble(version=release, dev_mode=dev_mode, connector=None, model=model,
                      prompt_tokens_details=True)


def transcript(release: str, model: str, *, dev_mode: bool) -> Transcript:
    with DoubleFleet(replicas=[double_for(release, model, dev_mode=dev_mode)]) as fleet:
        # the double answers at once or holds until /resume: a short wait tells them apart
        return sequence.run(fleet.urls[0], model, dev_mode=dev_mode, held_s=0.3)


def differences(real: Transcript, double: Transcript) -> list[str]:
    """Where the double answered otherwise than the real server, one line each."""
    out: list[str] = []
    theirs = {e.step: e for e in double.exchanges}
    for ex in real.exchanges:
        other = theirs.pop(ex.step, None)
        if other is None:
            out.append(f"{ex.step}: the real server was asked ({ex.status}), the double's sequence never got there")
            continue
        out += [f"{ex.step}: {what}" for what in _exchange_diff(ex, other)]
    out += [f"{step}: asked of the double ({e.status}) but not of the real server" for step, e in theirs.items()]
    real_names = set(real.metric_names) - _METRICS_NOT_MODELLED
    double_names = set(double.metric_names) - _METRICS_NOT_MODELLED
    if real_names != double_names:
        out.append(f"/metrics: real has {sorted(real_names - double_names)} that the double lacks, "
                   f"the double has {sorted(double_names - real_names)} that the real server lacks")
    return out


def _exchange_diff(real: Exchange, double: Exchange) -> list[str]:
    out = []
    if real.status != double.status:
        out.append(f"status real {real.status}, double {double.status}")
    elif real.status < 400 and real.shape != double.shape:
        out.append(f"answer shape real {real.shape}, double {double.shape}")
    elif real.status >= 400 and _top(real.shape) != _top(double.shape):
        out.append(f"error body real {_top(real.shape)}, double {_top(double.shape)}")
    if real.value != double.value and real.step not in _VALUE_FREE:
        out.append(f"value real {real.value!r}, double {double.value!r}")
    return out


# Steps whose value is the server's own (its version string carries +cpu on some builds).
_VALUE_FREE = frozenset({"version"})


def _top(shape: Any) -> Any:
    return sorted(shape) if isinstance(shape, dict) else shape
