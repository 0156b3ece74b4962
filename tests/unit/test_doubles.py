"""The vLLM / Mooncake master TEST DOUBLES behave as specified (tests/doubles/).

These pin the double to the version facts it encodes, so tests of kvctl built on it test
against vLLM's behaviour rather than against whatever the double happens to do.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.doubles import DoubleFleet, Faults, MasterDouble, SharedStore, VllmDouble
from tests.doubles.vllm import V_ZERO_CACHED_REPORTED, parse_version

PROMPT = " ".join(f"word{i}" for i in range(40))     # 40 tokens -> 2 hittable blocks of 16


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5) as c:
        yield c


def complete(client: httpx.Client, url: str, prompt: str = PROMPT) -> int:
    """Send one completion; returns usage.prompt_tokens_details.cached_tokens (a null is 0 below
    vLLM 0.24, which leaves a zero count out: V_ZERO_CACHED_REPORTED)."""
    r = client.post(f"{url}/v1/completions",
                    json={"model": "double-model", "prompt": prompt, "max_tokens": 4})
    assert r.status_code == 200, r.text
    details = r.json()["usage"]["prompt_tokens_details"]
    if details is None:
        version = client.get(f"{url}/version").json()["version"]
        assert parse_version(version) < V_ZERO_CACHED_REPORTED, f"null details from vLLM {version}"
        return 0
    return details["cached_tokens"]


def counters(client: httpx.Client, url: str) -> dict[str, float]:
    """The vLLM counters of /metrics, parsed with prometheus_client's own parser."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name.endswith("_total") and "source" not in sample.labels:
                out[sample.name] = sample.value
    return out


# --- basics -----------------------------------------------------------------------------------

def test_basic_routes_and_payloads(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble("0.32.0+cpu", max_model_len=256)]) as fleet:
        url = fleet.urls[0]
        assert url.startswith("http://127.0.0.1:")
        assert client.get(f"{url}/version").json() == {"version": "0.32.0+cpu"}
        health = client.get(f"{url}/health")
        assert health.status_code == 200 and health.content == b""
        models = client.get(f"{url}/v1/models").json()
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "double-model"
        assert models["data"][0]["max_model_len"] == 256
        tok = client.post(f"{url}/tokenize", json={"model": "double-model", "prompt": "a b c"})
        assert tok.json()["count"] == 3 and tok.json()["max_model_len"] == 256
        assert len(tok.json()["tokens"]) == 3
        assert client.get(f"{url}/nope").status_code == 404
        assert client.get(f"{url}/reset_prefix_cache").status_code == 405


def test_metrics_exposition_parses_and_has_vllm_names(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble("0.32.0", block_size=16)]) as fleet:
        text = client.get(f"{fleet.urls[0]}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                 "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
                 "vllm:prompt_tokens_cached"):
        assert families[name].type == "counter"
        assert f"# TYPE {name}_total counter" in text
        (sample,) = [s for s in families[name].samples if s.name == f"{name}_total"]
        assert sample.labels == {"engine": "0", "model_name": "double-model"}
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1.0
    assert info.labels["block_size"] == "16" and info.labels["enable_prefix_caching"] == "True"


def test_metric_names_follow_the_version(client: httpx.Client) -> None:
    fleet = DoubleFleet(replicas=[VllmDouble("0.11.0", connector=None),
                                  VllmDouble("0.15.0", connector=None)])
    with fleet:
        old, mid = (client.get(f"{u}/metrics").text for u in fleet.urls)
    assert "vllm:gpu_prefix_cache_queries_total" in old
    assert "vllm:external_prefix_cache_queries_total" not in old
    assert "vllm:gpu_prefix_cache_queries_total" not in mid
    assert "vllm:external_prefix_cache_queries_total" in mid
    assert "vllm:prompt_tokens_cached_total" not in mid


def test_prompt_longer_than_max_model_len_is_400(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble(max_model_len=32)]) as fleet:
        r = client.post(f"{fleet.urls[0]}/v1/completions",
                        json={"model": "double-model", "prompt": PROMPT, "max_tokens": 4})
    assert r.status_code == 400
    assert "maximum context length is 32" in r.json()["error"]["message"]


