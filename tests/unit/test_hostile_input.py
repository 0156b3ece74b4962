"""Hostile and careless input is refused with exit 2 and a clear message (issue 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lib import REPO


def _user_template(tmp_path: Path, env_block: str) -> Path:
    folder = tmp_path / "templates"
    folder.mkdir(exist_ok=True)
    (folder / "evil.yaml").write_text(
        "name: evil\ndescription: d\nvllm: '>=0.21.0'\n"
        "kv_transfer_config: {kv_connector: MooncakeStoreConnector, kv_role: kv_both}\n" + env_block)
    return folder


def test_template_env_names_cannot_carry_shell_commands(cli, tmp_path: Path) -> None:
    folder = _user_template(tmp_path, 'env: {"PYTHONHASHSEED=0; touch /tmp/kvctl-pwned; X": "1"}\n')
    out = tmp_path / "bundle"
    result = cli("config", "render", "evil", "--template-path", str(folder), "--vllm-version", "0.32.0",
                 "--out", str(out))
    assert result.exit_code == 2
    assert "is not an environment variable name" in result.stderr and "touch" in result.stderr
    assert not out.exists() and not Path("/tmp/kvctl-pwned").exists()


def test_a_plain_env_name_still_renders(cli, tmp_path: Path) -> None:
    folder = _user_template(tmp_path, "env: {MY_VAR_2: '1'}\n")
    result = cli("config", "render", "evil", "--template-path", str(folder), "--vllm-version", "0.32.0",
                 "--format", "env")
    assert result.exit_code == 0, result.stderr
    assert "MY_VAR_2=1" in result.stdout


@pytest.mark.parametrize("seed", ["-5", "4294967296"])
def test_a_hash_seed_python_refuses_is_refused_at_render(cli, seed: str) -> None:
    result = cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0", "--set", f"hash_seed={seed}")
    assert result.exit_code == 2
    assert "PYTHONHASHSEED" in result.stderr and "0 to 4294967295" in result.stderr


@pytest.mark.parametrize("size", ["999999999999999999999999999GB", "2048TB", "\u0663\u0662MB", "2000000GB"])
def test_absurd_or_non_ascii_sizes_are_refused(cli, size: str) -> None:
    result = cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0",
                 "--set", f"global_segment_size={size}")
    assert result.exit_code == 2, result.stdout
    assert "global_segment_size" in result.stderr


@pytest.mark.parametrize("value", ["\u0663", "9" * 4400])  # an Arabic-Indic 3; more digits than int() takes
def test_non_ascii_or_endless_digits_are_not_an_int(cli, value: str) -> None:
    result = cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0", "--set", f"hash_seed={value}")
    assert result.exit_code == 2
    assert "hash_seed expects int" in result.stderr


@pytest.mark.parametrize("args", [
    ["--url", "http://alice:s3cret-pw@127.0.0.1:8000"],
    ["--url", "http://127.0.0.1:8000", "--master", "http://bob:s3cret-pw@127.0.0.1:9003"],
])
def test_credentials_in_urls_are_refused_and_never_printed(cli, args: list[str]) -> None:
    result = cli("reset", *args, "--connector", "--dry-run", "--json")
    assert result.exit_code == 2
    assert "carries credentials" in result.stderr and "***@127.0.0.1" in result.stderr
    assert "s3cret-pw" not in result.stdout + result.stderr


@pytest.mark.parametrize("args,message", [
    (["--url", "http://[::1"], "is not a URL"),
    (["--url", "http://127.0.0.1:8000", "--master", "ftp://127.0.0.1:9003"], "not an http address"),
    (["--url", "http://127.0.0.1:8000", "--master", "::1:9003"], "is not HOST:PORT"),
])
def test_unusable_addresses_are_usage_errors_not_internal_errors(cli, args: list[str], message: str) -> None:
    result = cli("reset", *args, "--dry-run")
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and "internal error" not in result.stderr


@pytest.mark.parametrize("extra,flag", [
    (["--", "--host", "0.0.0.0"], "--host"),
    (["--", "--dtype", "float32", "--host=0.0.0.0"], "--host"),
    (["--", "--port", "8000"], "--port"),
    (["--", "--kv-transfer-config", "{}"], "--kv-transfer-config"),
    # what vLLM 0.32's FlexibleArgumentParser also reads as those flags (issue 24, finding 8)
    (["--", "--kv_transfer_config={}"], "--kv_transfer_config (vLLM reads it as --kv-transfer-config)"),
    (["--", "--kv-transfer-config.kv_connector_extra_config.cache_prefix=x"], "vLLM reads it as --kv-transfer-config"),
    (["--", "--ho=0.0.0.0"], "--ho (vLLM reads it as --host)"),
    (["--", "--hos", "0.0.0.0"], "--hos (vLLM reads it as --host)"),
    (["--", "--por", "9"], "--por (vLLM reads it as --port)"),
    (["--", "--config", "{config}"], "'host' in --config"),
    (["--", "--config={config}"], "'kv_transfer_config' in --config"),
])
def test_serve_flags_after_dashdash_cannot_override_kvctls(cli, tmp_path: Path, extra: list[str], flag: str) -> None:
    """Attack: an argument vLLM's own parser reads as --host, --port, --model or --kv-transfer-config
    (underscores, dotted fields, abbreviations, a --config YAML) moved a dev-mode server off loopback.
    Must hold: refused before anything starts, naming the flag vLLM would have read."""
    state = tmp_path / "state"
    config = tmp_path / "vllm.yaml"
    config.write_text("host: 0.0.0.0\n" if "'host'" in flag else "kv_transfer_config: {}\ndtype: float32\n")
    extra = [a.replace("{config}", str(config)) for a in extra]
    result = cli("serve", str(tmp_path), "--state-dir", str(state), "--name", "x", *extra)
    assert result.exit_code == 2
    assert flag in result.stderr and "after -- would override what kvctl serve sets" in result.stderr
    assert not (state / "runs" / "x").exists()  # refused before anything started


@pytest.mark.parametrize("extra", [["--dtype", "float32"], ["--max_model_len", "256"], ["--model-impl", "vllm"],
                                   ["--served-model-name", "m"]])
def test_flags_kvctl_does_not_own_still_pass(extra: list[str]) -> None:
    from kvctl.serve.vllm_launch import owned_flags_in

    assert owned_flags_in(extra) == []


@pytest.mark.parametrize("host", ["127.evil.example", "127.0.0.1.nip.example"])
def test_a_name_that_only_looks_like_loopback_is_not_loopback(cli, tmp_path: Path, host: str) -> None:
    result = cli("serve", str(tmp_path), "--host", host, "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 2
    assert "--allow-remote-admin" in result.stderr


def test_text_that_looks_like_markup_is_printed_not_parsed(cli, tmp_path: Path) -> None:
    result = cli("config", "render", "foo[/]")
    assert result.exit_code == 2 and "foo[/]" in result.stderr and "internal error" not in result.stderr
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "m.yaml").write_text(
        "name: m\ndescription: 'a [/] b [bold]c'\nvllm: '>=0.21.0'\n"
        "parameters: {p: {type: str, default: '[/x]', help: 'h [/]'}}\n"
        "kv_transfer_config: {kv_connector: MooncakeStoreConnector, kv_role: kv_both}\n"
        "notes: ['n [/]']\n")
    for args in (["config", "list"], ["config", "show", "m"]):
        shown = cli(*args, "--template-path", str(folder))
        assert shown.exit_code == 0, shown.stderr
        assert "a [/] b [bold]c" in shown.stdout


def test_a_server_version_that_looks_like_markup_is_printed(cli) -> None:
    from tests.doubles import DoubleFleet, VllmDouble

    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.32.0"))
        fleet.replicas[0].version = "[/oops]"  # what a broken or hostile server could say
        result = cli("reset", "--url", url, "--dry-run")
    assert "internal error" not in result.stderr and "MarkupError" not in result.stderr


def test_verify_never_passes_when_the_canarys_signal_goes_missing() -> None:
    """A canary proved by cached_tokens before the reset, whose answers after it carry
    prompt_tokens_details: null: hits on the counters fail it, no hits leave it inconclusive."""
    import asyncio

    import httpx

    from kvctl.reset.plan import ResetOptions
    from kvctl.reset.verify import Canary as _Canary
    from kvctl.transport.vllm_client import VllmClient
    from tests.doubles import DoubleFleet, VllmDouble

    async def scenario(url: str, double: VllmDouble) -> tuple:
        async with VllmClient(url) as client:
            canary = await _Canary.prime(client, ResetOptions(verify=True))
            assert canary.signal == "cached_tokens" and canary.primed and canary.error is None
            double.prompt_tokens_details = False  # the server stops reporting the per-request signal
            stale = await canary.check(client)  # nothing was reset: the counters show the hit
            httpx.post(f"{url}/reset_prefix_cache", trust_env=False).raise_for_status()
            clean = await canary.check(client)  # reset for real: no hit, but no proof either
            return stale, clean

    with DoubleFleet() as fleet:
        double = VllmDouble("0.32.0")
        url = fleet.add(double)
        stale, clean = asyncio.run(scenario(url, double))
    assert stale.ok is False and "counters show" in stale.error and "stale KV survives" in stale.error
    assert clean.ok is False and clean.error.startswith("inconclusive") and "not verified" in clean.error


def test_the_readmes_deploy_recipe_works_in_a_real_shell(cli, tmp_path: Path) -> None:
    """The README's `--out` recipe, run by /bin/sh with a stand-in `vllm` that prints its argv:
    vLLM must get `--kv-transfer-config` followed by the JSON itself (no leftover quotes)."""
    import json
    import re
    import subprocess

    readme = (REPO / "README.md").read_text()
    recipe = re.search(r"^\$ ((?:source|\.) deploy/kvctl\.env && vllm serve MODEL .*)$", readme, re.M)
    assert recipe, "the README lost its deploy recipe"
    out = tmp_path / "deploy"
    assert cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0", "--out", str(out)).exit_code == 0
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "vllm").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    (bindir / "vllm").chmod(0o755)
    shell = subprocess.run(["/bin/sh", "-c", recipe.group(1)], cwd=tmp_path, capture_output=True, text=True,
                           env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert shell.returncode == 0, shell.stderr
    argv = shell.stdout.split("\0")
    assert argv[:3] == ["serve", "MODEL", "--kv-transfer-config"]
    assert json.loads(argv[3]) == json.loads((out / "kv_transfer_config.json").read_text())


def test_stop_kills_what_a_dead_replica_left_in_its_session(tmp_path: Path) -> None:
    """The replica's main process died (e.g. OOM-killed) but its child lives on (as vLLM's engine
    core would): kvctl stop finds it by the session kvctl started, and stops it."""
    import os
    import signal
    import time

    import psutil

    from kvctl.serve import procs

    script = tmp_path / "replica.sh"
    script.write_text("#!/bin/sh\nsleep 300 &\necho $! > child.pid\nwait\n")
    script.chmod(0o755)
    proc, ref = procs.spawn([str(script)], dict(os.environ), tmp_path / "r.log", "replica r0", cwd=tmp_path)
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(ref.pid, signal.SIGKILL)  # the main process dies; its child does not
    proc.wait(5)
    assert psutil.pid_exists(child)
    assert procs.stop(ref, grace=2) in ("stopped", "killed")
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the orphaned child of the dead replica is still running"
        time.sleep(0.05)
    assert procs.stop(ref) == "not running"  # idempotent


BOMB = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n")


def _quick(cli, *args: str):  # noqa: ANN202
    import time

    began = time.monotonic()
    result = cli(*args)
    assert time.monotonic() - began < 2.0, "a hostile file must be refused in well under a second"
    return result


def test_an_alias_bomb_in_a_config_is_refused_fast(cli, tmp_path: Path) -> None:
    config = tmp_path / "ktc.yaml"
    config.write_text("kv_connector: MooncakeStoreConnector\nkv_role: kv_both\nkv_connector_extra_config:\n"
                      + "".join("  " + line + "\n" for line in BOMB.splitlines()))
    result = _quick(cli, "config", "validate", str(config), "--vllm-version", "0.32.0")
    assert result.exit_code == 2 and "alias" in result.stderr and "no problems found" not in result.stdout


def test_an_alias_bomb_in_a_user_template_is_refused_fast(cli, tmp_path: Path) -> None:
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "bomb.yaml").write_text("name: bomb\ndescription: d\nvllm: '>=0.21.0'\n"
                                      "kv_transfer_config: {kv_connector: MooncakeStoreConnector, kv_role: kv_both}\n"
                                      + BOMB)
    result = _quick(cli, "config", "list", "--template-path", str(folder))
    assert result.exit_code == 2 and "alias" in result.stderr


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_deep_nesting_is_a_usage_error_not_a_recursion_error(cli, tmp_path: Path, suffix: str) -> None:
    deep = tmp_path / f"deep{suffix}"
    deep.write_text("[" * 3000 + "]" * 3000)
    result = _quick(cli, "config", "validate", str(deep), "--vllm-version", "0.32.0")
    assert result.exit_code == 2 and "internal error" not in result.stderr and "RecursionError" not in result.stderr


def test_a_huge_file_is_refused_before_it_is_parsed(cli, tmp_path: Path) -> None:
    from kvctl import yamlio

    big = tmp_path / "big.yaml"
    big.write_text("kv_connector: MooncakeStoreConnector\nkv_role: kv_both\n" + "# padding\n" * (yamlio.MAX_BYTES // 10))
    result = _quick(cli, "config", "validate", str(big), "--vllm-version", "0.32.0")
    assert result.exit_code == 2 and "more than kvctl reads" in result.stderr


def _render_out(cli, out: str):  # noqa: ANN202
    return cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0", "--out", out)


def test_out_into_a_folder_with_a_directory_where_a_file_belongs_writes_nothing(cli, tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    assert _render_out(cli, str(out)).exit_code == 0
    before = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    (out / "mooncake.json").unlink()
    (out / "mooncake.json").mkdir()  # a folder where a file belongs
    result = cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0", "--set", "hash_seed=7",
                 "--out", str(out))
    assert result.exit_code == 2 and "are not files; nothing was written" in result.stderr
    after = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    assert after == {k: v for k, v in before.items() if k != "mooncake.json"}  # all old, none new
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging files left


def test_out_edge_cases(cli, tmp_path: Path) -> None:
    import os
    import stat

    empty = _render_out(cli, "")
    assert empty.exit_code == 2 and "empty folder name" in empty.stderr
    out = tmp_path / "deploy"
    assert _render_out(cli, str(out)).exit_code == 0
    assert _render_out(cli, str(out)).exit_code == 0  # replaced in place
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert all(mode & 0o044 for mode in modes.values()), modes  # not 0600 after a replace
    assert stat.S_IMODE(out.stat().st_mode) & 0o055
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        result = _render_out(cli, str(locked))
        assert result.exit_code == 2 and "cannot write there" in result.stderr


def _names(receipt) -> dict:  # noqa: ANN001
    return {r.name: r for r in receipt.replicas}


def test_a_stuck_pause_does_not_keep_the_fleet_paused(tmp_path: Path) -> None:
    """Two replicas, one whose /pause never answers: the healthy one is resumed within about two
    pause timeouts, nothing is reset anywhere, and the stuck one is named with how to resume it."""
    import time

    import kvctl
    from tests.doubles import DoubleFleet, Faults, VllmDouble

    healthy, stuck = VllmDouble("0.32.0", name="ok"), VllmDouble("0.32.0", name="stuck",
                                                                  faults=Faults(delay={"/pause": 60}))
    with DoubleFleet() as fleet:
        a, b = fleet.add(healthy), fleet.add(stuck)
        began = time.monotonic()
        receipt = kvctl.hard_reset(urls=[a, b], connector=True, pause_timeout=1, timeout=1, whole_master=True)
        took = time.monotonic() - began
        paused_at = healthy.calls_to("/pause")[0]
        resumed_at = healthy.calls_to("/resume")[0]
    assert took < 15, f"the reset took {took:.0f} s"
    assert resumed_at.t - paused_at.t < 8  # resumed as soon as the other pause failed (2 tries x 1 s)
    assert healthy.calls_to("/reset_prefix_cache") == [] and not healthy.paused
    assert len(stuck.calls_to("/pause")) == 2  # tried at most twice
    assert receipt.exit_code != 0 and set(receipt.not_reset) == {r.name for r in receipt.replicas}
    by = _names(receipt)
    stuck_r = next(r for r in by.values() if r.url == b)
    assert "pause" in stuck_r.error and f"curl -X POST {b}/resume" in stuck_r.error
    ok_r = next(r for r in by.values() if r.url == a)
    assert "the pause failed on" in ok_r.error and "resumed at once" in ok_r.error


def test_a_pause_that_lands_late_is_undone(tmp_path: Path) -> None:
    """The /pause answers after kvctl gave up, and takes effect then (uvicorn does not cancel it):
    kvctl watches /is_paused after resuming and resumes again."""
    import kvctl
    from tests.doubles import DoubleFleet, Faults, VllmDouble

    late = VllmDouble("0.32.0", faults=Faults(delay={"/pause": 1.6}))
    with DoubleFleet() as fleet:
        url = fleet.add(late)
        receipt = kvctl.hard_reset(urls=[url], connector=True, pause_timeout=1, timeout=1, whole_master=True)
        import time
        time.sleep(1.0)  # any pause still in flight would land by now
        assert late.paused is False
    assert receipt.exit_code != 0
    assert "may be left paused" in receipt.replicas[0].error  # said, since a timed-out pause can land later


def test_a_replica_its_owner_paused_stays_paused() -> None:
    import kvctl
    from tests.doubles import DoubleFleet, VllmDouble

    owned = VllmDouble("0.32.0")
    owned.paused = True  # paused by whoever runs it, before the reset
    with DoubleFleet() as fleet:
        url = fleet.add(owned)
        receipt = kvctl.hard_reset(urls=[url], connector=True, whole_master=True)
        assert owned.paused is True
        assert owned.calls_to("/resume") == [] and owned.calls_to("/pause") == []
    pause = next(o for o in receipt.replicas[0].ops if o.op == "pause")
    assert pause.result == "skipped" and "already paused by its owner" in (pause.detail or "")
    assert receipt.replicas[0].reset is True


@pytest.mark.parametrize("flag,value", [("--timeout", "nan"), ("--pause-timeout", "nan"), ("--pause-timeout", "0")])
def test_timeouts_that_are_not_positive_numbers_are_refused(cli, flag: str, value: str) -> None:
    result = cli("reset", "--url", "http://127.0.0.1:9", flag, value, "--dry-run")
    assert result.exit_code == 2 and "must be > 0" in result.stderr


def test_a_binary_inventory_is_a_usage_error(cli, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_bytes(b"\xff\xfe\x00\x01binary\x80\x81")
    result = cli("reset", "--inventory", str(inv), "--dry-run")
    assert result.exit_code == 2 and "not a text file" in result.stderr


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/?x=1", "http://127.0.0.1:8000#f"])
def test_urls_with_a_path_or_query_are_refused_not_mangled(cli, url: str) -> None:
    result = cli("reset", "--url", url, "--dry-run")
    assert result.exit_code == 2 and "has a path or query" in result.stderr and "http://127.0.0.1:8000" in result.stderr


def test_a_bad_tensor_parallel_size_is_refused_before_anything_starts(cli, tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = cli("serve", str(tmp_path), "--state-dir", str(state), "--name", "tp", "--",
                 "--tensor-parallel-size", "abc")
    assert result.exit_code == 2 and "not a whole number" in result.stderr
    assert not (state / "runs" / "tp").exists()


def test_a_run_name_with_a_trailing_newline_is_refused(cli, tmp_path: Path) -> None:
    result = cli("serve", str(tmp_path), "--state-dir", str(tmp_path / "state"), "--name", "rl\n")
    assert result.exit_code == 2 and "is not usable" in result.stderr
    assert not (tmp_path / "state" / "runs").exists() or list((tmp_path / "state" / "runs").iterdir()) == []


def test_relative_paths_work_with_serve(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from kvctl.serve import runs
    from tests.unit.serve.test_serve import fake_python, require_mooncake

    require_mooncake()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    result = cli("serve", "model", "--vllm-python", str(fake_python(tmp_path)), "--state-dir", "./state",
                 "--name", "rel", "--detach", "--health-timeout", "60")
    assert result.exit_code == 0, result.stderr
    record = runs.load("rel", tmp_path / "state")
    try:
        assert Path(record.dir).is_absolute() and record.model == str(tmp_path / "model")
        launch = json.loads((Path(record.dir) / "replicas" / "r0" / "tmp" / "launch.json").read_text())
        assert launch["argv"][launch["argv"].index("--model") + 1] == str(tmp_path / "model")
    finally:
        assert cli("stop", "--run", "rel", "--state-dir", "./state").exit_code == 0


def test_a_version_beyond_the_newest_known_gets_a_caveat(cli) -> None:
    result = cli("compat", "check", "--vllm-version", "99.0.0", "--template", "mooncake-store", "--json")
    import json

    caveats = json.loads(result.stdout)["caveats"]
    assert any("newer than" in c and "assumes" in c for c in caveats)


def test_an_empty_vllm_version_is_an_error_everywhere(cli) -> None:
    for args in (["config", "render", "mooncake-store"], ["compat", "check", "--template", "mooncake-store"]):
        result = cli(*args, "--vllm-version", "")
        assert result.exit_code == 2, (args, result.stdout)


def test_a_yaml_integer_of_thousands_of_digits_is_a_usage_error(cli, tmp_path: Path) -> None:
    config = tmp_path / "ktc.yaml"
    config.write_text("kv_connector: MooncakeStoreConnector\nkv_role: kv_both\nkv_rank: " + "9" * 5000 + "\n")
    result = cli("config", "validate", str(config), "--vllm-version", "0.13.0")
    assert result.exit_code == 2 and "internal error" not in result.stderr


def test_serve_prints_a_vllm_python_path_that_looks_like_markup(cli, tmp_path: Path) -> None:
    from tests.unit.serve.test_serve import fake_python, require_mooncake

    require_mooncake()
    odd = tmp_path / "env[red]x"
    odd.mkdir()
    python = fake_python(odd)
    (tmp_path / "model").mkdir()
    result = cli("serve", str(tmp_path / "model"), "--vllm-python", str(python), "--state-dir",
                 str(tmp_path / "state"), "--name", "odd", "--detach", "--health-timeout", "60")
    try:
        assert result.exit_code == 0, result.stderr
        assert "env[red]x" in result.stderr  # printed as is, not read as a style
    finally:
        cli("stop", "--run", "odd", "--state-dir", str(tmp_path / "state"))


# -- cache_prefix: the scope of every clear on a shared master (issue 24, findings 1, 2 and 10) -----------
BAD_PREFIXES = [("", "is empty"), ("rl@eval", "contains '@'"), ("rl\nx", "whitespace or control"),
                ("a b", "whitespace or control")]


def _shared_master(doubles_fleet) -> tuple[str, object]:
    """A master double holding another deployment's keys (and one of 'rl@eval', which a clear scoped to
    'rl' must never take)."""
    from tests.doubles import MasterDouble, SharedStore

    store = SharedStore(["other@model@tp_rank:0@h1", "other@model@tp_rank:0@h2", "rl@eval@model@tp_rank:0@h3"])
    return doubles_fleet.add_master(MasterDouble(store)), store


@pytest.mark.parametrize(("prefix", "why"), BAD_PREFIXES)
def test_an_unusable_cache_prefix_in_an_inventory_is_refused_and_clears_nothing(cli, tmp_path: Path,
                                                                                prefix: str, why: str) -> None:
    """Attack: `cache_prefix: ""` was planned as a scoped clear, then ran the master-wide remove_all and
    removed another deployment's keys ("scope: scoped", exit 0); '@' in a prefix lets 'rl' take 'rl@eval''s
    keys. Must hold: the inventory is refused (exit 2) before anything is sent; every key survives."""
    import json

    from tests.doubles import DoubleFleet, Faults, VllmDouble

    with DoubleFleet() as fleet:
        master, store = _shared_master(fleet)
        # vLLM 0.22's store connector clears nothing itself, so kvctl clears the master; the connector
        # comes from the inventory because /server_info fails (the audit's reproduction)
        url = fleet.add(VllmDouble("0.22.0", faults=Faults(status={"/server_info": 500})))
        inventory = tmp_path / "fleet.yaml"
        inventory.write_text(f"master: {master}\nmaster_rpc: 127.0.0.1:50051\ncache_prefix: {json.dumps(prefix)}\n"
                             f"replicas: [{{url: '{url}', connector: MooncakeStoreConnector}}]\n")
        result = cli("reset", "--inventory", str(inventory), "--connector", "--json")
        assert result.exit_code == 2, result.stdout
        assert "cache_prefix" in result.stderr and why in result.stderr
        assert len(store) == 3
        assert not [c for c in fleet.replicas[0].calls if c.method == "POST"]


@pytest.mark.parametrize(("prefix", "why"), BAD_PREFIXES)
def test_an_unusable_cache_prefix_is_refused_by_render_serve_and_validate(cli, tmp_path: Path,
                                                                           prefix: str, why: str) -> None:
    """The same check at every entry point that makes or reads a prefix: `config render --set`,
    `serve --set` (before anything starts: no run folder), and `config validate` of a config file."""
    import json

    rendered = cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0", "--set",
                   f"cache_prefix={prefix}", "--format", "json")
    assert rendered.exit_code == 2 and why in rendered.stderr and rendered.stdout == ""
    state = tmp_path / "state"
    served = cli("serve", str(tmp_path), "--state-dir", str(state), "--name", "p", "--set", f"cache_prefix={prefix}")
    assert served.exit_code == 2 and why in served.stderr
    assert not (state / "runs" / "p").exists()
    config = tmp_path / "ktc.json"
    config.write_text(json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "connectors": [{"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cache_prefix": prefix}}]}}))
    checked = cli("config", "validate", str(config), "--vllm-version", "0.32.0", "--json")
    assert checked.exit_code == 1
    problems = json.loads(checked.stdout)["problems"] if "problems" in json.loads(checked.stdout) else \
        [p for f in json.loads(checked.stdout).get("files", []) for p in f.get("problems", [])]
    assert any("cache_prefix" in (p.get("path") or p.get("where") or "") and why in p["message"] for p in problems), problems


def test_a_run_record_with_an_unusable_cache_prefix_is_refused(cli, tmp_path: Path) -> None:
    """A run folder edited by hand (or by another tool): its record's cache_prefix is checked as an
    inventory's is, so `reset --run` cannot turn it into a master-wide clear."""
    from kvctl.serve.runs import MasterRecord, ReplicaRecord, RunRecord, runs_dir
    from tests.doubles import DoubleFleet, VllmDouble

    with DoubleFleet() as fleet:
        master, store = _shared_master(fleet)
        url = fleet.add(VllmDouble())
        folder = runs_dir(tmp_path / "state") / "rl"
        folder.mkdir(parents=True)
        RunRecord(name="rl", dir=str(folder), state="running", created=0.0, template="mooncake-store",
                  parameters={}, model="m", host="127.0.0.1", vllm={},
                  master=MasterRecord(embedded=False, rpc_address="127.0.0.1:50051", admin_address=master),
                  replicas=[ReplicaRecord(name="replica-0", url=url, port=int(url.rsplit(":", 1)[1]))],
                  cache_prefix="").save()
        result = cli("reset", "--run", "rl", "--state-dir", str(tmp_path / "state"), "--connector")
        assert result.exit_code == 2, result.stdout + result.stderr
        assert "run rl's record" in result.stderr and "is empty" in result.stderr
        assert len(store) == 3


