"""kvctl/data/mooncake_facts.json: the C++ parsers on synthetic snippets, the committed facts, and
the installed mooncake_master (its --helpfull) against both the facts and the flags kvctl passes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import warnings
from pathlib import Path

import pytest
from packaging.version import Version

from kvctl.serve.master_process import MasterProcess, find_master_executable
from kvctl.transport.master_admin import MasterError
from tests.lib.release_sources import mooncake_tree
from tools.capabilities import mooncake_facts as mf

FACTS_FILE = Path(mf.OUTPUT)
DISTRIBUTIONS = ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine")
# kvctl passes these to every master, but glog defines them, not Mooncake's sources: they are
# checked against --helpfull only.
LIBRARY_FLAGS = {"logtostderr"}


@pytest.fixture(scope="module")
def facts() -> dict:
    return json.loads(FACTS_FILE.read_text())


# --------------------------------------------------------------------------------------------
# (a) parsers


FLAGS_CPP = r'''
#include <gflags/gflags.h>
constexpr char kDefaultTtl[] = "10000";  // ms
// DEFINE_int32(commented_out, 1, "not a flag");
/* DEFINE_bool(block_commented, true, "nor this"); */
DEFINE_int32(port, 50051, "Port for master service to listen on");
DEFINE_string(rpc_address, "0.0.0.0",
              "Address for the master, e.g. "
              "http://host:1 (a // in a string is no comment)");
DEFINE_string(default_kv_lease_ttl, kDefaultTtl, "Lease TTL (e.g. 500ms)");
DEFINE_double(eviction_ratio, mooncake::DEFAULT_EVICTION_RATIO, "Ratio");
DEFINE_uint64(
    cxl_size, 8ULL * 1024 * 1024,
    "bytes");
DEFINE_bool(enable_ha, false, "HA");
DEFINE_int64(unknown_default, SomeFunction(3), "kept as C++");
DEFINE_validator(eviction_ratio, [](const char*, double v) { return v < 1; });
'''


def test_parse_flags_types_defaults_and_lines() -> None:
    flags = mf.parse_flags(FLAGS_CPP, "src/master.cpp", consts={"DEFAULT_EVICTION_RATIO": "0.05"})
    assert set(flags) == {"port", "rpc_address", "default_kv_lease_ttl", "eviction_ratio", "cxl_size",
                          "enable_ha", "unknown_default"}
    assert flags["port"] == {"type": "int32", "default": 50051, "file": "src/master.cpp", "line": 6}
    assert flags["rpc_address"]["default"] == "0.0.0.0"
    assert flags["default_kv_lease_ttl"] == {"type": "string", "default": "10000",
                                             "file": "src/master.cpp", "line": 10}
    assert flags["eviction_ratio"]["default"] == 0.05  # mooncake:: qualifier dropped
    assert flags["cxl_size"] == {"type": "uint64", "default": 8 * 1024 * 1024,
                                 "file": "src/master.cpp", "line": 12}
    assert flags["enable_ha"]["default"] is False
    assert flags["unknown_default"]["default"] == {"cpp": "SomeFunction(3)"}


def test_parse_constants_multiline_and_limits() -> None:
    consts = mf.parse_constants("static const int64_t BIG =\n    std::numeric_limits<int64_t>::max();\n"
                                "constexpr const char* ID = \"cluster\";  // why\n")
    assert mf.cpp_value(consts["BIG"], consts) == 2**63 - 1
    assert mf.cpp_value("ID", consts) == "cluster"
    assert mf.cpp_value('"a" "b"', {}) == "ab"


ROUTES_CPP = r'''
void Server::HandleRemoveAll(coro_http_request& req, coro_http_response& resp) {
    bool force = false;
    if (auto it = req.get_query_value("force"); !it.empty()) { force = it == "true"; }
    auto tenant = ParseTenant(req);
}
static std::string ParseTenant(coro_http_request& req) {
    return std::string(req.get_decode_query_value("tenant_id"));
}
void Server::RegisterHandler() {
    // http_server_.set_http_handler<GET>("/commented", nothing);
    http_server_.set_http_handler<GET>(
        "/health", [](coro_http_request&, coro_http_response& resp) { resp.ok(); });
    http_server_.set_http_handler<GET>(
        "/query_key", [&](coro_http_request& req, coro_http_response& resp) {
            auto key = req.get_query_value("key");
        });
    http_server_.set_http_handler<POST>(
        "/api/v1/remove_all",
        [this](coro_http_request& req, coro_http_response& resp) { HandleRemoveAll(req, resp); });
    http_server_.set_http_handler<GET>("/quota", [this](auto& req, auto& resp) { ParseTenant(req); });
    http_server_.set_http_handler<DEL>("/quota", [this](auto& req, auto& resp) { ParseTenant(req); });
}
'''


def test_parse_routes_methods_params_and_lines() -> None:
    routes = mf.parse_routes(ROUTES_CPP, "src/admin.cpp")
    assert set(routes) == {"/health", "/query_key", "/api/v1/remove_all", "/quota"}
    assert routes["/health"] == {"method": "GET", "params": [], "file": "src/admin.cpp", "line": 12}
    assert routes["/query_key"]["params"] == ["key"]
    # params read in the handler method the lambda calls, and in the helper that one calls
    assert routes["/api/v1/remove_all"] == {"method": "POST", "params": ["force", "tenant_id"],
                                            "file": "src/admin.cpp", "line": 18}
    assert routes["/quota"]["method"] == "DELETE,GET"  # one path, two registrations
    assert routes["/quota"]["params"] == ["tenant_id"]


def test_intervals_and_facts_at_round_trip() -> None:
    snaps = {"1.0": {"flags": {"a": {"type": "int32", "default": 1, "file": "m", "line": 1}}, "routes": {}, "vllm_connectors": {}},
             "1.1": {"flags": {"a": {"type": "int32", "default": 1, "file": "m", "line": 9}}, "routes": {}, "vllm_connectors": {}},
             "2.0": {"flags": {"a": {"type": "int32", "default": 2, "file": "m", "line": 9}}, "routes": {}, "vllm_connectors": {}}}
    doc = mf.build(["1.0", "1.1", "2.0"], snaps)
    assert [(s["since"], s["until"], s["default"]) for s in doc["flags"]["a"]["spans"]] == \
        [("1.0", "2.0", 1), ("2.0", None, 2)]  # a moved line is not a new interval
    assert mf.facts_at(doc, "1.1")["flags"]["a"]["default"] == 1
    assert mf.facts_at(doc, "9.0")["flags"]["a"]["default"] == 2


# --------------------------------------------------------------------------------------------
# The committed facts


def test_facts_file_is_canonical(facts: dict) -> None:
    assert FACTS_FILE.read_text() == mf.dumps(facts)
    assert facts["schema"] == 1 and facts["source"] == "github.com/kvcache-ai/Mooncake tags"
    releases = facts["releases"]
    assert releases == sorted(releases, key=Version) and releases[0] == "0.3.0"
    for section in mf.SECTIONS:
        for entry in facts[section].values():
            for span in entry["spans"]:
                assert span["since"] in releases and span["until"] in releases + [None]


def _span(facts: dict, section: str, name: str) -> list[tuple[str, str | None]]:
    return [(s["since"], s["until"]) for s in facts[section][name]["spans"]]


def test_http_remove_all_first_in_0_3_12_post1(facts: dict) -> None:
    """FACTS.md section 7: the HTTP remove_all first appears in 0.3.12.post1 (POST, force, tenant_id)."""
    assert _span(facts, "routes", "/api/v1/remove_all") == [("0.3.12.post1", None)]
    assert "/api/v1/remove_all" not in mf.facts_at(facts, "0.3.12")["routes"]
    now = mf.facts_at(facts, "0.3.12.post1")["routes"]["/api/v1/remove_all"]
    assert now["method"] == "POST" and now["params"] == ["force", "tenant_id"]


def test_routes_kvctl_calls_exist_in_newest_release(facts: dict) -> None:
    newest = mf.facts_at(facts, facts["releases"][-1])["routes"]
    for path in ("/health", "/metrics", "/get_all_keys", "/api/v1/remove_all", "/role", "/leader", "/ha_status"):
        assert newest[path]["method"] == ("POST" if path.startswith("/api") else "GET"), path


def test_facts_match_the_sources_of_one_release(facts: dict) -> None:
    """Regenerating one release from its sources (the mirror, else the committed excerpt) gives
    what the committed file says for it (file/line aside: an interval keeps the location of its
    first release)."""
    version = "0.3.12.post1"
    def strip(snap: dict) -> dict:
        return {section: {name: {k: v for k, v in fact.items() if k not in ("file", "line")}
                          for name, fact in snap[section].items()} for section in mf.SECTIONS}
    assert strip(mf.snapshot_tree(mooncake_tree(version))) == strip(mf.facts_at(facts, version))


# --------------------------------------------------------------------------------------------
# (b) the installed mooncake_master


def _installed_version() -> str | None:
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@pytest.fixture(scope="module")
def installed() -> tuple[str, str]:
    """(version, --helpfull text) of the mooncake_master kvctl would start."""
    version = _installed_version()
    try:
        executable = find_master_executable()
    except MasterError as exc:
        executable, reason = None, str(exc)
    if version is None:
        reason = f"none of {DISTRIBUTIONS} is installed"
    if version is None or executable is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"mooncake_master is required under CI: {reason}")
        pytest.skip(reason)
    # gflags prints every flag and exits 1 after --helpfull: the text is what counts.
    done = subprocess.run([executable, "--helpfull"], capture_output=True, text=True, timeout=30)
    return version, done.stdout + done.stderr


def _help_flags(text: str) -> set[str]:
    return set(re.findall(r"^\s+-(\w+) \(", text, re.M))


def _kvctl_flags() -> set[str]:
    """The flags MasterProcess.command() passes (built without starting anything)."""
    command = MasterProcess(rpc_port=1, metrics_port=2, default_kv_lease_ttl=10000,
                            executable="mooncake_master").command()
    return {arg[2:].split("=", 1)[0] for arg in command[1:]}


def test_installed_master_knows_every_flag_of_the_facts(facts: dict, installed: tuple[str, str]) -> None:
    version, help_text = installed
    listed = set(mf.facts_at(facts, version)["flags"])
    assert listed, f"the facts have no flags for {version}"
    assert listed <= _help_flags(help_text), f"not in `mooncake_master --helpfull` ({version})"


def test_flags_kvctl_passes_exist_for_the_installed_version(facts: dict, installed: tuple[str, str]) -> None:
    version, help_text = installed
    passed = _kvctl_flags()
    assert passed >= {"rpc_address", "rpc_port", "metrics_port", "logtostderr"}
    assert passed <= _help_flags(help_text), f"the installed master ({version}) rejects some"
    unknown = passed - LIBRARY_FLAGS - set(mf.facts_at(facts, version)["flags"])
    if Version(version) > Version(facts["releases"][-1]):
        # The facts end before this release (no tag for it in the mirror yet): the master itself
        # vouched for these flags above; say which ones no tagged release has.
        if unknown:
            warnings.warn(f"mooncake {version} is newer than the facts ({facts['releases'][-1]}); "
                          f"flags kvctl passes that no tagged release has: {sorted(unknown)}", stacklevel=1)
        return
    assert not unknown, f"kvctl passes flags that mooncake {version} does not define"


def test_wheel_connectors_are_read_from_the_module_ast() -> None:
    text = ("import os\nclass MooncakeConnector(KVConnectorBase_V1):\n"
            "    def __init__(self, vllm_config, role, kv_cache_config=None):\n        pass\n"
            "class Helper:\n    def __init__(self, x):\n        pass\n"
            "PATH = os.getenv('MOONCAKE_CONFIG_PATH')\n")
    found = mf.parse_wheel_connectors(text, "mooncake-wheel/mooncake/my_connector.py")
    assert found == {"mooncake.my_connector:MooncakeConnector": {
        "takes_kv_cache_config": True, "reads_mooncake_config_path": True,
        "file": "mooncake-wheel/mooncake/my_connector.py", "line": 3}}


def test_the_wheels_v1_connector_takes_two_arguments_in_every_release(facts: dict) -> None:
    """Why vLLM >= 0.21 refuses `kv_connector_module_path: mooncake.mooncake_connector_v1`."""
    spans = facts["vllm_connectors"]["mooncake.mooncake_connector_v1:MooncakeConnector"]["spans"]
    assert spans[-1]["until"] is None and not any(s["takes_kv_cache_config"] for s in spans)
    assert not any(s["reads_mooncake_config_path"] for s in spans)  # it hard-codes P2PHANDSHAKE / rdma
