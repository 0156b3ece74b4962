"""Shell completion (`kvctl --install-completion`): template and run names complete in bash, zsh
and fish, through the real console script and the protocol each shell's completion script uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KVCTL = [sys.executable, "-m", "kvctl"]


def complete(shell: str, line: str, tmp_path: Path, **env: str) -> list[str]:
    """What kvctl offers for `line` (ending where <TAB> was pressed), as `shell` would ask it."""
    words = line.split(" ")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("_KVCTL", "KVCTL_"))}
    base.update(HOME=str(tmp_path), KVCTL_STATE_DIR=str(tmp_path / "state"), **env)
    if shell == "bash":
        base.update(_KVCTL_COMPLETE="complete_bash", COMP_WORDS=line, COMP_CWORD=str(len(words) - 1))
    else:
        base.update(_KVCTL_COMPLETE=f"complete_{shell}", _TYPER_COMPLETE_ARGS=line,
                    _TYPER_COMPLETE_FISH_ACTION="get-args")
    # the console script's name is what Typer keys the protocol on
    proc = subprocess.run([str(Path(sys.executable).parent / "kvctl")], env=base, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    if shell == "zsh":  # _arguments '*: :(("name" "name"))'
        # a value's ':' comes escaped (\\: in the script's quoting), as _describe-style specs need
        words = out.split("((", 1)[-1].split("))", 1)[0].split() if "((" in out else []
        return [w.strip('"').replace("\\\\:", ":") for w in words]
    return [w.split("\t")[0].split(":::")[0] for w in out.split() if w]


def make_run(state: Path, name: str) -> None:
    folder = state / "runs" / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"name": name}))


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_template_names_complete(shell: str, tmp_path: Path) -> None:
    assert sorted(complete(shell, "kvctl config show mooncake-st", tmp_path)) == [
        "mooncake-store", "mooncake-store-standalone"]
    assert "lmcache-mooncake" in complete(shell, "kvctl config render ", tmp_path)
    assert sorted(complete(shell, "kvctl compat check --template mooncake-pd", tmp_path)) == [
        "mooncake-pd", "mooncake-pd-store"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_run_names_complete(shell: str, tmp_path: Path) -> None:
    for name in ("rl-a", "rl-b", "svc"):
        make_run(tmp_path / "state", name)
    (tmp_path / "state" / "runs" / "not-a-run").mkdir()  # no run.json: not offered
    assert sorted(complete(shell, "kvctl reset --run rl", tmp_path)) == ["rl-a", "rl-b"]
    assert sorted(complete(shell, "kvctl status --run ", tmp_path)) == ["rl-a", "rl-b", "svc"]
    assert sorted(complete(shell, "kvctl rm rl-a s", tmp_path)) == ["svc"]
    assert complete(shell, "kvctl serve m --template mooncake-store-s", tmp_path) == ["mooncake-store-standalone"]


def test_user_templates_complete_and_a_broken_path_completes_nothing(tmp_path: Path) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    (user / "my-store.yaml").write_text("name: my-store\n")
    assert complete("bash", "kvctl config show my", tmp_path, KVCTL_TEMPLATE_PATH=str(user)) == ["my-store"]
    # a template path that is not a folder: no traceback into the prompt, no candidates
    assert complete("bash", "kvctl config show my", tmp_path, KVCTL_TEMPLATE_PATH=str(tmp_path / "nope")) == []


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_show_and_install_completion(shell: str, tmp_path: Path) -> None:
    # Typer's own switch: the flags then take the shell's name instead of detecting the running one
    env = {**os.environ, "HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    shown = subprocess.run([*KVCTL, "--show-completion", shell], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "_KVCTL_COMPLETE" in shown.stdout and "kvctl" in shown.stdout
    rc_file = {"bash": ".bashrc", "zsh": ".zshrc", "fish": ".config/fish/completions/kvctl.fish"}[shell]
    if shell != "fish":
        (tmp_path / rc_file).write_text("# user's own\n")
    done = subprocess.run([*KVCTL, "--install-completion", shell], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    script = {"bash": ".bash_completions/kvctl.sh", "zsh": ".zfunc/_kvctl", "fish": rc_file}[shell]
    assert "_KVCTL_COMPLETE" in (tmp_path / script).read_text()
    if shell != "fish":  # the shell's rc file: appended to, nothing of the user's lost
        assert (tmp_path / rc_file).read_text().startswith("# user's own\n")


def recorded_run(state: Path, name: str, run_state: str, replicas: int, *, embedded: bool = True,
                 port: int = 8000) -> list[str]:
    """A run.json as kvctl serve writes it (kvctl.serve.runs.RunRecord); the replicas' URLs."""
    from kvctl.serve import runs

    folder = state / "runs" / name
    record = runs.RunRecord(
        name=name, dir=str(folder), state=run_state, created=1.0, template="mooncake-store", parameters={},
        model="m", host="127.0.0.1", vllm={}, master=runs.MasterRecord(embedded, "127.0.0.1:50051", None),
        replicas=[runs.ReplicaRecord(f"r{i}", f"http://127.0.0.{len(name)}:{port + i}", port + i) for i in range(replicas)])
    record.save()
    return [r.url for r in record.replicas]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_logs_completes_runs_then_their_processes(shell: str, tmp_path: Path) -> None:
    recorded_run(tmp_path / "state", "rl", "running", 2)
    recorded_run(tmp_path / "state", "ext", "stopped", 1, embedded=False)
    assert complete(shell, "kvctl logs r", tmp_path) == ["rl"]
    assert complete(shell, "kvctl logs rl ", tmp_path) == ["r0", "r1", "master"]
    assert complete(shell, "kvctl logs rl m", tmp_path) == ["master"]
    assert complete(shell, "kvctl logs ext ", tmp_path) == ["r0"]  # an external master has no log here
    assert complete(shell, "kvctl logs nope ", tmp_path) == []
    other = tmp_path / "other"  # --state-dir given before RUN: that folder's runs
    recorded_run(other, "svc", "running", 1)
    assert complete(shell, f"kvctl logs --state-dir {other} svc ", tmp_path) == ["r0", "master"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_set_completes_the_chosen_templates_keys(shell: str, tmp_path: Path) -> None:
    from kvctl.config.templates import load

    default = load("mooncake-store").parameters  # serve's default --template
    assert sorted(complete(shell, "kvctl serve m --set ", tmp_path)) == sorted(f"{k}=" for k in default)
    lmcache = load("lmcache-mooncake").parameters
    assert sorted(complete(shell, "kvctl serve m --template lmcache-mooncake --set ", tmp_path)) == sorted(
        f"{k}=" for k in lmcache)
    assert sorted(complete(shell, "kvctl config render lmcache-mooncake --set ", tmp_path)) == sorted(
        f"{k}=" for k in lmcache)
    assert complete(shell, "kvctl serve m --set glo", tmp_path) == ["global_segment_size="]
    protocol = default["protocol"]
    assert protocol.type == "choice"
    assert complete(shell, "kvctl serve m --set protocol=", tmp_path) == [f"protocol={c}" for c in protocol.choices]
    assert complete(shell, "kvctl config render no-such-template --set ", tmp_path) == []


def test_set_completes_a_user_templates_keys(tmp_path: Path) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    (user / "my-store.yaml").write_text(
        "name: my-store\ndescription: d\nkv_transfer_config: {kv_connector: X, kv_role: kv_both}\n"
        "parameters:\n  size: {type: int, default: 1, help: h}\n  mode: {type: choice, choices: [a, b], default: a, help: h}\n")
    got = complete("bash", f"kvctl serve m --template-path {user} --template my-store --set ", tmp_path)
    assert sorted(got) == ["mode=", "size="]
    assert complete("bash", "kvctl serve m --template my-store --set mode=", tmp_path,
                    KVCTL_TEMPLATE_PATH=str(user)) == ["mode=a", "mode=b"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_url_completes_the_replica_urls_of_live_runs(shell: str, tmp_path: Path) -> None:
    live = recorded_run(tmp_path / "state", "rl", "running", 2)
    starting = recorded_run(tmp_path / "state", "svc", "starting", 1)
    recorded_run(tmp_path / "state", "gone", "stopped", 1)  # a stopped run's URLs answer nothing
    assert sorted(complete(shell, "kvctl reset --url ", tmp_path)) == sorted(live + starting)
    assert complete(shell, "kvctl status --url http://127.0.0.2:8001", tmp_path) == [live[1]]
    # typed as host:port (what --url also takes): completed as host:port
    assert complete(shell, "kvctl probe --url 127.0.0.3:", tmp_path) == [starting[0].split("://")[1]]
    assert complete(shell, "kvctl compat check --url http", tmp_path) == sorted(live + starting)


def test_completion_is_fast_and_never_fails_on_a_bad_state_dir(tmp_path: Path) -> None:
    import time

    state = tmp_path / "state"
    for i in range(50):
        recorded_run(state, f"run{i:02d}", "running", 4, port=9000 + 4 * i)
    began = time.perf_counter()
    assert len(complete("bash", "kvctl reset --url ", tmp_path)) == 200
    elapsed = time.perf_counter() - began
    # one <TAB>: kvctl's start-up plus reading 50 small run.json files (about 0.3 s here; a generous bound)
    assert elapsed < 5, elapsed
    (state / "runs" / "run00" / "run.json").write_text("{not json")
    assert len(complete("bash", "kvctl reset --url ", tmp_path)) == 196
    assert complete("bash", "kvctl logs run00 ", tmp_path) == []


HOSTILE = ["evil$(touch pwned)", "a;rm -rf x", "two\nlines", "esc\x1b[31mred", "-rf", "sp ace", "`id`", "q'uote",
           "glob*", "c1\x9bx", "bidi\u202ex", "back\\slash", "a|b", "x>y"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_offers_no_hostile_name(shell: str, tmp_path: Path) -> None:
    """Issue 39 (low): a run folder, a user template file, a recorded replica name or URL with control
    characters, a newline or shell metacharacters was offered raw, inserted into the command line as
    typed; only names kvctl could have made (and that paste safely) are offered."""
    state = tmp_path / "state"
    for name in [*HOSTILE, "ok-run"]:
        make_run(state, name)
    assert complete(shell, "kvctl status --run ", tmp_path) == ["ok-run"]
    assert complete(shell, "kvctl logs ", tmp_path) == ["ok-run"]
    folder = state / "runs" / "rl"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({
        "name": "rl", "state": "running", "master": {"embedded": True},
        "replicas": [{"name": "r0", "url": "http://127.0.0.1:8000"}]
        + [{"name": n, "url": f"http://127.0.0.1:9/{n}"} for n in HOSTILE]}))
    assert complete(shell, "kvctl logs rl ", tmp_path) == ["r0", "master"]
    # "-rf" inside a URL is one plain word: harmless there
    assert complete(shell, "kvctl reset --url ", tmp_path) == ["http://127.0.0.1:8000", "http://127.0.0.1:9/-rf"]
    user = tmp_path / "templates"
    user.mkdir()
    for name in [*HOSTILE[:4], "mine"]:
        if "/" not in name:
            (user / f"{name}.yaml").write_text("name: x\n")
    offered = complete(shell, "kvctl config show ", tmp_path, KVCTL_TEMPLATE_PATH=str(user))
    assert "mine" in offered and not any(c in "".join(offered) for c in "$;\n\x1b ")