def test_prompt_tokens_details_off_gives_null(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble(prompt_tokens_details=False)]) as fleet:
        r = client.post(f"{fleet.urls[0]}/v1/completions",
                        json={"model": "double-model", "prompt": PROMPT, "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens_details"] is None


@pytest.mark.parametrize("version,zero", [("0.13.0", None), ("0.23.0", None), ("0.24.0", 0)])
def test_a_zero_count_is_null_before_0_24(client: httpx.Client, version: str, zero: int | None) -> None:
    """vLLM up to 0.23 fills prompt_tokens_details only for a non-zero count (`and num_cached_tokens:`)."""
    with DoubleFleet(replicas=[VllmDouble(version, connector=None)]) as fleet:
        answers = [client.post(f"{fleet.urls[0]}/v1/completions",
                               json={"model": "double-model", "prompt": PROMPT, "max_tokens": 2}).json()
                   for _ in range(2)]
    first, second = (a["usage"]["prompt_tokens_details"] for a in answers)
    assert (first if first is None else first["cached_tokens"]) == zero
    assert second["cached_tokens"] == 32  # a hit is reported in every version


def test_api_key_protects_v1_only(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble(api_key="k")]) as fleet:
        url = fleet.urls[0]
        assert client.get(f"{url}/v1/models").status_code == 401
        assert client.get(f"{url}/v1/models",
                          headers={"Authorization": "Bearer k"}).status_code == 200
        assert client.post(f"{url}/reset_prefix_cache").status_code == 200


# --- version-dependent routes -----------------------------------------------------------------

def test_dev_routes_are_404_without_dev_mode(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble("0.32.0", dev_mode=False),
                               VllmDouble("0.13.0", dev_mode=False, connector=None)]) as fleet:
        new, old = fleet.urls
        for path in ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache",
                     "/pause", "/resume"):
            assert client.post(f"{new}{path}").status_code == 404, path
        assert client.get(f"{new}/server_info").status_code == 404
        assert client.get(f"{new}/is_paused").status_code == 404
        # 0.12-0.15: /pause & co. are not dev-gated
        assert client.post(f"{old}/pause").json() == {"status": "paused"}
        assert client.get(f"{old}/is_paused").json() == {"is_paused": True}
        assert client.post(f"{old}/reset_prefix_cache").status_code == 404


@pytest.mark.parametrize(("version", "mm", "encoder", "pause", "server_info"), [
    ("0.10.2", 404, 404, 404, 404),
    ("0.11.0", 404, 404, 404, 200),  # /server_info?config_format= from 0.11.0 (vllm_facts.json)
    ("0.11.1", 200, 404, 404, 200),
    ("0.12.0", 200, 404, 200, 200),
    ("0.15.1", 200, 404, 200, 200),
    ("0.16.0", 200, 200, 200, 200),
])
def test_routes_by_version(client: httpx.Client, version: str, mm: int, encoder: int,
                           pause: int, server_info: int) -> None:
    with DoubleFleet(replicas=[VllmDouble(version, connector=None)]) as fleet:
        url = fleet.urls[0]
        assert client.post(f"{url}/reset_mm_cache").status_code == mm
        assert client.post(f"{url}/reset_encoder_cache").status_code == encoder
        assert client.get(f"{url}/is_paused").status_code == pause
        assert client.get(f"{url}/server_info").status_code == server_info


def test_reset_body_shape_by_version(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble("0.25.0"), VllmDouble("0.26.0")]) as fleet:
        old, new = fleet.urls
        r_old = client.post(f"{old}/reset_prefix_cache?reset_external=true")
        r_new = client.post(f"{new}/reset_prefix_cache?reset_external=true")
        assert r_old.status_code == 200 and r_old.content == b""
        assert r_new.status_code == 200 and r_new.json() == {"success": True}
        assert client.post(f"{new}/reset_mm_cache").content == b""


def test_server_info_reports_connector_and_cache_config(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble("0.32.0", cache_prefix="job1/", block_size=32),
                               VllmDouble("0.20.0", connector="LMCacheConnectorV1")]) as fleet:
        new, old = (client.get(f"{u}/server_info", params={"config_format": "json"}).json()
                    for u in fleet.urls)
        assert isinstance(client.get(f"{fleet.urls[0]}/server_info").json()["vllm_config"], str)
    kv = new["vllm_config"]["kv_transfer_config"]
    assert kv["kv_connector"] == "MooncakeStoreConnector"
    assert kv["kv_connector_extra_config"] == {"cache_prefix": "job1/"}
    assert "kv_buffer_size" not in kv and kv["kv_load_failure_policy"] == "fail"
    assert new["vllm_config"]["cache_config"]["block_size"] == 32
    assert old["vllm_config"]["kv_transfer_config"]["kv_buffer_size"] == 1e9


