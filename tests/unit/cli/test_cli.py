"""The CLI as a user meets it: outputs, exit codes, errors, and nothing written on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def test_version_and_help(cli) -> None:
    from kvctl._version import __version__

    assert cli("--version").stdout.strip() == f"kvctl {__version__}"
    help_text = cli("--help").stdout
    assert "config" in help_text and "compat" in help_text


def test_config_list_json(cli) -> None:
    rows = json.loads(cli("config", "list", "--json").stdout)
    by_name = {r["name"]: r for r in rows}
    assert by_name["mooncake-store"]["connectors"] == ["MooncakeStoreConnector"]
    assert by_name["mooncake-store"]["vllm"] == ">=0.21.0"
    assert set(by_name) >= {"mooncake-store", "mooncake-store-standalone", "mooncake-pd", "mooncake-pd-store",
                            "lmcache-mooncake"}


def test_config_show(cli) -> None:
    result = cli("config", "show", "mooncake-store")
    assert result.exit_code == 0
    assert "global_segment_size" in result.stdout and "256MB" in result.stdout
    data = json.loads(cli("config", "show", "mooncake-pd", "--json").stdout)
    role = next(p for p in data["parameters"] if p["name"] == "role")
    assert role["type"] == "one of producer|consumer" and role["default"] is None


def test_render_verl_to_stdout_with_notes_on_stderr(cli) -> None:
    result = cli("config", "render", "mooncake-store", "--vllm-version", "0.21.0")
    assert result.exit_code == 0
    block = yaml.safe_load(result.stdout)["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["kv_transfer_config"]
    assert block == {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
    assert "left out mode" in result.stderr and "note" not in result.stdout


def test_render_json_pd_role(cli) -> None:
    result = cli("config", "render", "mooncake-pd", "--set", "role=consumer", "--format", "json",
                 "--vllm-version", "0.13.0")
    assert json.loads(result.stdout) == {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}


def test_render_defaults_to_newest_known_without_vllm(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kvctl.facts.capabilities import table

    monkeypatch.setattr("kvctl.facts.versions.installed_vllm", lambda: None)
    result = cli("config", "render", "mooncake-store", "--out", str(tmp_path / "b"))
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert manifest["vllm_version"] == str(table().newest_known)
    assert manifest["version_source"].startswith("newest release kvctl knows")


def test_render_out_writes_bundle_that_validates(cli, tmp_path: Path) -> None:
    out = tmp_path / "b"
    result = cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0+cpu", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert (out / "mooncake.json").exists() and "wrote 6 files" in result.stderr
    check = cli("config", "validate", str(out), "--vllm-version", "0.32.0+cpu", "--json")
    assert check.exit_code == 0, check.stdout
    assert json.loads(check.stdout)["kind"] == "bundle"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["config", "render", "no-such"], "unknown template 'no-such'"),
        (["config", "render", "mooncake-store", "--set", "bogus=1"], "has no parameter 'bogus'"),
        (["config", "render", "mooncake-store", "--set", "hash_seed=zero"], "hash_seed expects int"),
        (["config", "render", "mooncake-store", "--set", "local_buffer_size=12 parsecs"], "is not a size"),
        (["config", "render", "mooncake-store", "--set", "noequals"], "is not key=value"),
        (["config", "render", "mooncake-store", "--vllm-version", "banana"], "'banana' is not a vLLM version"),
        (["config", "render", "mooncake-store", "--vllm-version", "0.20.0"], "first appears in vLLM 0.21.0"),
        (["config", "show", "mooncake-stor"], "did you mean 'mooncake-store'"),
        (["compat", "check", "--vllm-version", "0.x"], "'0.x' is not a vLLM version"),
        (["compat", "check", "--vllm-version", "0.23.0", "--template", "nope"], "unknown template 'nope'"),
        (["compat", "check", "--vllm-version", "0.23.0", "--url", "http://127.0.0.1:9"], "not both"),
    ],
)
def test_bad_input_exits_2_with_a_specific_message(cli, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    result = cli(*args, *(["--out", str(out)] if args[:2] == ["config", "render"] else []))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_malformed_yaml_exits_2(cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kv_connector: MooncakeStoreConnector\n  kv_role: [kv_both\n")
    result = cli("config", "validate", str(bad), "--vllm-version", "0.23.0")
    assert result.exit_code == 2 and "bad.yaml" in result.stderr
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "x.yaml").write_text("name: x\n  bad: [")
    result = cli("config", "render", "x", "--template-path", str(tmp_path / "tpl"), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "not valid YAML" in result.stderr and not (tmp_path / "o").exists()


def test_validate_reports_every_problem_and_exits_1(cli, tmp_path: Path) -> None:
    cfg = tmp_path / "ktc.json"
    cfg.write_text(json.dumps({"kv_connector": "MooncakeStoreConnector", "kv_role": "both", "kv_ip": "1.2.3.4",
                               "kv_connector_extra_config": {"mooncake_config_path": "/etc/m.json"}}))
    result = cli("config", "validate", str(cfg), "--vllm-version", "0.32.0", "--json")
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    text = json.dumps(problems)
    assert "kv_role" in text and "kv_ip" in text and "mooncake_config_path" in text
    assert all(p["where"] and p["fix"] for p in problems)


def test_debug_shows_traceback(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCTL_DEBUG", "1")
    from kvctl.errors import UsageError

    with pytest.raises(UsageError):
        cli("config", "render", "no-such")


def test_compat_check_require_hard_reset(cli) -> None:
    ok = cli("compat", "check", "--vllm-version", "0.23.0", "--template", "mooncake-store", "--require", "hard-reset")
    assert ok.exit_code == 0 and "hard-reset" in ok.stdout
    old = cli("compat", "check", "--vllm-version", "0.22.0", "--template", "mooncake-store", "--require", "hard-reset")
    assert old.exit_code == 1 and "upgrade vLLM to >= 0.23.0" in old.stdout and "--master" in old.stdout
    with_master = cli("compat", "check", "--vllm-version", "0.22.0", "--require", "hard-reset", "--with-master")
    assert with_master.exit_code == 0
    lm = cli("compat", "check", "--vllm-version", "0.33.0", "--template", "lmcache-mooncake",
             "--require", "hard-reset", "--json")
    data = json.loads(lm.stdout)
    assert lm.exit_code == 1 and data["requirement_met"] is False
    assert data["operations"][1] == {"name": "external_store", "status": "silent-no-op",
                                     "detail": data["operations"][1]["detail"]}
    ancient = cli("compat", "check", "--vllm-version", "0.12.0", "--template", "mooncake-pd", "--require", "hard-reset")
    assert ancient.exit_code == 1
    # without --require the check reports and exits 0
    assert cli("compat", "check", "--vllm-version", "0.22.0").exit_code == 0


def test_compat_check_config_file(cli, tmp_path: Path) -> None:
    verl = tmp_path / "verl.yaml"
    verl.write_text(yaml.safe_dump({"actor_rollout_ref": {"rollout": {"engine_kwargs": {"vllm": {
        "kv_transfer_config": {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}}}}}}))
    result = cli("compat", "check", "--vllm-version", "0.21.0", "--config", str(verl), "--json")
    data = json.loads(result.stdout)
    assert data["layout"] == ["MooncakeStoreConnector"] and data["verdict"] == "hard-reset-with-master-clear"


def test_compat_check_without_vllm_installed(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvctl.facts.versions.installed_vllm", lambda: None)
    result = cli("compat", "check")
    assert result.exit_code == 2 and "no vLLM installed here" in result.stderr


def test_compat_matrix(cli) -> None:
    data = json.loads(cli("compat", "matrix", "--json").stdout)
    assert "0.23.0" in data["versions"]
    assert cli("compat", "matrix", "--markdown").stdout.startswith("| capability |")
    assert "MooncakeStoreConnector" in cli("compat", "matrix").stdout


# Not a speed test (that is make bench): it catches an import that would cost the time (Ray: only
# with --ray, tests/unit/serve/test_ray_fleet.py; aiohttp: only for fleets of KVCTL_FAST_HTTP_MIN_HOSTS replicas
# or more, kvctl/transport/aio.py; pydantic, ~0.1 s: Typer >= 0.26 would import it to coerce options,
# kvctl/cli/coercion.py does that for kvctl's option types).
HEAVY = ("vllm", "torch", "mooncake", "ray", "aiohttp", "pydantic")
PROBE = """
import atexit, sys
atexit.register(lambda: print("HEAVY=" + ",".join(sorted({m.split('.')[0] for m in sys.modules
                                                         if sys.modules[m] is not None} & set(%r)))))
