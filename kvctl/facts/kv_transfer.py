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