def test_a_scoped_clear_never_falls_back_to_a_master_wide_remove_all() -> None:
    """Defence in depth: whatever built the plan, a clear planned as scoped without a prefix to scope by
    raises and removes nothing (it used to run POST /api/v1/remove_all?force=true)."""
    import asyncio
    from types import SimpleNamespace

    from kvctl.reset.master import _remove
    from kvctl.transport.master_admin import MasterAdmin, MasterError
    from tests.doubles import DoubleFleet

    with DoubleFleet() as fleet:
        master, store = _shared_master(fleet)
        plan = SimpleNamespace(master_clear_scope="scoped", options=SimpleNamespace(clear_timeout=1.0))

        async def clear() -> None:
            async with MasterAdmin(master, timeout=2) as admin:
                await _remove(admin, plan, None, "127.0.0.1:50051")  # type: ignore[arg-type]

        with pytest.raises(MasterError, match="no cache_prefix to scope by"):
            asyncio.run(clear())
        assert len(store) == 3 and not fleet.masters[0].calls_to("/api/v1/remove_all")


def test_a_plain_prefix_is_still_accepted_everywhere(cli, tmp_path: Path) -> None:
    rendered = cli("config", "render", "mooncake-store", "--vllm-version", "0.32.0", "--set",
                   "cache_prefix=rl-run.7:a_b", "--format", "json")
    assert rendered.exit_code == 0, rendered.stderr and '"cache_prefix": "rl-run.7:a_b"' in rendered.stdout