def test_impossible_connectors_are_refused() -> None:
    with pytest.raises(ValueError, match="MooncakeStoreConnector"):
        VllmDouble("0.20.0", connector="MooncakeStoreConnector")
    with pytest.raises(ValueError, match="Unsupported connector type"):
        VllmDouble("0.32.0", connector="NoSuchConnector")


# --- the cache model and the reset semantics ---------------------------------------------------

def test_cross_replica_external_hits_and_the_real_clear(client: httpx.Client) -> None:
    """FACTS.md section 3, reproduced: stale KV survives a local-only reset until reset_external."""
    store = SharedStore()
    with DoubleFleet(replicas=[VllmDouble("0.32.0", store=store),
                               VllmDouble("0.32.0", store=store)]) as fleet:
        a, b = fleet.urls
        assert complete(client, a) == 0
        assert complete(client, a) == 32              # local hit (2 blocks of 16)
        before = counters(client, b)
        assert complete(client, b) == 32              # B's first request: external hits
        after = counters(client, b)
        assert after["vllm:external_prefix_cache_hits_total"] \
            - before["vllm:external_prefix_cache_hits_total"] == 32
        assert after["vllm:prefix_cache_hits_total"] == before["vllm:prefix_cache_hits_total"]

        for url in (a, b):                            # local-only reset: store still stale
            assert client.post(f"{url}/reset_prefix_cache").status_code == 200
        assert complete(client, b) == 32
        assert fleet.replicas[1].counters.external_prefix_cache_hits == 64

        for url in (a, b):
            client.post(f"{url}/reset_prefix_cache", params={"reset_external": "true"})
        assert len(store) == 0
        before = counters(client, a)
        assert complete(client, a) == 0
        after = counters(client, a)
        assert after["vllm:prefix_cache_hits_total"] == before["vllm:prefix_cache_hits_total"]
        assert after["vllm:external_prefix_cache_hits_total"] \
            == before["vllm:external_prefix_cache_hits_total"]


def test_store_connector_clears_only_from_0_23(client: httpx.Client) -> None:
    store_22, store_23 = SharedStore(), SharedStore()
    with DoubleFleet(replicas=[VllmDouble("0.22.0", store=store_22),
                               VllmDouble("0.23.0", store=store_23)]) as fleet:
        old, new = fleet.urls
        complete(client, old)
        complete(client, new)
        assert len(store_22) == len(store_23) == 2
        r = client.post(f"{old}/reset_prefix_cache?reset_external=true")
        assert r.status_code == 200 and r.content == b""      # reports success...
        assert len(store_22) == 2                              # ...and clears nothing
        assert complete(client, old) == 32                     # stale KV from the store
        client.post(f"{new}/reset_prefix_cache?reset_external=true")
        assert len(store_23) == 0
        assert complete(client, new) == 0
        assert fleet.replicas[0].counters.store_clears == 0
        assert fleet.replicas[1].counters.store_clears == 1


def test_reset_before_0_13_ignores_params_and_reset_connector_is_ignored(
        client: httpx.Client) -> None:
    store_12, store_32 = SharedStore(), SharedStore()
    with DoubleFleet(replicas=[
        VllmDouble("0.12.0", connector="LMCacheConnectorV1", store=store_12),
        VllmDouble("0.32.0", store=store_32),
    ]) as fleet:
        old, new = fleet.urls
        complete(client, old)
        complete(client, new)
        # 0.12: the param is unknown, only the local cache goes; store untouched
        assert client.post(f"{old}/reset_prefix_cache?reset_external=true").status_code == 200
        assert len(store_12) == 2 and not fleet.replicas[0].local_blocks
        assert client.post(f"{old}/reset_prefix_cache?reset_external=bogus").status_code == 200
        # the HTTP name is reset_external: reset_connector=true does nothing external
        r = client.post(f"{new}/reset_prefix_cache?reset_connector=true")
        assert r.json() == {"success": True} and len(store_32) == 2
        # from 0.13 the params are validated like FastAPI bools (vLLM answers 400)
        bad = client.post(f"{new}/reset_prefix_cache?reset_external=bogus")
        assert bad.status_code == 400 and "error" in bad.json()


