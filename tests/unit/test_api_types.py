"""The Python API's keyword types (issue 39, low): `dry_run="false"` was a dry run (a non-empty string is
true), `verify="no"` verified. Every bool keyword of the public API takes True or False (None where it
means "default"), every number keyword a number (a whole one where it counts): anything else raises a
UsageError that is also a TypeError, naming the keyword, before any replica is contacted."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

import kvctl
from kvctl.errors import UsageError

URLS = ["http://127.0.0.1:9"]  # nothing listens: a call that got past the check would fail on the network


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dry_run": "false"}, "dry_run must be True or False, got str 'false'"),
    ({"verify": "no"}, "verify must be True or False"),
    ({"connector": 0}, "connector must be True or False, got int 0"),
    ({"pause": "true"}, "pause must be True, False or None"),
    ({"whole_master": 1}, "whole_master must be True or False"),
    ({"raise_on_failure": "yes"}, "raise_on_failure must be True or False"),
    ({"timeout": "5"}, "timeout must be a number, got str '5'"),
    ({"retries": True}, "retries must be a whole number, got bool True"),
    ({"clear_timeout": None}, "clear_timeout must be a number, got NoneType None"),
])
def test_hard_reset_refuses_a_keyword_of_the_wrong_type(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message) as raised:
        kvctl.hard_reset(urls=URLS, **kwargs)
    assert isinstance(raised.value, TypeError)


@pytest.mark.parametrize(("call", "kwargs", "message"), [
    ("update_weights", {"dry_run": "false"}, "dry_run must be True or False"),
    ("update_weights", {"remote_path": "no"}, "remote_path must be True or False"),
    ("update_weights", {"resume_failed": 1}, "resume_failed must be True or False"),
    ("update_weights", {"reload_timeout": "600"}, "reload_timeout must be a number"),
    ("probe", {"max_tokens": 2.5}, "max_tokens must be a whole number"),
    ("probe", {"tolerance": "0.1"}, "tolerance must be a number or None"),
    ("check_salt_isolation", {"settle": "3"}, "settle must be a number"),
    ("take_evidence", {"concurrency": "8"}, "concurrency must be a whole number"),
])
def test_every_blocking_api_function_checks_its_bool_and_number_keywords(tmp_path: Path, call: str, kwargs: dict,
                                                                          message: str) -> None:
    args: tuple = ()
    if call == "update_weights":
        folder = tmp_path / "c"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"w")
        args = (folder,)
    with pytest.raises(TypeError, match=message):
        getattr(kvctl, call)(*args, urls=URLS, **kwargs)


def test_check_evidence_and_the_update_window_check_too() -> None:
    with pytest.raises(TypeError, match="raise_on_failure must be True or False"):
        kvctl.check_evidence({"replicas": {}}, urls=URLS, raise_on_failure="false")

    async def window() -> None:
        async with kvctl.update_window_async(urls=URLS, verify="false"):
            pass
    with pytest.raises(TypeError, match="verify must be True or False"):
        asyncio.run(window())


def test_the_checked_functions_keep_their_signatures() -> None:
    assert inspect.iscoroutinefunction(kvctl.hard_reset_async)
    assert "dry_run" in inspect.signature(kvctl.hard_reset_async).parameters