# -- signals (issue 24, finding 4) ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"])
def test_any_signal_mid_reset_resumes_the_fleet_and_the_receipt_says_so(name: str) -> None:
    """Attack: SIGTERM (what `timeout`, CI cancellation, systemd and Kubernetes send) during
    `kvctl reset --pause` left every replica paused; only SIGINT resumed them; Ctrl-\\ (SIGQUIT, issue 39)
    still did. Must hold, for each of SIGINT, SIGTERM, SIGHUP and SIGQUIT: kvctl resumes what it paused, prints a receipt that says it was
    interrupted (nothing counted as reset), and exits 128 + the signal's number."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from tests.doubles import DoubleFleet, Faults, VllmDouble

    replica = VllmDouble("0.32.0", faults=Faults(delay={"/reset_prefix_cache": 30}))
    with DoubleFleet() as fleet:
        url = fleet.add(replica)
        proc = subprocess.Popen([sys.executable, "-m", "kvctl", "reset", "--url", url, "--connector", "--pause",
                                 "--whole-master", "--json", "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not (replica.paused and replica.calls_to("/reset_prefix_cache")) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert replica.paused, "the reset never paused the replica"
            proc.send_signal(getattr(signal, name))
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 128 + int(getattr(signal, name)), err
        receipt = json.loads(out)
        assert not replica.paused and replica.calls_to("/resume")
        assert receipt["ok"] is False and f"interrupted by {name}" in receipt["summary"]
        assert "every replica kvctl paused was resumed" in receipt["summary"]
        (row,) = receipt["replicas"]
        assert row["reset"] is False and "resumed" in row["error"]
        assert [o["result"] for o in row["ops"] if o["op"] == "resume"] == ["ok"]


def test_an_absurd_replica_count_is_refused_at_once(cli, tmp_path: Path) -> None:
    """Attack: `kvctl serve --replicas 100000` spun forever looking for free ports. Must hold: refused
    before anything starts, with the cap and how to go past it."""
    import time

    began = time.monotonic()
    result = cli("serve", str(tmp_path), "--state-dir", str(tmp_path / "state"), "--name", "big",
                 "--replicas", "100000")
    assert result.exit_code == 2 and "at most 1024 replicas per run" in result.stderr
    assert time.monotonic() - began < 10 and not (tmp_path / "state" / "runs" / "big").exists()


def test_the_free_port_search_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that keeps handing out the same port (or none) ends in an error, not a loop."""
    from kvctl.errors import UsageError
    from kvctl.serve import local
    from kvctl.serve.spec import ServeSpec

    monkeypatch.setattr(local, "free_port", lambda host: 40000)
    with pytest.raises(UsageError, match="found only 1 free port"):
        local._replica_ports(ServeSpec(model="m", replicas=3))