@pytest.mark.parametrize(("version", "children", "clears"), [
    ("0.23.0", ["MooncakeStoreConnector", "NixlConnector"], True),
    ("0.22.0", ["MooncakeStoreConnector", "NixlConnector"], False),
    ("0.32.0", ["LMCacheConnectorV1", "NixlConnector"], False),
])
def test_multiconnector_and_silent_noop_connectors(client: httpx.Client, version: str,
                                                   children: list[str], clears: bool) -> None:
    store = SharedStore()
    replica = VllmDouble(version, connector="MultiConnector", child_connectors=children,
                         store=store)
    with DoubleFleet(replicas=[replica]) as fleet:
        complete(client, fleet.urls[0])
        assert len(store) == 2
        assert client.post(f"{fleet.urls[0]}/reset_prefix_cache",
                           params={"reset_external": "true"}).status_code == 200
        assert (len(store) == 0) is clears


def test_cache_prefix_and_hash_seed_scope_the_keys(client: httpx.Client) -> None:
    store = SharedStore()
    a = VllmDouble(store=store, cache_prefix="a/")
    b = VllmDouble(store=store, cache_prefix="b/")
    c = VllmDouble(store=store, cache_prefix="a/", hash_seed="42")
    with DoubleFleet(replicas=[a, b, c]) as fleet:
        complete(client, fleet.urls[0])
        assert store.keys() == a.prompt_keys(PROMPT)
        assert all(k.startswith("a/") for k in store.keys())
        assert complete(client, fleet.urls[1]) == 0    # other prefix: no external hit
        assert complete(client, fleet.urls[2]) == 0    # other PYTHONHASHSEED: no hit
        assert store.remove_prefix("b/") == 2


def test_master_double_remove_all_clears_the_shared_store(client: httpx.Client) -> None:
    store = SharedStore()
    with DoubleFleet(replicas=[VllmDouble(store=store)],
                     masters=[MasterDouble(store, active_clients=1)]) as fleet:
        complete(client, fleet.urls[0])
        base = f"http://{fleet.master_addresses[0]}"
        health = client.get(f"{base}/health").json()
        assert health["status"] == "ok" and health["service_ready"] is True
        assert "master_key_count 2\n" in client.get(f"{base}/metrics").text
        assert client.get(f"{base}/get_all_keys").text.splitlines() == store.keys()
        key = store.keys()[0]
        assert client.get(f"{base}/query_key", params={"key": key}).json()["success"] is True
        missing = client.get(f"{base}/query_key", params={"key": "nope"})
        assert missing.status_code == 404 and missing.json()["error_code"] == -704
        assert client.get(f"{base}/api/v1/remove_all").status_code == 404
        r = client.post(f"{base}/api/v1/remove_all", params={"force": "true"})
        assert r.json() == {"success": True, "removed_count": 2}
        assert len(store) == 0
        metrics = client.get(f"{base}/metrics").text
        assert "master_key_count 0\n" in metrics
        assert "master_remove_all_requests_total 1\n" in metrics
        assert complete(client, fleet.urls[0]) == 32    # the local cache is still warm


def test_master_non_forced_remove_all_keeps_leased_keys(client: httpx.Client) -> None:
    store = SharedStore(["k1", "k2", "k3"])
    store.lease("k1")
    with DoubleFleet(masters=[MasterDouble(store)]) as fleet:
        base = fleet.master_urls[0]
        assert client.post(f"{base}/api/v1/remove_all").json()["removed_count"] == 2
        assert store.keys() == ["k1"]
        assert client.post(f"{base}/api/v1/remove_all?force=1").json()["removed_count"] == 1


# --- pause / resume ---------------------------------------------------------------------------

