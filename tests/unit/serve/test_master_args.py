"""--master-arg reaches a mooncake_master that kvctl serve starts on loopback: no flag, given directly or
through a gflags indirection (a --flagfile, --fromenv/--tryfromenv, Mooncake's --config_path), may move
it beyond loopback or off the addresses kvctl records, or move its log out of the run folder
(issue 39 finding 1 and its low)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvctl.errors import UsageError
from kvctl.serve.spec import ServeSpec, check_spec


def _check(tmp_path: Path, *args: str, allow_remote: bool = False) -> ServeSpec:
    spec = ServeSpec(model=str(tmp_path), master_args=list(args), allow_remote_admin=allow_remote)
    check_spec(spec)
    return spec


@pytest.mark.parametrize("lines, says", [
    ("--rpc_address=0.0.0.0\n", "sets --rpc_address"),
    ("# production\n\n  --metrics_host=0.0.0.0\n", "sets --metrics_host"),
    ("-enable_http_metadata_server=true\n--http_metadata_server_host=0.0.0.0\n", "sets --enable_http_metadata_server"),
    ("--nologtostderr\n", "sets --logtostderr"),
    ("--log_dir=/var/log/mooncake\n", "--log_dir"),
    ("--rpc_interface=eth0\n", "sets --rpc_interface"),
    ("--tryfromenv=rpc_address\n", "--tryfromenv"),
    ("--config_path=/etc/mooncake/master.json\n", "--config_path"),
    ("--kv_events_bind_endpoint=tcp://0.0.0.0:5557\n", "beyond loopback"),
    # a section for this program (gflags matches its name against the globs on a line without a dash)
    ("other_program\n--eviction_ratio=0.1\nmooncake_*\n--metrics_host=0.0.0.0\n", "sets --metrics_host"),
])
def test_a_flagfile_is_read_and_checked_like_command_line_flags(tmp_path: Path, lines: str, says: str) -> None:
    flags = tmp_path / "master.flags"
    flags.write_text("--eviction_high_watermark_ratio=0.9\n" + lines, "utf-8")
    with pytest.raises(UsageError) as caught:
        _check(tmp_path, f"--flagfile={flags}")
    assert says in caught.value.message and str(flags) in caught.value.message, caught.value.message
    assert "line " in caught.value.message and caught.value.hint


def test_a_nested_flagfile_is_checked_too(tmp_path: Path) -> None:
    inner = tmp_path / "inner.flags"
    inner.write_text("--metrics_host=0.0.0.0\n", "utf-8")
    outer = tmp_path / "outer.flags"
    outer.write_text(f"--eviction_ratio=0.1\n--flagfile={inner}\n", "utf-8")
    with pytest.raises(UsageError, match="sets --metrics_host"):
        _check(tmp_path, f"--flagfile={outer}")
    outer.write_text(f"--flagfile={outer}\n", "utf-8")  # a loop is refused, not followed forever
    with pytest.raises(UsageError, match="reads itself"):
        _check(tmp_path, f"--flagfile={outer}")


def test_a_good_flagfile_is_passed_as_the_flags_kvctl_checked(tmp_path: Path) -> None:
    """The master gets the lines kvctl read, not the file (which could change before it starts, or not
    exist on another Ray node); flags meant for another program are left out, as gflags leaves them."""
    flags = tmp_path / "master.flags"
    flags.write_text("# master\n--eviction_high_watermark_ratio=0.9\n  -default_kv_lease_ttl=7000\n"
                     "vllm\n--rpc_address=0.0.0.0\nmooncake_master\n--enable_ha\n", "utf-8")
    spec = _check(tmp_path, "--eviction_ratio=0.1", f"--flagfile={flags}", "--client_ttl=20")
    assert spec.master_args == ["--eviction_ratio=0.1", "--eviction_high_watermark_ratio=0.9",
                                "-default_kv_lease_ttl=7000", "--enable_ha", "--client_ttl=20"]
    check_spec(spec)  # checking again changes nothing
    assert spec.master_args[1] == "--eviction_high_watermark_ratio=0.9"


@pytest.mark.parametrize("arg, says", [
    ("--nologtostderr", "sets --logtostderr"),
    ("--tryfromenv=rpc_address", "--tryfromenv"),
    ("--fromenv=eviction_ratio", "--fromenv"),
    ("--config_path=master.yaml", "--config_path"),
    ("--flagfile", "--flagfile=FILE"),
    ("--log_dir=/tmp", "--log_dir"),
    ("--alsologtoemail=ops@example.com", "--alsologtoemail"),
    ("--rpc_interface=eth0", "sets --rpc_interface"),
    ("--port=50051", "sets --port"),
    ("--kv_events_bind_endpoint=tcp://*:5557", "beyond loopback"),
])
def test_indirections_and_log_moves_on_the_command_line_are_refused(tmp_path: Path, arg: str, says: str) -> None:
    with pytest.raises(UsageError) as caught:
        _check(tmp_path, arg)
    assert says in caught.value.message and caught.value.hint, caught.value.message


def test_a_missing_flagfile_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        _check(tmp_path, f"--flagfile={tmp_path / 'nope.flags'}")
    assert "nope.flags" in caught.value.message and "cannot read" in caught.value.message


def test_kv_events_on_loopback_or_with_consent_are_taken(tmp_path: Path) -> None:
    assert _check(tmp_path, "--kv_events_bind_endpoint=tcp://127.0.0.1:5557").master_args
    assert _check(tmp_path, "--kv_events_bind_endpoint=ipc:///tmp/kv.sock").master_args
    assert _check(tmp_path, "--kv_events_bind_endpoint=tcp://0.0.0.0:5557", allow_remote=True).master_args


def test_the_cli_refuses_a_flagfile_that_binds_everywhere(cli, tmp_path: Path) -> None:
    flags = tmp_path / "master.flags"
    flags.write_text("--rpc_address=0.0.0.0\n--metrics_host=0.0.0.0\n", "utf-8")
    result = cli("serve", str(tmp_path), "--state-dir", str(tmp_path / "state"), f"--master-arg=--flagfile={flags}")
    assert result.exit_code == 2 and "sets --rpc_address" in result.stderr, result.stderr
    assert not (tmp_path / "state" / "runs").exists() or not any((tmp_path / "state" / "runs").iterdir())


def test_a_flagfile_reaches_the_real_master_as_its_flags(cli, tmp_path: Path) -> None:
    """A real mooncake_master started by kvctl serve gets the flagfile's flags on its command line, and no
    --flagfile (the file can change after the check); its ports stay on loopback."""
    import psutil

    from kvctl.serve import runs
    from tests.integration.helpers import require_mooncake
    from tests.unit.serve.test_serve import gone, serve_args

    require_mooncake()
    flags = tmp_path / "master.flags"
    flags.write_text("# production\n--eviction_high_watermark_ratio=0.8\nvllm\n--metrics_host=0.0.0.0\n", "utf-8")
    result = cli(*serve_args(tmp_path, "ff", "--detach", f"--master-arg=--flagfile={flags}"))
    assert result.exit_code == 0, result.stderr
    record = runs.load("ff", tmp_path / "state")
    try:
        process = psutil.Process(record.master.process.pid)
        cmdline = process.cmdline()
        assert "--eviction_high_watermark_ratio=0.8" in cmdline and not any("flagfile" in a for a in cmdline)
        listening = {c.laddr.ip for c in process.net_connections(kind="tcp") if c.status == "LISTEN"}
        assert listening == {"127.0.0.1"}, listening
    finally:
        cli("stop", "ff", "--state-dir", str(tmp_path / "state"))
    assert gone(record)
