"""The large-fleet transport (kvctl/transport/aio.py, aiohttp) behaves as the default one (httpcore).

A fleet of FAST_MIN_HOSTS replicas or more is reset through aiohttp. The core of
tests/unit/reset/test_reset.py's fan-out behaviour runs here again with the threshold forced to 0, so that
every reset below goes through it: retries on 5xx and timeouts, 4xx final, error kinds and their
wording in the receipt, `{"success": false}`, pause/resume order, proxy variables ignored.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from kvctl.transport import pool as http_base
from kvctl.transport.http import HttpPool, TransportError
from kvctl.transport.pool import FAST_MIN_HOSTS_ENV, new_pool
from tests.doubles import DoubleFleet, Faults, VllmDouble
from tests.unit.reset import test_reset as core

doubles = core.doubles  # the fixture


@pytest.fixture(autouse=True)
def large_fleet_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAST_MIN_HOSTS_ENV, "0")


# tests/unit/reset/test_reset.py's fan-out tests, collected again here: each runs on the aiohttp transport
test_500_then_success_is_retried = core.test_500_then_success_is_retried
test_4xx_is_not_retried_and_404_means_dev_mode_off = core.test_4xx_is_not_retried_and_404_means_dev_mode_off
test_success_false_is_a_failure = core.test_success_false_is_a_failure
test_timeout_and_refused_make_a_partial_reset_naming_them = core.test_timeout_and_refused_make_a_partial_reset_naming_them
test_pause_reset_resume_order_and_resume_on_failure = core.test_pause_reset_resume_order_and_resume_on_failure
test_pause_waits_longer_than_the_per_call_timeout = core.test_pause_waits_longer_than_the_per_call_timeout
test_proxy_variables_are_not_used = core.test_proxy_variables_are_not_used
test_silent_noop_on_022_is_covered_by_a_forced_master_clear = core.test_silent_noop_on_022_is_covered_by_a_forced_master_clear
test_json_receipt_shape = core.test_json_receipt_shape
test_256_replicas_at_once = core.test_256_replicas_at_once
test_a_failed_canary_check_is_inconclusive_not_retried = core.test_a_failed_canary_check_is_inconclusive_not_retried


def test_the_threshold_picks_the_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvctl.transport.aio import AioHttpPool

    monkeypatch.delenv(FAST_MIN_HOSTS_ENV)
    assert type(new_pool(1)) is HttpPool
    assert type(new_pool(http_base.FAST_MIN_HOSTS - 1)) is HttpPool
    assert type(new_pool(http_base.FAST_MIN_HOSTS)) is AioHttpPool
    monkeypatch.setenv(FAST_MIN_HOSTS_ENV, "0")
    assert type(new_pool(1)) is AioHttpPool


def test_without_aiohttp_large_fleets_fall_back_to_httpcore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kvctl.transport.aio", None)  # import fails as if aiohttp were missing
    assert type(new_pool(10_000)) is HttpPool


@pytest.mark.parametrize("fast", [False, True])
def test_both_transports_answer_and_fail_alike(doubles: DoubleFleet, fast: bool) -> None:
    """Same response, same TransportError kinds and cause names, no redirect followed."""
    slow = VllmDouble("0.32.0+cpu", connector=None, faults=Faults(delay={"/reset_mm_cache": 2}))
    url = doubles.add(slow)

    async def go() -> tuple[object, ...]:
        async with new_pool(100 if fast else 1) as pool:
            ok = await pool.request("GET", f"{url}/version")
            posted = await pool.request("POST", f"{url}/reset_prefix_cache",
                                        params={"reset_running_requests": False, "reset_external": True})
            with pytest.raises(TransportError) as timeout:
                await pool.request("POST", f"{url}/reset_mm_cache", timeout=0.3)
            with pytest.raises(TransportError) as refused:
                await pool.request("GET", "http://127.0.0.1:9/version", timeout=1)
            return ok, posted, timeout.value, refused.value

    ok, posted, timeout, refused = asyncio.run(go())
    assert ok.status == 200 and ok.json()["version"] == "0.32.0+cpu"  # type: ignore[attr-defined]
    assert posted.status == 200  # type: ignore[attr-defined]
    assert slow.calls_to("/reset_prefix_cache")[0].query == {"reset_running_requests": "false",
                                                            "reset_external": "true"}
    assert (timeout.kind, timeout.cause_name) == ("timeout", "ReadTimeout")  # type: ignore[attr-defined]
    assert (refused.kind, refused.cause_name) == ("connect", "ConnectError")  # type: ignore[attr-defined]


def test_a_reset_sends_through_the_large_fleet_transport(doubles: DoubleFleet,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from kvctl.transport.aio import AioHttpPool

    sent: list[str] = []
    original = AioHttpPool.request

    async def counted(self: AioHttpPool, method: str, url: str, **kw: object) -> object:
        sent.append(url)
        return await original(self, method, url, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(AioHttpPool, "request", counted)
    receipt = core.reset([doubles.add(VllmDouble("0.23.0", connector=None))], pause=True)
    assert receipt.exit_code == 0, receipt.summary
    assert len(sent) == 9  # version, is_sleeping + is_paused (its window), is_paused, pause, three resets, resume


# -- file limits: a fleet larger than the process's open-file budget --------------------------------
_LIMITED = """
import json, resource, sys
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from kvctl.transport import pool as http_base
keep = http_base.new_pool(int(sys.argv[3]))._keepalive
sys.argv = ["kvctl", *sys.argv[5:], "--inventory", sys.argv[4], "--json"]
import contextlib, io
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        from kvctl.cli.main import run
        run()
    except SystemExit as exc:
        code = exc.code
receipt = json.loads(out.getvalue())
done = sum(bool(r.get("reset", r.get("healthy"))) for r in receipt["replicas"])
print(json.dumps({"code": code, "keepalive": keep, "done": done,
                  "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


@pytest.mark.parametrize(("soft", "hard", "keepalive"), [
    (100, 4096, True),   # a low soft limit is raised (up to the hard one) to keep a connection per replica
    (150, 150, False),   # no room to raise: one connection per call, at most 150 - FD_MARGIN replicas at once
])
def test_a_fleet_larger_than_the_file_limit_is_reset_and_read_whole(doubles: DoubleFleet, tmp_path, soft: int, hard: int,
                                                           keepalive: bool) -> None:
    """A common soft limit is 1024 open files: a 1024-replica reset kept 1024 connections alive
    between its phases and died of EMFILE ('Too many open files'). Here 160 replicas against
    limits of 100-150 files, in a child process (the limit is per process)."""
    import json
    import subprocess

    from kvctl.transport.pool import FD_MARGIN

    replicas = [VllmDouble("0.23.0", connector=None) for _ in range(160)]
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("replicas:\n" + "".join(f"  - url: {doubles.add(r)}\n" for r in replicas))
    for command in (["reset", "--connector"], ["status"]):
        proc = subprocess.run([sys.executable, "-c", _LIMITED, str(soft), str(hard), str(len(replicas)),
                               str(inventory), *command], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert (out["code"], out["done"], out["keepalive"]) == (0, 160, keepalive), (command, out)
        assert out["soft"] == (160 + FD_MARGIN if keepalive else hard)
    assert all(len(r.calls_to("/reset_prefix_cache")) == 1 for r in replicas)
    assert all(len(r.calls_to("/metrics")) == 1 for r in replicas)  # status read every replica
