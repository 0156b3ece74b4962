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
        return [w.strip('"') for w in out.split("((", 1)[-1].split("))", 1)[0].split()] if "((" in out else []
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
