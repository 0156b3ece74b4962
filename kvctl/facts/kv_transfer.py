"""Helpers over a kv_transfer_config's tree (a connector, or a MultiConnector of children), shared by
render and validate: data only, no version facts.
"""

from __future__ import annotations

from typing import Any


def connector_names(kv_transfer_config: dict[str, Any]) -> list[str]:
    names: list[str] = []
    name = kv_transfer_config.get("kv_connector")
    if isinstance(name, str):
        names.append(name)
    extra = kv_transfer_config.get("kv_connector_extra_config")
    if isinstance(extra, dict) and isinstance(extra.get("connectors"), list):
        for child in extra["connectors"]:
            if isinstance(child, dict):
                names.extend(connector_names(child))
    return names


# Connectors that move KV from a prefill server (kv_producer) to a decode server (kv_consumer), with a
# proxy in front that sends each request to both (vLLM 0.32.0 kv_connector/factory.py; P2pNcclConnector in
# releases before it). A fleet of alike replicas cannot run them.
DISAGGREGATION_CONNECTORS = frozenset({"MooncakeConnector", "NixlConnector", "NixlPullConnector", "NixlPushConnector",
                                       "MoRIIOConnector", "P2pNcclConnector"})


def disaggregation_connectors(kv_transfer_config: dict[str, Any]) -> list[str]:
    """The prefill/decode connectors in a layout, MultiConnector children included."""
    return [n for n in connector_names(kv_transfer_config) if n in DISAGGREGATION_CONNECTORS]