def test_pause_blocks_completions_until_resume_and_records_order(client: httpx.Client) -> None:
    replica = VllmDouble("0.32.0", connector=None)
    with DoubleFleet(replicas=[replica]) as fleet:
        url = fleet.urls[0]
        complete(client, url)
        r = client.post(f"{url}/pause", params={"mode": "keep", "clear_cache": "false"})
        assert r.json() == {"status": "paused"}
        assert replica.local_blocks                    # keep + no clear: cache intact
        timer = threading.Timer(0.2, lambda: httpx.post(f"{url}/resume"))
        timer.start()
        t0 = time.monotonic()
        assert complete(client, url) == 32             # waited for /resume
        assert time.monotonic() - t0 >= 0.15
        timer.join()
        assert client.get(f"{url}/is_paused").json() == {"is_paused": False}
        assert replica.call_paths()[-4:] == ["/pause", "/v1/completions", "/resume",
                                             "/is_paused"]
        assert replica.calls_to("/pause")[0].query == {"mode": "keep", "clear_cache": "false"}
        client.post(f"{url}/pause")                    # defaults: abort + clear_cache
        assert not replica.local_blocks
        client.post(f"{url}/resume")


def test_pause_timeout_and_mode_validation(client: httpx.Client) -> None:
    with DoubleFleet(replicas=[VllmDouble("0.16.0", connector=None, pause_timeout=0.1),
                               VllmDouble("0.13.0", connector=None)]) as fleet:
        new, old = fleet.urls
        bad = client.post(f"{new}/pause", params={"mode": "bogus"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == 400
        client.post(f"{new}/pause", params={"mode": "wait"})
        r = client.post(f"{new}/v1/completions",
                        json={"model": "double-model", "prompt": "a b", "max_tokens": 1})
        assert r.status_code == 503
        # 0.13: the old parameters; `mode` is unknown there and ignored
        assert client.post(f"{old}/pause", params={"mode": "bogus"}).status_code == 200
        assert fleet.replicas[1].pause_mode == "abort"


def test_from_0_33_a_pause_in_abort_or_wait_mode_rejects_new_requests_and_keep_queues_them(
        client: httpx.Client) -> None:
    """EngineCore._reject_add_while_paused (vllm/v1/engine/core.py:1796 in 0.33.0): 503 engine_paused
    (retryable) at once, with vLLM's ErrorResponse body; keep, a sleep and 0.32 make it wait."""
    new, old = VllmDouble("0.33.0", connector=None, pause_timeout=0.1), VllmDouble("0.32.0", connector=None,
                                                                                 pause_timeout=0.1)
    body = {"model": "double-model", "prompt": "a b", "max_tokens": 1}
    with DoubleFleet(replicas=[new, old]) as fleet:
        url_new, url_old = fleet.urls
        for mode in ("abort", "wait"):
            client.post(f"{url_new}/pause", params={"mode": mode, "clear_cache": "false"})
            t0 = time.monotonic()
            r = client.post(f"{url_new}/v1/completions", json=body)
            assert time.monotonic() - t0 < 0.1 and r.status_code == 503
            assert r.json() == {"error": {"message": "Generation is paused. Please retry after it resumes.",
                                          "type": "ServiceUnavailableError", "param": None, "code": 503}}
            client.post(f"{url_new}/resume")
        assert new.rejected_while_paused == 2
        new.pause_timeout = 5.0  # time for the resume below
        client.post(f"{url_new}/pause", params={"mode": "keep"})
        timer = threading.Timer(0.1, lambda: httpx.post(f"{url_new}/resume"))
        timer.start()
        assert client.post(f"{url_new}/v1/completions", json=body).status_code == 200  # queued, then served
        timer.join()
        client.post(f"{url_old}/pause", params={"mode": "wait"})
        r = client.post(f"{url_old}/v1/completions", json=body)  # queued: the double's own wait ran out
        assert r.status_code == 503 and "timed out waiting" in r.json()["error"]["message"]
        assert new.rejected_while_paused == 2 and old.rejected_while_paused == 0


def test_pause_with_clear_cache_resets_the_connector_from_0_23(client: httpx.Client) -> None:
    store_22, store_23 = SharedStore(), SharedStore()
    with DoubleFleet(replicas=[VllmDouble("0.22.0", store=store_22),
                               VllmDouble("0.23.0", store=store_23)]) as fleet:
        for url in fleet.urls:
            complete(client, url)
            client.post(f"{url}/pause", params={"mode": "abort", "clear_cache": "true"})
        assert len(store_22) == 2 and len(store_23) == 0


# --- faults -----------------------------------------------------------------------------------

def test_fail_first_then_success_and_calls_are_recorded(client: httpx.Client) -> None:
    replica = VllmDouble(faults=Faults(fail_first={"/reset_prefix_cache": 2}))
    with DoubleFleet(replicas=[replica]) as fleet:
        url = fleet.urls[0]
        codes = [client.post(f"{url}/reset_prefix_cache").status_code for _ in range(3)]
        assert codes == [500, 500, 200]
        assert len(replica.calls_to("/reset_prefix_cache", "POST")) == 3
        ts = [c.t for c in replica.calls]
        assert ts == sorted(ts)


def test_status_and_success_false(client: httpx.Client) -> None:
    replica = VllmDouble("0.26.0", faults=Faults(status={"/reset_mm_cache": 403},
                                                 success_false={"/reset_prefix_cache"}))
    with DoubleFleet(replicas=[replica]) as fleet:
        url = fleet.urls[0]
        complete(client, url)
        assert client.post(f"{url}/reset_mm_cache").status_code == 403
        r = client.post(f"{url}/reset_prefix_cache")
        assert r.status_code == 200 and r.json() == {"success": False}
        assert replica.local_blocks                    # a failed reset clears nothing
        replica.faults.success_false.clear()          # mutable at runtime
        assert client.post(f"{url}/reset_prefix_cache").json() == {"success": True}


def test_delay_makes_a_client_time_out(client: httpx.Client) -> None:
    replica = VllmDouble(faults=Faults(delay={"/version": 1.0}))
    with DoubleFleet(replicas=[replica]) as fleet:
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{fleet.urls[0]}/version", timeout=0.1)
        replica.faults.delay.clear()
        assert client.get(f"{fleet.urls[0]}/version").status_code == 200


def test_refuse_gives_connection_refused_even_on_a_kept_alive_connection(
        client: httpx.Client) -> None:
    dead_from_start = VllmDouble(faults=Faults(refuse=True))
    alive = VllmDouble()
    with DoubleFleet(replicas=[dead_from_start, alive]) as fleet:
        with pytest.raises(httpx.ConnectError):
            client.get(f"{fleet.urls[0]}/health")
        assert client.get(f"{fleet.urls[1]}/health").status_code == 200   # pooled connection
        alive.faults.refuse = True
        with pytest.raises((httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)):
            client.get(f"{fleet.urls[1]}/health")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{fleet.urls[1]}/health")


def test_master_faults(client: httpx.Client) -> None:
    store = SharedStore(["k"])
    master = MasterDouble(store, faults=Faults(success_false={"/api/v1/remove_all"},
                                               fail_first={"/health": 1}))
    with DoubleFleet(masters=[master]) as fleet:
        base = fleet.master_urls[0]
        assert client.get(f"{base}/health").status_code == 500
        assert client.get(f"{base}/health").status_code == 200
        assert client.post(f"{base}/api/v1/remove_all?force=true").json()["success"] is False
        assert len(store) == 1


def test_fleet_add_and_asyncio_run_clients() -> None:
    store = SharedStore()
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.23.0", store=store))
        address = fleet.add_master(MasterDouble(store))
        assert fleet.urls == [url] and fleet.master_addresses == [address]

        async def go() -> tuple[int, int]:
            async with httpx.AsyncClient(timeout=5) as c:
                a = await c.get(f"{url}/version")
                b = await c.get(f"http://{address}/health")
                return a.status_code, b.status_code

        assert asyncio.run(go()) == (200, 200)


# --- scale --------------------------------------------------------------------------------------

def test_256_replicas_start_and_answer_quickly() -> None:
    t0 = time.monotonic()
    replicas = [VllmDouble(f"0.{13 + i % 20}.0", connector=None) for i in range(256)]
    with DoubleFleet(replicas=replicas) as fleet:
        started = time.monotonic() - t0
        assert len(set(fleet.urls)) == 256

        async def ask_all() -> list[str]:
            gate = asyncio.Semaphore(64)      # a bounded fan-out, like a fleet reset

            async def ask(client: httpx.AsyncClient, url: str) -> str:
                async with gate:
                    return (await client.get(f"{url}/version")).json()["version"]

            async with httpx.AsyncClient(timeout=10) as c:
                return await asyncio.gather(*(ask(c, u) for u in fleet.urls))

        versions = asyncio.run(ask_all())
        elapsed = time.monotonic() - t0
    assert versions == [r.version for r in replicas]
    assert started < 5 and elapsed < 10, (started, elapsed)
