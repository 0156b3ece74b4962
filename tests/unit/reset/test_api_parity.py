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

# CLI parameter -> API parameter, where the names differ; None: CLI-only (output format)
RENAMED = {"url": "urls", "no_mm": "mm", "no_encoder": "encoder", "prompts": "prompts", "json_out": None}


def _params(func: object) -> set[str]:
    return set(inspect.signature(inspect.unwrap(func)).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cli", "python"), [(cli_reset, api.hard_reset_async), (cli_probe, api.probe_async),
                                             (cli_weights_update, api.update_weights_async)])
def test_every_cli_option_has_its_api_parameter(cli: object, python: object) -> None:
    wanted = {RENAMED.get(name, name) for name in _params(cli)} - {None}
    missing = wanted - _params(python)
    assert not missing, f"{python.__name__} lacks {sorted(missing)}"  # type: ignore[attr-defined]


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
        assert refused.exit_code == 1 and "master_rpc= in Python" in (refused.plan.hint or "")
        assert len(store) == 2
        whole = kvctl.hard_reset(urls=[url], master=master, whole_master=True, clear_timeout=2.0)
        assert whole.exit_code == 0, whole.summary
        # vLLM 0.24's own connector reset empties the whole master (remove_all): nothing left for kvctl
        assert whole.master is not None and len(store) == 0