def test_a_runs_logs_are_readable_by_its_owner_only(cli, tmp_path: Path) -> None:
    """Attack: replica logs were 0644 in 0755 folders while vLLM logs its command line (an --api-key
    after `--` included): anyone on the machine could read the key. Must hold: the run folder is 0700,
    every log 0600."""
    import stat

    from kvctl.serve import runs
    from tests.unit.serve.test_serve import fake_python, require_mooncake

    require_mooncake()
    (tmp_path / "model").mkdir()
    state = tmp_path / "state"
    result = cli("serve", str(tmp_path / "model"), "--vllm-python", str(fake_python(tmp_path)), "--state-dir",
                 str(state), "--name", "priv", "--detach", "--health-timeout", "60", "--", "--api-key", "s3cret")
    assert result.exit_code == 0, result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    record = runs.load("priv", state)
    try:
        assert stat.S_IMODE(Path(record.dir).stat().st_mode) == 0o700
        logs = [Path(r.log) for r in record.replicas] + [Path(record.master.log)]  # type: ignore[union-attr]
        assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs), \
            {str(p): oct(p.stat().st_mode) for p in logs}
    finally:
        assert cli("stop", "--run", "priv", "--state-dir", str(state)).exit_code == 0


@pytest.mark.parametrize("args", [
    ["status", "--url", "http://127.0.0.1:1/some/path", "--json"],
    ["reset", "--url", "http://user:pw@127.0.0.1:1", "--json"],
    ["compat", "check", "--vllm-version", "banana", "--json"],
    ["probe", "--url", "127.0.0.1:1", "--prompts", "/nonexistent/prompts.txt", "--json"],
    ["status", "--run", "no-such-run", "--state-dir", "/nonexistent/kvctl-state", "--json"],
])
def test_a_refused_json_command_says_so_on_stdout(cli, args: list[str]) -> None:
    """Attack (careless): a script reading `--json` output got an empty stdout on every refused command
    but `config validate`. Must hold: one JSON error object on stdout (ok false, the exit code, the
    message and its fix), the human message on stderr, and nothing secret in either."""
    import json

    result = cli(*args)
    assert result.exit_code == 2, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["exit_code"] == 2 and data["error"]["message"]
    assert "error:" in result.stderr and "pw" not in result.stdout + result.stderr


