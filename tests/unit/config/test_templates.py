"""Templates: loading, parameters, --set, user folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.config import templates
from kvctl.errors import UsageError

BUILTINS = {"mooncake-store", "mooncake-store-standalone", "mooncake-pd", "mooncake-pd-store", "lmcache-mooncake"}


def test_builtins_load() -> None:
    loaded = {t.name: t for t in templates.load_all()}
    assert BUILTINS <= set(loaded)
    assert loaded["mooncake-pd-store"].connectors() == ["MultiConnector", "MooncakeConnector", "MooncakeStoreConnector"]
    assert loaded["mooncake-store"].parameters["global_segment_size"].type == "size"


def test_overrides_are_typed() -> None:
    t = templates.load("mooncake-store")
    values = t.resolve({"hash_seed": "7", "global_segment_size": "1GB", "protocol": "rdma"})
    assert values["hash_seed"] == 7 and values["global_segment_size"] == "1GB" and values["protocol"] == "rdma"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hash_seed", "abc", "hash_seed expects int, got 'abc'"),
        ("global_segment_size", "lots", "global_segment_size expects a size"),
        ("protocol", "udp", "protocol expects one of tcp|rdma, got 'udp'"),
        ("global_segmnt_size", "1GB", "did you mean 'global_segment_size'"),
    ],
)
def test_bad_overrides(key: str, value: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        templates.load("mooncake-store").resolve({key: value})
    assert message in str(info.value)


def test_parse_overrides() -> None:
    assert templates.parse_overrides(["a=1", "b=x=y", "a=2"]) == {"a": "2", "b": "x=y"}
    with pytest.raises(UsageError, match="is not key=value"):
        templates.parse_overrides(["novalue"])


def test_substitution_keeps_types_and_drops_unset() -> None:
    node = {"a": "${n}", "b": "x-${n}", "c": {"d": "${unset}"}, "e": "$${literal}"}
    assert templates.fill(node, {"n": 3, "unset": None}) == {"a": 3, "b": "x-3", "e": "${literal}"}


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


USER_TEMPLATE = """
name: {name}
description: user template
vllm: ">=0.23.0"
parameters:
  role: {{type: choice, choices: [producer, consumer], default: producer, help: side}}
kv_transfer_config:
  kv_connector: MooncakeStoreConnector
  kv_role: kv_both
env: {{}}
"""


def test_user_folder_overrides_and_extends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "mooncake-store", USER_TEMPLATE.format(name="mooncake-store"))
    _write(tmp_path, "mine", USER_TEMPLATE.format(name="mine"))
    monkeypatch.setenv(templates.TEMPLATE_PATH_ENV, str(tmp_path))
    assert templates.load("mooncake-store").origin == str(tmp_path / "mooncake-store.yaml")
    assert templates.load("mine").description == "user template"
    assert "mooncake-pd" in {t.name for t in templates.load_all()}
    # an explicit --template-path wins over the env var
    assert templates.load("mooncake-store", template_path="").origin == "built-in"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\n  bad: [", "not valid YAML"),
        ("- a list", "top level must be a mapping"),
        ("name: broken\ndescription: d\nkv_transfer_config: {kv_connector: '${nope}'}\n", "${nope}"),
        ("name: broken\ndescription: d\nkv_transfer_config: {}\nexec: rm -rf /\n", "unknown key(s) exec"),
        ("name: broken\ndescription: d\nkv_transfer_config: {}\nparameters: {p: {type: blob, help: h}}\n",
         "type 'blob' is not one of"),
        ("name: other\ndescription: d\nkv_transfer_config: {}\n", "differs from its file name"),
    ],
)
def test_broken_user_templates(tmp_path: Path, text: str, message: str) -> None:
    _write(tmp_path, "broken", text)
    with pytest.raises(UsageError) as info:
        templates.load("broken", template_path=str(tmp_path))
    assert message in str(info.value)


def test_unknown_template_and_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="did you mean 'mooncake-store'"):
        templates.load("mooncake-stor")
    with pytest.raises(UsageError, match="is not a folder"):
        templates.load("x", template_path=str(tmp_path / "nope"))
