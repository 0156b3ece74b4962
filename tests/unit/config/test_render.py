"""Rendering every built-in template, fitted to each vLLM version."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from kvctl.config import templates
from kvctl.config.render import render, write_bundle
from kvctl.errors import KvctlError, UsageError
from kvctl.facts.capabilities import table
from kvctl.facts.kv_transfer import connector_names
from kvctl.facts.versions import parse_version
from kvctl.validate import validate_kv_transfer_config, validate_mooncake_config

VERSIONS = ["0.13.0", "0.16.0", "0.21.0", "0.23.0", "0.32.0", "0.33.0"]
ROLE = {"mooncake-pd": {"role": "producer"}, "mooncake-pd-store": {"role": "consumer"}}
# The first version each template can render for, and why not before.
FIRST = {
    "mooncake-store": ("0.21.0", "MooncakeStoreConnector, which vLLM {v} does not have; it first appears in vLLM 0.21.0"),
    "mooncake-pd-store": ("0.21.0", "MooncakeStoreConnector, which vLLM {v} does not have; it first appears in vLLM 0.21.0"),
    "mooncake-store-standalone": ("0.22.0", "{standalone}"),
    "mooncake-pd": ("0.13.0", ""),
    "lmcache-mooncake": ("0.13.0", ""),
}
REMOVED_IN_032 = {"kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"}


def _configs(ktc: dict) -> list[dict]:
    children = (ktc.get("kv_connector_extra_config") or {}).get("connectors") or []
    return [ktc] + [c for child in children for c in _configs(child)]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(FIRST))
def test_every_template_for_every_version(name: str, version: str, tmp_path: Path) -> None:
    template = templates.load(name)
    first, why = FIRST[name]
    v = parse_version(version)
    if v < parse_version(first):
        with pytest.raises(UsageError) as info:
            render(template, ROLE.get(name, {}), v)
        standalone = ("MooncakeStoreConnector, which vLLM {v} does not have" if v < parse_version("0.21.0")
                      else "is for vLLM >=0.22.0; {v} is outside that range")
        assert why.replace("{standalone}", standalone).format(v=version) in str(info.value)
        return
    bundle = render(template, ROLE.get(name, {}), v, base_dir=tmp_path)
    accepted = set(table().fields_in(v))
    for cfg in _configs(bundle.kv_transfer_config):
        assert set(cfg) <= accepted
        assert cfg["kv_role"] in {"kv_producer", "kv_consumer", "kv_both"}
        if v >= parse_version("0.32.0"):
            assert not set(cfg) & REMOVED_IN_032
    assert [p for p in validate_kv_transfer_config(bundle.kv_transfer_config, v) if p.severity == "error"] == []
    if bundle.mooncake is not None:
        readers = tuple(connector_names(bundle.kv_transfer_config))  # as its own connectors read it
        assert [p for p in validate_mooncake_config(bundle.mooncake, v, readers=readers)
                if p.severity == "error"] == []
        assert Path(bundle.env["MOONCAKE_CONFIG_PATH"]) == tmp_path / "mooncake.json"
    assert bundle.env["PYTHONHASHSEED"] == "0" and bundle.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_mooncake_store_exact_output(tmp_path: Path) -> None:
    bundle = render(templates.load("mooncake-store"), {"master": "10.0.0.5:50051", "cache_prefix": "rl-a"},
                    parse_version("0.32.0+cpu"), base_dir=tmp_path)
    assert bundle.kv_transfer_config == {
        "kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cache_prefix": "rl-a"},
    }
    assert bundle.mooncake == {
        "metadata_server": "P2PHANDSHAKE", "master_server_address": "10.0.0.5:50051", "protocol": "tcp",
        "device_name": "", "mode": "embedded", "global_segment_size": "256MB", "local_buffer_size": "128MB",
    }
    assert json.loads(bundle.as_format("json")) == bundle.kv_transfer_config
    assert json.loads(bundle.as_format("mooncake")) == bundle.mooncake


def test_fitting_drops_mode_before_022_and_notes_it() -> None:
    bundle = render(templates.load("mooncake-store"), {}, parse_version("0.21.0"))
    assert "mode" not in bundle.mooncake
    assert any("left out mode" in n for n in bundle.notes)
    assert render(templates.load("mooncake-store"), {}, parse_version("0.22.0")).mooncake["mode"] == "embedded"


def test_fitting_notes_cuda_default_before_018() -> None:
    bundle = render(templates.load("mooncake-pd"), {"role": "producer"}, parse_version("0.17.0"))
    assert any("kv_buffer_device=cpu" in n for n in bundle.notes)
    cpu = render(templates.load("mooncake-pd"), {"role": "producer", "kv_buffer_device": "cpu"}, parse_version("0.17.0"))
    assert cpu.kv_transfer_config["kv_buffer_device"] == "cpu"
    assert not any("kv_buffer_device" in n for n in cpu.notes)


def test_fitting_drops_removed_fields_from_user_templates(tmp_path: Path) -> None:
    (tmp_path / "legacy.yaml").write_text(
        "name: legacy\ndescription: d\nkv_transfer_config:\n  kv_connector: MooncakeStoreConnector\n"
        "  kv_role: kv_both\n  kv_ip: 127.0.0.1\n  kv_buffer_size: 1000000000\n")
    template = templates.load("legacy", template_path=str(tmp_path))
    old = render(template, {}, parse_version("0.31.0"))
    assert old.kv_transfer_config["kv_ip"] == "127.0.0.1"
    new = render(template, {}, parse_version("0.32.0"))
    assert "kv_ip" not in new.kv_transfer_config and "kv_buffer_size" not in new.kv_transfer_config
    assert any("left out kv_ip" in n for n in new.notes)


def test_tenant_id_needs_028() -> None:
    with pytest.raises(UsageError, match="tenant_id needs vLLM >= 0.28.0"):
        render(templates.load("mooncake-store"), {"tenant_id": "a"}, parse_version("0.27.0"))
    assert render(templates.load("mooncake-store"), {"tenant_id": "a"}, parse_version("0.28.0")).mooncake["tenant_id"] == "a"


def test_role_is_required_for_pd() -> None:
    with pytest.raises(UsageError, match="parameter 'role' is unset"):
        render(templates.load("mooncake-pd"), {}, parse_version("0.23.0"))
    both = render(templates.load("mooncake-pd-store"), {"role": "producer"}, parse_version("0.23.0"))
    children = both.kv_transfer_config["kv_connector_extra_config"]["connectors"]
    assert both.kv_transfer_config["kv_role"] == "kv_producer"
    assert [(c["kv_connector"], c["kv_role"]) for c in children] == [
        ("MooncakeConnector", "kv_producer"), ("MooncakeStoreConnector", "kv_both")]


def test_older_than_supported() -> None:
    with pytest.raises(UsageError, match="older than 0.13.0, the oldest release kvctl supports"):
        render(templates.load("mooncake-pd"), {"role": "producer"}, parse_version("0.12.0"))


def test_a_cache_prefix_the_release_does_not_read_is_refused(tmp_path: Path) -> None:
    """MooncakeStoreConnector reads cache_prefix from 0.24.0: on 0.23 the keys would carry no prefix
    and every clear scoped to it would find nothing."""
    with pytest.raises(KvctlError, match="reads 'cache_prefix' only from vLLM 0.24.0") as info:
        render(templates.load("mooncake-store"), {"cache_prefix": "team-a"}, parse_version("0.23.0"), base_dir=tmp_path)
    assert "--set" in info.value.hint and not list(tmp_path.iterdir())


def test_formats(tmp_path: Path) -> None:
    bundle = render(templates.load("mooncake-store"), {"cache_prefix": "it's"}, parse_version("0.24.0"),
                    base_dir=tmp_path)
    args = shlex.split(bundle.as_format("vllm-args"))
    assert args[0] == "--kv-transfer-config" and json.loads(args[1]) == bundle.kv_transfer_config
    verl = yaml.safe_load(bundle.as_format("verl"))
    assert verl["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["kv_transfer_config"] == bundle.kv_transfer_config
    env = dict(line.removeprefix("export ").split("=", 1) for line in shlex.split(bundle.as_format("env"), posix=True)
               if "=" in line)
    assert env["MOONCAKE_CONFIG_PATH"] == str(tmp_path / "mooncake.json")
    # the verl format carries the env format's variables, as strings, where Ray reads them
    assert verl["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"] == env
    pd = render(templates.load("mooncake-pd"), {"role": "consumer"}, parse_version("0.23.0"))
    with pytest.raises(UsageError, match="has no Mooncake store config"):
        pd.as_format("mooncake")


@pytest.mark.parametrize("name", sorted(FIRST))
def test_the_verl_format_has_the_canary_s_flag_and_the_env_as_ray_strings(name: str, tmp_path: Path) -> None:
    """verl.yaml: the connector and enable_prompt_tokens_details (kvctl's verify canary reads the
    cached-token counts only that flag makes vLLM report) under engine_kwargs.vllm, and every
    variable of kvctl.env under ray_kwargs.ray_init.runtime_env.env_vars, each a string."""
    bundle = render(templates.load(name), ROLE.get(name, {}), parse_version("0.24.0"), base_dir=tmp_path)
    verl = yaml.safe_load(bundle.as_format("verl"))
    assert verl["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"] == {
        "kv_transfer_config": bundle.kv_transfer_config, "enable_prompt_tokens_details": True}
    env_vars = verl["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env_vars == bundle.env and all(isinstance(v, str) for v in env_vars.values())
    assert {"PYTHONHASHSEED": "0", "VLLM_SERVER_DEV_MODE": "1"}.items() <= env_vars.items()
    assert set(verl) == {"actor_rollout_ref", "ray_kwargs"}
    assert not [n for n in bundle.notes if "enable_prompt_tokens_details" in n]


def test_the_verl_format_leaves_out_a_serve_flag_the_version_lacks(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """A flag `vllm serve` does not have would stop every server verl starts: left out, and said."""
    from kvctl.config import render as render_module

    real = render_module.serve_options
    monkeypatch.setattr(render_module, "serve_options", lambda v: {
        k: o for k, o in real(v).items() if "prompt-tokens-details" not in k})
    bundle = render(templates.load("mooncake-store"), {}, parse_version("0.24.0"), base_dir=tmp_path)
    verl = yaml.safe_load(bundle.as_format("verl"))
    assert verl["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"] == {
        "kv_transfer_config": bundle.kv_transfer_config}
    (note,) = [n for n in bundle.notes if "enable_prompt_tokens_details" in n]
    assert "vLLM 0.24.0 does not have --enable-prompt-tokens-details" in note and "canary" in note


def test_the_verl_format_of_a_version_the_facts_do_not_cover_names_why(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    from kvctl.config import render as render_module

    monkeypatch.setattr(render_module, "serve_options", lambda v: {})
    bundle = render(templates.load("mooncake-store"), {}, parse_version("0.24.0"), base_dir=tmp_path)
    assert "enable_prompt_tokens_details" not in bundle.as_format("verl")
    assert any("not covered by kvctl's facts" in n for n in bundle.notes)


def test_write_bundle_new_and_existing_dir(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    bundle = render(templates.load("mooncake-store"), {}, parse_version("0.23.0"), bundle_dir=out)
    written = write_bundle(bundle, out)
    assert sorted(p.name for p in written) == sorted(
        ["kv_transfer_config.json", "verl.yaml", "vllm-args.txt", "kvctl.env", "mooncake.json", "bundle.json"])
    assert str(out / "mooncake.json") in (out / "kvctl.env").read_text()
    assert json.loads((out / "bundle.json").read_text())["vllm_version"] == "0.23.0"
    # rewriting into the same folder replaces files and leaves no temporaries
    write_bundle(bundle, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_write_bundle_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    bundle = render(templates.load("mooncake-store"), {}, parse_version("0.23.0"))
    with pytest.raises(UsageError, match="not a folder"):
        write_bundle(bundle, target)
    assert target.read_text() == "keep me"


def test_out_notes_a_hard_coded_mooncake_config_path(tmp_path: Path) -> None:
    """A user template whose env hard-codes MOONCAKE_CONFIG_PATH: --out writes a mooncake.json and a
    kvctl.env pointing elsewhere. That may be meant (a mounted path), so a note says it, not silence."""
    raw = yaml.safe_load((templates.builtin_dir() / "mooncake-store.yaml").read_text())
    raw["name"] = "mine"
    del raw["parameters"]["config_path"]
    raw["env"]["MOONCAKE_CONFIG_PATH"] = "/etc/mooncake/mooncake.json"
    template = templates.parse_template(raw, "mine.yaml")
    out = tmp_path / "deploy"
    bundle = render(template, {}, parse_version("0.32.0"), bundle_dir=out)
    assert any("MOONCAKE_CONFIG_PATH=/etc/mooncake/mooncake.json, not the mooncake.json written to "
               f"{out.resolve() / 'mooncake.json'}" in n for n in bundle.notes), bundle.notes
    # the built-in template points it at the written file: no note
    builtin = render(templates.load("mooncake-store"), {}, parse_version("0.32.0"), bundle_dir=out)
    assert not any("MOONCAKE_CONFIG_PATH" in n for n in builtin.notes)
    # --set config_path says where the file will be: no note either
    moved = render(templates.load("mooncake-store"), {"config_path": "/srv/m.json"}, parse_version("0.32.0"),
                   bundle_dir=out)
    assert not any("MOONCAKE_CONFIG_PATH" in n for n in moved.notes)