@pytest.mark.parametrize("urls", [["localhost:8000", "127.0.0.1:8000"], ["127.0.0.1:041001", "127.0.0.1:41001"],
                                  ["http://[::1]:8000", "http://[0:0::1]:8000"], ["HOST.example:80", "host.example"]])
def test_one_server_listed_twice_under_two_spellings_is_refused(cli, urls: list[str]) -> None:
    """Attack: `localhost` vs `127.0.0.1`, a port with a leading zero: the same replica listed twice got
    two resets at once (and two canaries that see each other's hits). Must hold: refused, naming both."""
    args = [a for u in urls for a in ("--url", u)]
    result = cli("reset", *args, "--dry-run")
    assert result.exit_code == 2 and "listed twice" in result.stderr
    if urls[0] != urls[1].lower():
        assert "the same server" in result.stderr or "041001" in urls[0]


def test_a_repeated_key_in_an_inventory_is_refused(cli, tmp_path: Path) -> None:
    """Attack: a second `replicas:` key kept only the last list (PyYAML), silently dropping replicas
    from the reset. Must hold: refused with the key and its line."""
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("replicas: [{url: '127.0.0.1:1'}]\nmaster: 127.0.0.1:9003\nreplicas: [{url: '127.0.0.1:2'}]\n")
    result = cli("reset", "--inventory", str(inventory), "--dry-run")
    assert result.exit_code == 2 and "'replicas' at line 3 is repeated" in result.stderr


