"""tools/capabilities/cli_facts.py (the options `vllm serve` accepts per release) on a synthetic tree
and on vLLM's real released sources (the cache `make capabilities` fills)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.lib import REPO
from tests.lib.release_sources import vllm_tree
from tools.capabilities import cli_facts
from tools.capabilities.merge import facts_at, strip_locations
from tools.capabilities.source import SourceTree

COMMITTED = json.loads((REPO / "kvctl/data/vllm_facts.json").read_text())


def _release(version: str) -> dict:
    return cli_facts.extract(vllm_tree(version))


FAKE = {
    "vllm/entrypoints/cli/serve.py": """
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        class ServeSubcommand:
            def subparser_init(self, subparsers):
                serve_parser = subparsers.add_parser("serve")
                serve_parser.add_argument("model_tag", nargs="?")
                return make_arg_parser(serve_parser)
    """,
    "vllm/entrypoints/openai/cli_args.py": """
        from vllm.engine.arg_utils import AsyncEngineArgs, get_kwargs
        @config
        class FrontendArgs:
            port: int = 8000
            enable_auto_tool_choice: bool = False
            @classmethod
            def add_cli_args(cls, parser):
                frontend_kwargs = get_kwargs(cls)
                for key, value in frontend_kwargs.items():
                    parser.add_argument(f"--{key.replace('_', '-')}", **value)
                return parser
        def make_arg_parser(parser):
            parser.add_argument("--api-server-count", "-asc", type=int)
            parser = FrontendArgs.add_cli_args(parser)
            return AsyncEngineArgs.add_cli_args(parser)
    """,
    "vllm/config/model.py": """
        @config
        class ModelConfig:
            enforce_eager: bool = False
            max_model_len: int = 0
            hf_overrides: dict | None = None
    """,
    "vllm/engine/arg_utils.py": """
        import argparse
        from vllm.config.model import ModelConfig
        class EngineArgs:
            @staticmethod
            def add_cli_args(parser):
                model_kwargs = get_kwargs(ModelConfig)
                group = parser.add_argument_group("ModelConfig")
                group.add_argument("--enforce-eager", **model_kwargs["enforce_eager"])
                group.add_argument("--max-model-len", "-mml", **{**model_kwargs["max_model_len"], "default": 1})
                for arg, kind in [("--old-a", str), ("--old-b", bool)]:
                    group.add_argument(arg, type=kind, help=f"[DEPRECATED] {arg} goes away", deprecated=True)
                return parser
        class AsyncEngineArgs(EngineArgs):
            @staticmethod
            def add_cli_args(parser):
                parser = EngineArgs.add_cli_args(parser)
                parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
                return parser
    """,
}


def test_synthetic_parser_followed_through_its_calls(tmp_path: Path) -> None:
    for name, text in FAKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    facts = cli_facts.extract(SourceTree(tmp_path))
    assert set(facts) == {
        "-h", "--help", "--api-server-count", "-asc", "--port", "--enable-auto-tool-choice",
        "--no-enable-auto-tool-choice", "--enforce-eager", "--no-enforce-eager", "--max-model-len", "-mml",
        "--old-a", "--old-b", "--enable-log-requests", "--no-enable-log-requests"}
    assert facts["-asc"]["values"]["option"] == "--api-server-count"
    assert facts["--old-b"]["values"]["deprecated"] and not facts["--port"]["values"]["deprecated"]
    assert facts["--enforce-eager"]["values"]["file"] == "vllm/engine/arg_utils.py"


def test_disable_log_requests_deprecated_through_0_16_and_gone_in_0_17() -> None:
    old = _release("0.16.0")["--disable-log-requests"]["values"]
    assert old["deprecated"] and (old["file"], old["line"]) == ("vllm/engine/arg_utils.py", 2087)
    assert "--no-disable-log-requests" in _release("0.16.0")
    later = _release("0.17.0")
    assert "--disable-log-requests" not in later and "--enable-log-requests" in later


def test_aliases_booleans_and_frontend_fields_in_0_32() -> None:
    facts = _release("0.32.0")
    assert facts["-tp"]["values"]["option"] == "--tensor-parallel-size"
    assert {"--no-enable-prefix-caching", "--no-enforce-eager", "--port", "--kv-transfer-config"} <= set(facts)
    assert "--no-port" not in facts and "--no-kv-transfer-config" not in facts
    assert facts["--log-config-file"]["values"]["deprecated"]  # DeprecatedLogConfigFileAction


def test_committed_facts_hold_what_the_sources_say() -> None:
    for version in ("0.8.5", "0.16.0", "0.17.0", "0.32.0", "0.33.0"):
        fresh = strip_locations({"serve_flags": _release(version)})["serve_flags"]
        committed = strip_locations(facts_at(COMMITTED, version))["serve_flags"]
        assert committed == fresh, version


@pytest.mark.parametrize("version", ["0.9.1", "0.10.2", "0.11.0"])
def test_skip_validation_bool_fields_get_their_no_form(version: str) -> None:
    """Issue 40 item 4: SchedulerConfig.enable_chunked_prefill is SkipValidation[bool] in 0.9.1-0.11.0
    (vllm/config/scheduler.py:89 in 0.10.2); get_type_hints unwraps it (engine/arg_utils.py:134-148),
    so argparse has --no-enable-chunked-prefill there."""
    found = _release(version)
    assert "--enable-chunked-prefill" in found and "--no-enable-chunked-prefill" in found
    committed = facts_at(COMMITTED, version)["serve_flags"]
    assert "--no-enable-chunked-prefill" in committed
