"""--master-arg: the flags kvctl serve adds to the mooncake_master it starts, checked before anything starts.

The master kvctl starts listens on loopback (its admin port is unauthenticated, and its remove_all clears
every deployment) and logs into the run folder; run.json, `runs` and `status` say so. A flag may not
change that, neither given directly nor through an indirection gflags or Mooncake offers (issue 39):

- `--flagfile=FILE[,FILE...]` (gflags): read here with gflags' own rules (comments, nested flagfiles,
  sections for other programs) and replaced by the flags it holds, each checked like a --master-arg. The
  master gets the lines kvctl read, not the file: nothing can change between the check and the start,
  and a Ray node without the file gets the same flags.
- `--fromenv` / `--tryfromenv` (gflags: FLAGS_name from the environment) and Mooncake's `--config_path`
  (a JSON/YAML file of master settings) are refused: what they set is not on the command line to check.
- The address, port and HTTP metadata flags kvctl sets (a second copy wins in gflags), `--rpc_interface`
  (its IPv4 address replaces rpc_address), the deprecated `--port`; glog's flags that send the log
  elsewhere (`--nologtostderr`, `--log_dir`, `--log_link`, mail); a KV-event publisher bound beyond
  loopback without --allow-remote-admin.

gflags reads `--noNAME` as NAME=false for a boolean, and `-NAME` like `--NAME`; both are read so here.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from kvctl.errors import UsageError

# mooncake_master flags kvctl sets itself (MasterProcess; the HTTP metadata ones with --metadata http): a
# second copy would move the master off the addresses kvctl records, or beyond loopback. --rpc_interface's
# address replaces rpc_address; --port is rpc_port's old name.
OWNED_MASTER_FLAGS = ("rpc_address", "rpc_port", "metrics_host", "metrics_port", "logtostderr",
                      "enable_http_metadata_server", "http_metadata_server_port", "http_metadata_server_host",
                      "rpc_interface", "port")

# flags that read other flags from somewhere kvctl cannot check before the master starts
FROM_ELSEWHERE = {
    "fromenv": "gflags' --fromenv sets flags from FLAGS_<name> environment variables",
    "tryfromenv": "gflags' --tryfromenv sets flags from FLAGS_<name> environment variables",
    "config_path": "Mooncake's --config_path reads master settings (addresses included) from a file",
}
FROM_ELSEWHERE_FIX = ("give each setting as --master-arg=--NAME=VALUE, or put them in a gflags file and pass "
                      "--master-arg=--flagfile=FILE (kvctl reads it and checks every flag in it)")

# glog flags that send the master's log out of the run folder (kvctl logs RUN master reads it there)
LOG_ELSEWHERE = ("log_dir", "log_link", "alsologtoemail", "logmailer")

MAX_FLAGFILE_BYTES = 1 << 20
MAX_FLAGFILE_DEPTH = 8
PROGRAM = "mooncake_master"


def checked_master_args(args: list[str], allow_remote: bool = False) -> list[str]:
    """`args` as the master gets them: every flagfile replaced by its flags, every flag checked; a
    UsageError (what, where, the fix) for the first one refused."""
    out: list[str] = []
    for arg in args:
        out.extend(_checked(arg, f"--master-arg {arg}", allow_remote, ()))
    return out


def _checked(arg: str, where: str, allow_remote: bool, reading: tuple[Path, ...]) -> list[str]:
    name, has_value, value = _split(arg, where)
    names = {name, name[2:]} if name.startswith("no") else {name}
    if "flagfile" in names:
        if not has_value or not value.strip():
            raise UsageError(f"{where}: give the file as --flagfile=FILE", "give it as --master-arg=--flagfile=FILE")
        return [flag for path in value.split(",") if path.strip()
                for flag in _flagfile(path.strip(), where, allow_remote, reading)]
    for n in names:
        if n in FROM_ELSEWHERE:
            raise UsageError(f"{where}: {FROM_ELSEWHERE[n]}, which kvctl serve cannot check before the master "
                             "starts (it must stay on 127.0.0.1 and log into the run folder)", FROM_ELSEWHERE_FIX)
        if n in OWNED_MASTER_FLAGS:
            raise UsageError(f"{where}: kvctl serve sets --{n} itself (the master's addresses, ports and log "
                             "stay as run.json records them)",
                             "leave it out: use --host for the master's address; its ports are chosen free and "
                             "recorded; its log is the run folder's logs/mooncake_master.log (kvctl logs RUN master)")
        if n in LOG_ELSEWHERE:
            raise UsageError(f"{where}: --{n} would send the master's log out of the run folder (kvctl serve "
                             "keeps it in logs/mooncake_master.log, where kvctl logs and the error reports read it)",
                             f"leave --{n} out; copy the run folder's log where you need it")
    if name == "kv_events_bind_endpoint" and not allow_remote and not _loopback_endpoint(value):
        raise UsageError(f"{where} binds the master's KV-event publisher beyond loopback ({value}); it has no "
                         "authentication", "bind it to tcp://127.0.0.1:PORT or ipc://PATH, or pass "
                         "--allow-remote-admin on a network you trust")
    return [arg]


def _split(arg: str, where: str) -> tuple[str, bool, str]:
    """(name, whether '=' was given, value) of a gflags `--NAME[=VALUE]` / `-NAME[=VALUE]`."""
    body = arg[2:] if arg.startswith("--") else arg[1:] if arg.startswith("-") else None
    name, has_value, value = (body or "").partition("=")
    if body is None or not name or not name.replace("_", "").isalnum():
        raise UsageError(f"{where}: {arg!r} is not a mooncake_master flag",
                         "give it as --master-arg=--NAME=VALUE, e.g. --master-arg=--eviction_high_watermark_ratio=0.9")
    return name, bool(has_value), value


def _flagfile(given: str, where: str, allow_remote: bool, reading: tuple[Path, ...]) -> list[str]:
    """The flags of one gflags flagfile that apply to mooncake_master, each checked (gflags
    ProcessOptionsFromStringLocked: a line starting with '-' is a flag, '#' a comment, any other line a
    list of program-name globs that starts a section for the programs it matches)."""
    path = Path(given).expanduser()
    try:
        resolved = path.resolve()
        if resolved in reading:
            raise UsageError(f"{where}: {given} reads itself through --flagfile",
                             "remove the --flagfile line that names it")
        if len(reading) >= MAX_FLAGFILE_DEPTH:
            raise UsageError(f"{where}: --flagfile nested more than {MAX_FLAGFILE_DEPTH} deep at {given}",
                             "put the flags in fewer files")
        if not path.is_file():
            raise OSError("not a regular file")
        if path.stat().st_size > MAX_FLAGFILE_BYTES:
            raise OSError(f"larger than {MAX_FLAGFILE_BYTES >> 20} MiB: not a flags file")
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where}: cannot read the flagfile {given} ({exc})",
                         "give a readable gflags file, one --NAME=VALUE per line") from None
    out: list[str] = []
    relevant, in_names = True, False
    for number, raw in enumerate(text.replace("\r", "\n").split("\n"), 1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            in_names = False
            if relevant:
                out.extend(_checked(line, f"{where}: line {number} of {given}", allow_remote,
                                    (*reading, resolved)))
            continue
        if not in_names:  # a new list of programs: its flags apply only if one glob names mooncake_master
            in_names, relevant = True, False
        relevant = relevant or any(fnmatch.fnmatchcase(name, glob) for glob in line.split(" ") if glob
                                   for name in _program_names())
    return out


def _program_names() -> tuple[str, ...]:
    """What gflags matches a flagfile section's globs against: the program's name and its path."""
    from kvctl.serve.master_process import find_master_executable

    try:
        return PROGRAM, find_master_executable()
    except Exception:  # noqa: BLE001 - not installed: its name is what every section names
        return (PROGRAM,)


def _loopback_endpoint(endpoint: str) -> bool:
    """A ZMQ endpoint that stays on this machine: ipc://, inproc://, or tcp:// to a loopback address."""
    from kvctl.serve.vllm_launch import is_loopback

    scheme, _, rest = endpoint.strip().partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rpartition(":")[0].strip("[]")
    return scheme == "tcp" and bool(host) and host != "*" and is_loopback(host)