def test_a_server_answering_an_empty_200_everywhere_does_not_verify_a_reset(cli) -> None:
    """Attack: --master pointed at something that answers every request with an empty 200 (a catch-all
    proxy, a wrong port): its empty key list counted as "0 keys, verified". Must hold: not verified,
    saying why; exit non-zero. The plan asks the address first (GET /metrics has no master_key_count):
    refused before anything is sent."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.doubles import DoubleFleet, VllmDouble

    class EmptyEverywhere(BaseHTTPRequestHandler):
        """TEST DOUBLE of a catch-all HTTP server: 200 with an empty body to every GET and POST."""

        def _empty(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _empty

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), EmptyEverywhere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with DoubleFleet() as fleet:
            url = fleet.add(VllmDouble("0.32.0"))  # clears its store itself: kvctl only counts the keys
            result = cli("reset", "--url", url, "--master", f"127.0.0.1:{server.server_port}", "--connector",
                         "--verify", "--json")
        data = json.loads(result.stdout)
        assert result.exit_code == 1, data["summary"]
        assert "is not a Mooncake master's admin port: its GET /metrics has no master_key_count" in data["plan"]["error"]
        assert data["master"] is None or data["master"]["verified"] is not True
    finally:
        server.shutdown()


def test_two_resets_of_one_replica_at_once_are_refused(tmp_path: Path) -> None:
    """Attack (careless): two `kvctl reset --pause` on one fleet at once: the second took the first's
    pause for the owner's, reset unpaused and left the replica to the first. Must hold: while one reset
    runs, a second one of any of its replicas is refused with nothing sent, naming the holder; after
    it, a reset runs as usual."""
    import subprocess
    import sys
    import time

    import kvctl
    from tests.doubles import DoubleFleet, Faults, VllmDouble

    replica = VllmDouble("0.32.0", faults=Faults(delay={"/reset_prefix_cache": 3}))
    with DoubleFleet() as fleet:
        url = fleet.add(replica)
        first = subprocess.Popen([sys.executable, "-m", "kvctl", "reset", "--url", url, "--connector", "--pause",
                                  "--whole-master"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not replica.calls_to("/reset_prefix_cache") and time.monotonic() < deadline:
                time.sleep(0.05)
            calls = len(replica.calls)
            second = kvctl.hard_reset(urls=[url], connector=True, whole_master=True)
            assert second.exit_code == 1 and "being reset by another kvctl" in second.summary
            assert not [c for c in replica.calls[calls:] if c.method == "POST"]  # nothing sent by the second
        finally:
            assert first.wait(timeout=60) == 0
        assert not replica.paused
        assert kvctl.hard_reset(urls=[url], connector=True, whole_master=True).exit_code == 0


def test_a_clear_that_says_it_removed_nothing_is_judged_by_counting_and_said(cli) -> None:
    """Mooncake's remove_all answers success with removed_count 0 for a tenant it does not know, and
    keeps every key. Must hold: the reset is not called complete while the keys remain, and the receipt
    says what kvctl saw (a note), and why keys survived (its master error)."""
    import json

    from aiohttp import web

    from tests.doubles import DoubleFleet, MasterDouble, SharedStore, VllmDouble

    class RemovesNothing(MasterDouble):
        """TEST DOUBLE of a master whose remove_all answers success, removed_count 0, and keeps every key."""

        async def _route(self, request: web.Request, call):  # noqa: ANN001, ANN202
            if (request.method, request.path) == ("POST", "/api/v1/remove_all"):
                return web.json_response({"success": True, "removed_count": 0})
            return await super()._route(request, call)

    store = SharedStore(["k1", "k2"])
    with DoubleFleet() as fleet:
        url = fleet.add(VllmDouble("0.22.0", store=store))  # vLLM 0.22 clears nothing: kvctl clears the master
        master = fleet.add_master(RemovesNothing(store))
        result = cli("reset", "--url", url, "--master", master, "--connector", "--whole-master", "--clear-timeout", "1",
                     "--json")
    data = json.loads(result.stdout)
    assert result.exit_code != 0 and len(store) == 2
    assert any("reported 0 keys removed although 2 were there" in n for n in data["master"]["notes"])
    assert "survived" in data["master"]["remaining"] and data["master"]["clear"]["result"] == "failed"


def test_a_signal_mid_probe_ends_it_cleanly() -> None:
    """The same signal path for kvctl probe (issue 24, finding 4): SIGTERM during a probe ends it with a
    JSON object that says so and exit 143, not a silent kill."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from tests.doubles import DoubleFleet, Faults, VllmDouble

    replica = VllmDouble("0.32.0", faults=Faults(delay={"/v1/completions": 30}))
    with DoubleFleet() as fleet:
        url = fleet.add(replica)
        proc = subprocess.Popen([sys.executable, "-m", "kvctl", "probe", "--url", url, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not replica.calls_to("/v1/completions") and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 143, err
    data = json.loads(out)
    assert data["ok"] is False and data["interrupted"] == "SIGTERM"
