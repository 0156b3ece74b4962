"""The Python API has every option of the CLI it stands beside (issue 24, finding 9): a trainer calling
kvctl.hard_reset must be able to ask for what `kvctl reset` does, and its errors name Python's way too."""

from __future__ import annotations

import inspect

import pytest

import kvctl
from kvctl import api
from kvctl.cli.probe import probe as cli_probe
from kvctl.cli.reset import reset as cli_reset
from kvctl.cli.weights import update as cli_weights_update
from kvctl.errors import UsageError
from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

# CLI parameter -> the API keyword it is, where the names differ (--no-mm: mm=False)
RENAMED = {"url": "urls", "run_arg": "run", "no_mm": "mm", "no_encoder": "encoder"}
NEGATED = {"no_mm", "no_encoder"}
# CLI options without an API keyword, and why
CLI_ONLY = {"json_out": "--json is an output format: the API returns the receipt itself (.to_dict() is that JSON)",
            "output_format": "-o, the same", "no_headers": "--no-headers, a table's format"}
# API keywords without a CLI option, and why
API_ONLY = {"raise_on_failure": "the CLI says failure with its exit code; Python raises only when asked"}
# defaults that differ on purpose: (API function, keyword) -> why
DEFAULTS_DIFFER = {("hard_reset_async", "connector"): "the API is a trainer's hard reset after a weight update: "
                                                      "the store goes too (kvctl reset --connector)"}
PAIRS = [(cli_reset, api.hard_reset_async), (cli_probe, api.probe_async), (cli_weights_update, api.update_weights_async)]


def _params(func: object) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(inspect.unwrap(func)).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cli", "python"), PAIRS)
def test_every_cli_option_has_its_api_keyword_with_the_same_default(cli: object, python: object) -> None:
    """Both ways: a CLI option the API lacks, or an API keyword no CLI option stands for, fails here
    unless it is declared above with its reason; so does a default that differs undeclared."""
    cli_params, api_params = _params(cli), _params(python)
    wanted = {RENAMED.get(name, name): name for name in cli_params if name not in CLI_ONLY}
    assert not wanted.keys() - api_params.keys(), f"{python.__name__} lacks {sorted(wanted.keys() - api_params.keys())}"  # type: ignore[attr-defined]
    assert not api_params.keys() - wanted.keys() - API_ONLY.keys(), "API keywords no CLI option stands for"
    for keyword, name in wanted.items():
        cli_default = cli_params[name].default
        expected = (not cli_default) if name in NEGATED else cli_default
        if (python.__name__, keyword) in DEFAULTS_DIFFER:  # type: ignore[attr-defined]
            assert api_params[keyword].default != expected, "a declared difference that is gone: drop it"
            continue
        assert api_params[keyword].default == expected, (python.__name__, keyword)  # type: ignore[attr-defined]


def test_the_declared_exceptions_are_all_used() -> None:
    every_cli = set().union(*(_params(c) for c, _ in PAIRS))
    every_api = set().union(*(_params(p) for _, p in PAIRS))
    assert "json_out" in every_cli and API_ONLY.keys() <= every_api
    assert set(RENAMED) <= every_cli and {p for p, _ in DEFAULTS_DIFFER} <= {p.__name__ for _, p in PAIRS}


@pytest.mark.parametrize("name", ["hard_reset", "probe", "update_weights"])
def test_each_blocking_function_refuses_a_running_loop_and_names_its_async_twin(name: str) -> None:
    """(kvctl.probe_async itself inside a running loop: tests/unit/reset/test_probe.py, section 4.)"""
    import asyncio

    async def inside() -> None:
        args = ("/nowhere",) if name == "update_weights" else ()
        with pytest.raises(UsageError, match=f"await kvctl.{name}_async"):
            getattr(kvctl, name)(*args, urls=["http://127.0.0.1:1"])

    asyncio.run(inside())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"urls": "http://127.0.0.1:1"}, "urls must be a list"),
    ({"urls": [None]}, "urls must be a list"),
    ({"urls": ["127.0.0.1:1"], "master": 41100}, "master must be 'HOST:PORT'"),
    ({"urls": ["127.0.0.1:1"], "timeout": "5"}, "timeout must be a number"),
    ({"urls": ["127.0.0.1:1"], "timeout": -1}, "must be > 0"),
    ({"urls": ["127.0.0.1:1"], "concurrency": 0}, "concurrency >= 1"),
    ({"urls": ["127.0.0.1:1"], "retries": 1.5}, "retries must be a whole number"),
    ({"urls": ["127.0.0.1:1"], "probe_prompts": ["p"]}, "they need verify"),
])
def test_bad_api_input_is_a_usage_error_not_a_type_error(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        kvctl.hard_reset(**kwargs)


def test_a_scoped_fleet_from_urls_can_be_reset_from_python() -> None:
    """Replicas serving a cache_prefix, given as URLs: a scoped clear needs the master's RPC port, and the
    API now takes it (master_rpc=) or the user's choice to clear the whole master (whole_master=True);
    the error for neither names the Python parameters."""
    store = SharedStore(["rl@model@h1", "other@model@h2"])
    ktc = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"cache_prefix": "rl"}}
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.24.0", store=store, kv_transfer_config=ktc))
        master = fleet.add_master(MasterDouble(store))
        refused = kvctl.hard_reset(urls=[url], master=master)
        assert refused.exit_code == 1 and 'master_rpc="HOST:PORT"' in (refused.plan.hint or "")
        assert "--master-rpc" not in (refused.plan.hint or "") + (refused.plan.error or "")
        assert len(store) == 2
        whole = kvctl.hard_reset(urls=[url], master=master, whole_master=True, clear_timeout=2.0)
        assert whole.exit_code == 0, whole.summary
        # vLLM 0.24's own connector reset empties the whole master (remove_all): nothing left for kvctl
        assert whole.master is not None and len(store) == 0
