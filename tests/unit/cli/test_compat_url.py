"""`kvctl compat check --url` takes a server as every --url does (kvctl.targets.normalize_url)."""

from __future__ import annotations

import json

from tests.doubles import DoubleFleet, VllmDouble


def test_compat_check_takes_host_port_as_reset_does(cli) -> None:
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.22.0"))
        bare = url.removeprefix("http://")
        results = [cli("compat", "check", "--url", given, "--json") for given in (bare, url + "/")]
    for result in results:
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["vllm_version"] == "0.22.0" and data["version_source"] == f"GET {url}/version"
        assert data["layout_source"] == f"GET {url}/server_info"


def test_a_bad_url_is_a_usage_error_naming_the_flag(cli) -> None:
    result = cli("compat", "check", "--url", "http://127.0.0.1:9/v1")
    assert result.exit_code == 2 and "--url: 'http://127.0.0.1:9/v1' has a path or query" in result.stderr
