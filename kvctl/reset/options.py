"""The options of a reset (the CLI's flags and the Python API's keywords), checked once for both."""

from __future__ import annotations

from dataclasses import dataclass

from kvctl.errors import UsageError
from kvctl.transport.vllm_client import PAUSE_MODES, PAUSE_TIMEOUT


@dataclass
class ResetOptions:
    connector: bool = False  # also clear the external store (reset_external / master clear)
    mm: bool = True
    encoder: bool = True
    verify: bool = False
    pause: bool | None = None  # None: pause when clearing the connector (vLLM asks for it, below)
    dry_run: bool = False
    timeout: float = 10.0
    retries: int = 2
    concurrency: int = 256
    pause_timeout: float = PAUSE_TIMEOUT  # one /pause (it waits for in-flight requests); tried twice at most
    # A scoped fleet (cache_prefix) loses only its own keys unless this says the whole master may go.
    whole_master: bool = False
    clear_timeout: float = 15.0  # how long a master clear may retry keys it skipped (puts in flight)
    # With verify: prompts `kvctl probe` checks after the reset (content, not counts); STALE fails it.
    probe_prompts: list[str] | None = None
    # With verify: replicas sharing one cache namespace but serving different weights (as read while
    # planning) pass anyway; their checksums are then not read. kvctl.weights sets it: its plan-time
    # weights are the old ones, and it compares the new ones' checksums itself.
    allow_mixed_weights: bool = False
    # How kvctl's own pause treats in-flight requests: "wait" lets them finish (up to pause_timeout:
    # a long agentic request holds the fleet paused that long); "keep" freezes them in place and the
    # prefix-cache reset preempts them (they are recomputed after the resume, with the new weights).
    # None: per release and replica (vllm_client.pause_mode_for): wait, or keep where a wait pause rejects
    # new requests (0.33+) and the running ones may be preempted (no KV connector).
    pause_mode: str | None = None
    # Nothing is reset: the canaries of an Evidence and the master's count judge a reset someone
    # else ran (the trainer's own, or one kvctl ran while the fleet was paused). kvctl evidence check.
    check_only: bool = False

    def check(self) -> ResetOptions:
        """UsageError for options no reset can run with (the CLI's and the Python API's one check)."""
        numbers = {"timeout": self.timeout, "pause_timeout": self.pause_timeout, "clear_timeout": self.clear_timeout,
                   "retries": self.retries, "concurrency": self.concurrency}
        for name, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{name} must be a number, got {type(value).__name__} {value!r}",
                                 f"e.g. {name}={getattr(ResetOptions, name)!r}")
        for name in ("retries", "concurrency"):
            if not isinstance(numbers[name], int):
                raise UsageError(f"{name} must be a whole number, got {numbers[name]!r}")
        # `not >` also refuses nan
        if not (self.timeout > 0 and self.pause_timeout > 0 and self.clear_timeout >= 0) \
                or self.retries < 0 or self.concurrency < 1 or self.timeout == float("inf"):
            raise UsageError("--timeout and --pause-timeout must be > 0 (and finite), --clear-timeout >= 0, "
                             "--retries >= 0 and --concurrency >= 1")
        if self.probe_prompts is not None and not self.verify:
            raise UsageError("probe prompts check the reset by content: they need verify",
                             "add --verify, or run kvctl probe on its own")
        if self.pause_mode is not None and self.pause_mode not in PAUSE_MODES:
            raise UsageError(f"pause mode must be one of {', '.join(PAUSE_MODES)}, got {self.pause_mode!r}",
                             "wait: in-flight requests finish first; keep: they are frozen, preempted by the "
                             "reset and recomputed after the resume")
        if self.allow_mixed_weights and not self.verify:
            raise UsageError("--allow-mixed-weights relaxes a check of --verify's: it needs --verify",
                             "add --verify, or drop --allow-mixed-weights")
        return self

    @property
    def pausing(self) -> bool:
        """vLLM's MooncakeStoreConnector.reset_cache wants generation paused first, so that no new
        puts are enqueued while the store drains: with --connector kvctl pauses unless told not to."""
        return (self.connector if self.pause is None else self.pause) and not self.check_only


__all__ = ["ResetOptions"]