sys.argv = ["kvctl"] + %r
from kvctl.cli.main import run
run()
"""


@pytest.mark.parametrize(("args", "code"), [
    (["--help"], 0), (["config", "render", "mooncake-store", "--format", "json"], 0), (["config", "list"], 0),
    (["compat", "check", "--vllm-version", "0.23.0"], 0), (["compat", "matrix"], 0), (["reset", "--help"], 0),
    (["reset", "--url", "http://127.0.0.1:9", "--retries", "0", "--connector"], 1),
    (["status", "--help"], 0), (["status", "--url", "http://127.0.0.1:9", "--timeout", "1"], 1),
    (["runs"], 0), (["rm", "--help"], 0), (["serve", "--help"], 0), (["stop", "--help"], 0),
    (["doctor", "--help"], 0), (["doctor"], 1),  # no vLLM in kvctl's own venv: doctor reports a failure
    (["weights", "update", "--help"], 0),
    (["weights", "update", "--from", "/ckpt", "--remote-path", "--url", "http://127.0.0.1:9", "--retries", "0"], 1),
])
def test_cli_never_imports_heavy_packages(args: list[str], code: int) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE % (HEAVY, args)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY="


def test_python_api_imports_no_cli_or_heavy_package() -> None:
    """A trainer's `kvctl.hard_reset()` pays for neither the CLI (typer, rich, pydantic) nor vLLM."""
    code = ("import sys, kvctl; kvctl.hard_reset(['http://127.0.0.1:9'], retries=0, timeout=1); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'typer', 'rich', 'pydantic', 'vllm', 'torch', 'mooncake', 'ray', 'aiohttp'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
