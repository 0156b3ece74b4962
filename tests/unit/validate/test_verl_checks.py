"""kvctl config validate on verl configs: verl's own rules on top of vLLM's (kvctl.validate.verl).

One test per mistake, each in the forms a verl user writes it (a YAML trainer config, a Hydra
command line in a script), and configs without them that stay clean. tests/unit/config/test_verl.py
shows with verl's own code that verl refuses or drops what these tests call errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.config import templates
from kvctl.config.render import render
from kvctl.facts.versions import parse_version
from kvctl.validate import ERROR, WARNING, Problem, validate_path

ROLLOUT = "actor_rollout_ref.rollout"
RIGHT = f"{ROLLOUT}.engine_kwargs.vllm.kv_transfer_config"
STORE_BLOCK = "kv_connector: MooncakeStoreConnector\n{i}kv_role: kv_both\n"
VERSION = "0.24.0"  # verl 0.9.1's pin


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def at(problems: list[Problem], where: str) -> Problem:
    """The one problem located at `where` ("FILE:LINE path")."""
    found = [p for p in problems if p.where == where]
    assert len(found) == 1, [p.where for p in problems]
    return found[0]


def but_shared_master(problems: list[Problem]) -> list[Problem]:
    """The problems other than the shared-master warning every verl job with the store connector gets
    on vLLM >= 0.23 (section 6)."""
    return [p for p in problems if not (p.severity == WARNING and "master-wide remove_all" in p.message)]


def trainer(body: str) -> str:
    """A verl trainer config whose rollout section holds `body` (indented under it)."""
    return "trainer:\n  total_epochs: 1\nactor_rollout_ref:\n  rollout:\n    name: vllm\n" + body


def script(*overrides: str, config: str = "") -> str:
    """A script launching verl with these Hydra overrides, one per line from line 3."""
    lines = ["#!/bin/bash", f"python3 -m verl.trainer.main_ppo {config}\\".replace("  ", " ")]
    lines += [f"    {o} \\" for o in overrides[:-1]] + [f"    {overrides[-1]}", ""]
    return "\n".join(lines)


# -- 1. the connector under engine_kwargs without the vllm level: verl drops it -------------------
def test_engine_kwargs_without_the_vllm_level_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path, "ppo.yaml", trainer("    engine_kwargs:\n      kv_transfer_config:\n"
                                            "        " + STORE_BLOCK.format(i="        ")))
    problem = at(validate_path(f, VERSION).problems, f"{f}:7 {ROLLOUT}.engine_kwargs.kv_transfer_config")
    assert problem.severity == ERROR and not problem.dropped
    assert "without the 'vllm' level" in problem.message and "vllm_async_server.py:287" in problem.message
    assert problem.fix == f"move it one level down, to {RIGHT}"


def test_engine_kwargs_without_the_vllm_level_on_the_command_line(tmp_path: Path) -> None:
    f = write(tmp_path, "train.sh", script(
        f"+{ROLLOUT}.engine_kwargs.kv_transfer_config.kv_connector=MooncakeStoreConnector",
        f"+{ROLLOUT}.engine_kwargs.kv_transfer_config.kv_role=kv_both"))
    problem = at(validate_path(f, VERSION).problems, f"{f}:3 {ROLLOUT}.engine_kwargs.kv_transfer_config")
    assert problem.severity == ERROR and RIGHT in problem.fix


# -- 2. one level too high: verl refuses it at start -------------------------------------------
def test_kv_transfer_config_directly_under_rollout_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path, "ppo.yaml", trainer("    kv_transfer_config:\n      " + STORE_BLOCK.format(i="      ")))
    problem = at(validate_path(f, VERSION).problems, f"{f}:6 {ROLLOUT}.kv_transfer_config")
    assert problem.severity == ERROR
    assert "RolloutConfig.__init__() got an unexpected keyword argument 'kv_transfer_config'" in problem.message
    assert problem.fix.endswith(RIGHT)
    hydra = write(tmp_path, "train.sh", script(f"+{ROLLOUT}.kv_transfer_config='{{kv_connector: "
                                               "MooncakeStoreConnector, kv_role: kv_both}'"))
    assert at(validate_path(hydra, VERSION).problems, f"{hydra}:3 {ROLLOUT}.kv_transfer_config").severity == ERROR


# -- 3. engine_kwargs.vllm.* on the command line without '+': Hydra refuses ----------------------
def test_a_vllm_engine_kwarg_override_without_plus_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path, "train.sh", script(
        "data.train_batch_size=256",
        f"{RIGHT}='{{kv_connector: MooncakeStoreConnector, kv_role: kv_both}}'",
        f"{ROLLOUT}.engine_kwargs.vllm.enable_prompt_tokens_details=true"))
    problems = validate_path(f, VERSION).problems
    for line, key in ((4, RIGHT), (5, f"{ROLLOUT}.engine_kwargs.vllm.enable_prompt_tokens_details")):
        problem = at(problems, f"{f}:{line} {key}")
        assert problem.severity == ERROR and f"Could not override '{key}'" in problem.message
        assert problem.fix.startswith(f"write +{key}=...") and f"++{key}" in problem.fix
    assert not [p for p in problems if "train_batch_size" in p.where]  # verl has that key: no '+' needed


def test_plus_and_double_plus_are_what_hydra_takes(tmp_path: Path) -> None:
    f = write(tmp_path, "train.sh", script(
        f"+{RIGHT}='{{kv_connector: MooncakeStoreConnector, kv_role: kv_both}}'",
        f"++{ROLLOUT}.engine_kwargs.vllm.enable_prompt_tokens_details=true",
        f"{ROLLOUT}.full_determinism=false"))
    assert but_shared_master(validate_path(f, VERSION).problems) == []


def test_without_plus_on_the_user_s_own_config_is_a_warning(tmp_path: Path) -> None:
    """A config loaded with --config-name may have the key (kvctl's own verl.yaml does): Hydra
    takes the override then, so kvctl cannot call it refused."""
    f = write(tmp_path, "train.sh", script(f"{RIGHT}.kv_role=kv_both",
                                           config='--config-path "$PWD/conf" --config-name trainer'))
    problem = at(validate_path(f, VERSION).problems, f"{f}:3 {RIGHT}.kv_role")
    assert problem.severity == WARNING and "unless the config this command loads" in problem.message


# -- 4. full_determinism: a PYTHONHASHSEED per replica ---------------------------------------------
def test_full_determinism_with_the_store_connector_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path, "ppo.yaml", trainer("    full_determinism: true\n    engine_kwargs:\n      vllm:\n"
                                            "        kv_transfer_config:\n"
                                            "          " + STORE_BLOCK.format(i="          ")))
    problem = at(validate_path(f, VERSION).problems, f"{f}:6 {ROLLOUT}.full_determinism")
    assert problem.severity == ERROR
    assert "vllm_async_server.py:149-156" in problem.message and "cross-replica hits" in problem.message
    assert problem.fix.startswith(f"set {ROLLOUT}.full_determinism=false")


def test_full_determinism_without_a_store_connector_here_is_a_warning(tmp_path: Path) -> None:
    """The connector may come from another file (kvctl's verl.yaml included by the trainer's)."""
    f = write(tmp_path, "train.sh", script(f"{ROLLOUT}.full_determinism=True", config="--config-name trainer"))
    problem = at(validate_path(f, VERSION).problems, f"{f}:3 {ROLLOUT}.full_determinism")
    assert problem.severity == WARNING and "PYTHONHASHSEED" in problem.message


@pytest.mark.parametrize("value", ["false", "'${oc.env:DETERMINISTIC}'"])
def test_full_determinism_off_or_filled_in_later_is_not_judged(value: str, tmp_path: Path) -> None:
    f = write(tmp_path, "ppo.yaml", trainer(f"    full_determinism: {value}\n"))
    assert validate_path(f, VERSION).problems == []


# -- 5. one side of a prefill/decode split: every replica gets it ---------------------------------
@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_a_prefill_decode_template_under_verl_is_an_error(role: str, tmp_path: Path) -> None:
    """kvctl's own mooncake-pd-store, rendered for verl: the MultiConnector and its P2P child both
    carry the side; one error, at the first."""
    bundle = render(templates.load("mooncake-pd-store"), {"role": role}, parse_version(VERSION), base_dir=tmp_path)
    f = write(tmp_path, "verl.yaml", bundle.as_format("verl"))
    problems = [p for p in validate_path(f, VERSION).problems if "kv_role" in p.where]
    (problem,) = problems
    assert problem.where == f"{f}:7 {RIGHT}.kv_role" and problem.severity == ERROR
    assert f"every server is a kv_{role}" in problem.message and "kv_both" in problem.fix
    assert "disaggregation" in problem.fix


def test_a_one_sided_role_on_the_command_line(tmp_path: Path) -> None:
    f = write(tmp_path, "train.sh", script(f"+{RIGHT}.kv_connector=MooncakeConnector", f"+{RIGHT}.kv_role=kv_consumer"))
    problem = at(validate_path(f, VERSION).problems, f"{f}:4 kv_transfer_config.kv_role")
    assert problem.severity == ERROR and "none a kv_producer" in problem.message


# -- 6. verl's doc's mooncake_config_path: vLLM reads only the environment ------------------------
def test_mooncake_config_path_in_a_verl_config_says_where_verl_s_env_goes(tmp_path: Path) -> None:
    f = write(tmp_path, "ppo.yaml", trainer(
        "    engine_kwargs:\n      vllm:\n        kv_transfer_config:\n          " + STORE_BLOCK.format(i="          ")
        + "          kv_connector_extra_config:\n            mooncake_config_path: /etc/mooncake.json\n"))
    problem = at(validate_path(f, VERSION).problems, f"{f}:12 {RIGHT}.kv_connector_extra_config.mooncake_config_path")
    assert problem.severity == ERROR and "MOONCAKE_CONFIG_PATH environment variable" in problem.message
    assert "ray_kwargs.ray_init.runtime_env.env_vars.MOONCAKE_CONFIG_PATH: '/etc/mooncake.json'" in problem.fix
    assert '\'++ray_kwargs.ray_init.runtime_env.env_vars.MOONCAKE_CONFIG_PATH="/etc/mooncake.json"\'' in problem.fix


def test_mooncake_config_path_as_verl_s_doc_writes_it_on_the_command_line(tmp_path: Path) -> None:
    f = write(tmp_path, "train.sh", script(
        f"+{RIGHT}.kv_connector=MooncakeStoreConnector", f"+{RIGHT}.kv_role=kv_both",
        f"+{RIGHT}.kv_connector_extra_config.mooncake_config_path=/path/to/mooncake_config.json"))
    problem = at(validate_path(f, VERSION).problems,
                 f"{f}:5 kv_transfer_config.kv_connector_extra_config.mooncake_config_path")
    assert problem.severity == ERROR and "runtime_env.env_vars.MOONCAKE_CONFIG_PATH" in problem.fix


def test_outside_verl_the_fix_stays_vllm_s(tmp_path: Path) -> None:
    f = write(tmp_path, "launch.sh", "vllm serve m --kv-transfer-config '{\"kv_connector\": \"MooncakeStoreConnector\", "
              "\"kv_role\": \"kv_both\", \"kv_connector_extra_config\": {\"mooncake_config_path\": \"/etc/m.json\"}}'\n")
    (problem,) = [p for p in validate_path(f, VERSION).problems if p.where.endswith("mooncake_config_path")]
    assert "runtime_env" not in problem.fix and "export MOONCAKE_CONFIG_PATH=/etc/m.json" in problem.fix


# -- clean configs stay clean ----------------------------------------------------------------------------
def test_kvctl_s_rendered_verl_yaml_is_clean(tmp_path: Path) -> None:
    bundle = render(templates.load("mooncake-store"), {}, parse_version(VERSION), base_dir=tmp_path)
    f = write(tmp_path, "verl.yaml", bundle.as_format("verl"))
    report = validate_path(f, VERSION)
    assert report.kind == "verl" and but_shared_master(report.problems) == []
    assert any(found.startswith("verl at") for found in report.found)


def test_a_clean_trainer_config_is_clean(tmp_path: Path) -> None:
    f = write(tmp_path, "ppo.yaml", trainer(
        "    full_determinism: false\n    engine_kwargs:\n      vllm:\n        enable_prompt_tokens_details: true\n"
        "        kv_transfer_config:\n          " + STORE_BLOCK.format(i="          ")))
    assert but_shared_master(validate_path(f, VERSION).problems) == []


def test_ray_serve_engine_kwargs_are_not_verl_s(tmp_path: Path) -> None:
    """Ray Serve LLM takes kv_transfer_config right under engine_kwargs: verl's rule is verl's only."""
    f = write(tmp_path, "serve.yaml", "applications:\n- args:\n    llm_configs:\n    - engine_kwargs:\n"
              "        kv_transfer_config:\n          " + STORE_BLOCK.format(i="          "))
    assert not [p for p in validate_path(f, VERSION).problems if "vllm' level" in p.message]


# -- 6. a shared master: verl's own sleep and connector reset wipe it every step ---------------------
STORE_TRAINER = "    engine_kwargs:\n      vllm:\n        kv_transfer_config:\n          " + STORE_BLOCK.format(i="          ")


def shared(problems: list[Problem]) -> Problem:
    [found] = [p for p in problems if "master-wide remove_all" in p.message]
    return found


def test_a_hybrid_rollout_with_the_store_connector_wipes_a_shared_master(tmp_path: Path) -> None:
    """verl's defaults (hybrid_engine, free_cache_engine) sleep every engine each step, and verl resets the
    connector after every weight sync: on 0.23+ both are the store connector's master-wide remove_all."""
    f = write(tmp_path, "ppo.yaml", trainer(STORE_TRAINER))
    problem = shared(validate_path(f, VERSION).problems)
    assert problem.severity == WARNING and problem.where == f"{f}:4 {ROLLOUT}"
    assert "sleep(level=1 or 2) of every engine each step" in problem.message
    assert "reset_prefix_cache(reset_connector=True) after every weight sync" in problem.message
    assert "vllm_async_server.py:853-858" in problem.message and "from vLLM 0.23.0" in problem.message
    # 0.24 reads no tenant_id: a private master is the only isolation
    assert problem.fix.startswith("give each deployment its own Mooncake master") and "only isolation" in problem.fix
    assert "tenant per deployment" in shared(validate_path(f, "0.32.0").problems).fix


def test_a_non_hybrid_rollout_still_resets_the_connector(tmp_path: Path) -> None:
    """hybrid_engine false (the v1 separate_async trainer): no sleep, but the reset after each sync stays."""
    f = write(tmp_path, "ppo.yaml", trainer(STORE_TRAINER) + "  hybrid_engine: false\n")
    problem = shared(validate_path(f, VERSION).problems)
    assert "sleep(" not in problem.message and "reset_connector=True" in problem.message
    g = write(tmp_path, "train.sh", script(f"+{RIGHT}='{{kv_connector: MooncakeStoreConnector, kv_role: kv_both}}'",
                                           "actor_rollout_ref.hybrid_engine=False"))
    assert "sleep(" not in shared(validate_path(g, VERSION).problems).message


def test_no_shared_master_warning_before_0_23_or_without_the_store(tmp_path: Path) -> None:
    f = write(tmp_path, "ppo.yaml", trainer(STORE_TRAINER))
    assert not [p for p in validate_path(f, "0.22.0").problems if "master-wide" in p.message]
    g = write(tmp_path, "plain.yaml", trainer("    full_determinism: false\n"))
    assert validate_path(g, VERSION).problems == []
