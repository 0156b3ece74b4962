"""kvctl.serve.parallel: GPUs per replica read from the args after `--` as vLLM's parser reads them,
the layouts kvctl serve refuses, and the DP RPC ports that keep replicas on one host apart. vLLM's own
parser judges the same readings in tests/e2e/test_parallel_vllm.py; the lifecycle test at the end runs
a REAL mooncake_master and the TEST DOUBLE of the vLLM interpreter (tests/doubles/fake_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from kvctl.errors import UsageError
from kvctl.serve import runs
from kvctl.serve.parallel import ParallelLayout, check_dp_ports, dp_rpc_ports, parallel_layout
from kvctl.serve.vllm_launch import VllmInstall, owned_flags_in, replica_command
from tests.integration.helpers import require_mooncake
from tests.unit.serve.test_serve import gone, serve_args


@pytest.mark.parametrize(("args", "gpus"), [
    ([], 1),
    (["-tp", "2"], 2),
    (["-tp=4"], 4),
    (["--tensor-parallel-size", "2", "-pp", "2"], 4),
    (["--tensor_parallel_size=2"], 2),  # underscores, as FlexibleArgumentParser reads them
    (["--tensor", "4"], 4),  # an unambiguous prefix (argparse allow_abbrev, which vLLM keeps)
    (["--pipe=3"], 3),
    (["-t", "2"], 2),  # argparse also abbreviates short options: -t is -tp
    (["-pc", "2"], 2),  # ... and -pc is -pcp
    (["-dc", "2"], 1),  # but -dc is vLLM's --diffusion-config, not -dcp
    (["-tp", "1", "-tp", "3"], 3),  # the last one wins
    (["-tp", "1_0"], 10),  # what int() takes, argparse's type=int takes
    (["-tp", "2", "-dcp", "2"], 2),  # decode context parallel reuses the TP GPUs
    (["-tp", "2", "-pcp", "2"], 4),  # prefill context parallel adds GPUs
    (["-dp", "2"], 2),  # every DP rank runs in the replica (no -dpl)
    (["-dp", "2", "-tp", "2", "-pp", "2"], 8),
    (["--data-parallel-size", "2", "--data-parallel-size-local", "2"], 2),
    (["-dp=3", "-dpl=3", "-dpa", "127.0.0.1", "-dpr", "0", "-n", "1", "-r", "0"], 3),  # single-host values pass
    (["--data-parallel-hybrid-lb", "--no-data-parallel-hybrid-lb"], 1),  # --no-x, last one wins
    (["-tp2"], 1),  # argparse does not read it (vLLM refuses it): kvctl counts nothing from it
    (["--dtype", "float32", "--max-model-len", "256"], 1),
])
def test_gpus_per_replica_read_as_vllm_reads_them(args: list[str], gpus: int) -> None:
    assert parallel_layout(args).gpus_per_replica == gpus


def test_the_layout_fields() -> None:
    layout = parallel_layout(["-tp", "2", "-pp", "3", "-pcp", "2", "-dcp", "4", "-dp", "2", "-dpp", "4567"])
    assert layout == ParallelLayout(tensor=2, pipeline=3, data=2, data_local=2, prefill_context=2, decode_context=4,
                                    rpc_port=4567)
    assert layout.world_size == 12 and layout.gpus_per_replica == 24 and layout.opens_dp_ports
    assert not parallel_layout([]).opens_dp_ports and parallel_layout(["--enable-elastic-ep"]).opens_dp_ports


def _yaml(tmp_path: Path, text: str, name: str = "vllm.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_config_file_is_read_and_the_command_line_wins(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "tensor_parallel_size: 2\ndata-parallel-size: 3\ndtype: float32\n")
    assert parallel_layout(["--config", config]).gpus_per_replica == 6
    # vLLM puts the file's keys before the whole command line: -tp wins wherever --config stands
    assert parallel_layout(["-tp", "4", "--config", config]).gpus_per_replica == 12
    assert parallel_layout(["--config", config, "-tp", "1"]).gpus_per_replica == 3
    # vLLM 0.32 loads only an exact `--config FILE`; --config=FILE is stored and ignored
    assert parallel_layout([f"--config={config}"]).gpus_per_replica == 1


def test_config_file_booleans_and_refusals(tmp_path: Path) -> None:
    assert parallel_layout(["--config", _yaml(tmp_path, "data_parallel_hybrid_lb: false\n")]).gpus_per_replica == 1
    with pytest.raises(UsageError, match="'headless' in --config .* a headless replica serves no HTTP API"):
        parallel_layout(["--config", _yaml(tmp_path, "headless: true\n")])
    with pytest.raises(UsageError, match="'pipeline_parallel_size' in --config .* is not a whole number"):
        parallel_layout(["--config", _yaml(tmp_path, "pipeline_parallel_size: 2.5\n")])
    with pytest.raises(UsageError, match="only .yaml or .yml"):
        parallel_layout(["--config", _yaml(tmp_path, "tensor_parallel_size: 2\n", "vllm.json")])
    with pytest.raises(UsageError, match="more than once"):
        parallel_layout(["--config", "a.yaml", "--config", "b.yaml"])
    with pytest.raises(UsageError, match="cannot read it"):
        parallel_layout(["--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(UsageError, match="no file after it"):
        parallel_layout(["--config"])


@pytest.mark.parametrize(("args", "message"), [
    (["-tp", "abc"], "-tp 'abc' after -- is not a whole number"),
    (["--tensor-parallel-size=2.0"], "'2.0' after -- is not a whole number"),
    (["-tp", "0"], "-tp 0 after --: kvctl serve needs at least 1"),
    (["-pp", "-1"], "-pp -1 after --: kvctl serve needs at least 1"),  # argparse takes -1 as a value
    (["-dp", "2", "-dpl", "0"], "-dpl 0 after --: kvctl serve needs at least 1"),
    (["--nnodes=0"], "--nnodes 0 after --: kvctl serve needs at least 1"),
    (["-tp"], "-tp after -- has no value"),
    (["-tp", "--dtype", "float32"], "-tp after -- has no value"),
    (["-p", "2"], "-p after -- is ambiguous: vLLM's parser could read it as -pcp, -pp"),
    (["--data-parallel-s", "2"], "is ambiguous"),
])
def test_bad_values_name_the_flag_and_the_fix(args: list[str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        parallel_layout(args)
    assert message in err.value.message and err.value.hint


@pytest.mark.parametrize(("args", "message"), [
    (["-dp", "4", "-dpl", "2"], "the other DP ranks would run on other hosts"),
    (["-dp", "2", "-dpl", "3"], "it must not exceed the DP size"),
    (["--nnodes", "2"], "one replica over several hosts"),
    (["-n2"], "-n 2 after --: one replica over several hosts"),  # argparse: -n2 is -n 2
    (["-r", "1"], "a replica's share on another host"),
    (["--headless"], "serves no HTTP API"),
    (["--head"], "serves no HTTP API"),  # a prefix of --headless
    (["-dp", "2", "-dpn", "0"], "one API server per DP rank"),
    (["-dp", "2", "--data-parallel-external-lb"], "one API server per DP rank"),
    (["-dp", "2", "-dpm"], "each on its own port"),
    (["-dp", "2", "-dpl", "2", "-dph"], "one API server per host"),
    (["-dp", "2", "-dpr", "1"], "a secondary host"),
    (["-dp", "2", "--data-parallel-address", "10.1.2.3"], "a DP group's head host"),
    (["-dp", "2", "-dpb", "ray"], "the Ray DP backend"),
])
def test_layouts_beyond_one_host_are_refused(args: list[str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        parallel_layout(args)
    assert message in err.value.message and "kvctl serve starts each replica whole" in err.value.message
    assert err.value.hint


def test_several_replicas_never_share_a_dp_port() -> None:
    check_dp_ports(parallel_layout(["-dp", "2", "-dpp", "4567"]), 1)  # one replica may choose its own
    check_dp_ports(parallel_layout(["-dpp", "4567"]), 2)  # no DP: vLLM binds no DP port
    with pytest.raises(UsageError, match="--data-parallel-rpc-port 4567 after -- with 2 replicas"):
        check_dp_ports(parallel_layout(["-dp", "2", "-dpp", "4567"]), 2)
    with pytest.raises(UsageError, match="fixed DP master port 29500"):
        check_dp_ports(parallel_layout(["-dp", "2", "--enable-elastic-ep"]), 2)


def test_each_dp_replica_gets_its_own_rpc_port() -> None:
    taken = [8001, 8002, 8003]
    ports = dp_rpc_ports(parallel_layout(["-dp", "2"]), taken)
    assert len(ports) == 3 and len(set(ports)) == 3 and not set(ports) & set(taken) and None not in ports
    assert dp_rpc_ports(parallel_layout(["-tp", "2"]), taken) == [None] * 3
    assert dp_rpc_ports(parallel_layout(["-dp", "2", "-dpp", "4567"]), [8001]) == [None]  # the user's stays
    install = VllmInstall("/envs/gpu/bin/python", "vllm", Version("0.32.0"))
    cmd = replica_command(install, "/m", "127.0.0.1", 8001, {}, ["-dp", "2"], dp_rpc_port=40000)
    assert cmd[-4:] == ["--data-parallel-rpc-port", "40000", "-dp", "2"]  # the user's args still come last
    assert "--data-parallel-rpc-port" not in replica_command(install, "/m", "127.0.0.1", 8001, {}, [])


def test_the_owned_flag_check_reads_with_the_same_reader(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "host: 0.0.0.0\ntensor_parallel_size: 2\n")
    assert owned_flags_in(["--config", config]) == [(f"'host' in --config {config} (vLLM reads it as --host)",
                                                     "--host")]
    # --config=FILE and --conf FILE: vLLM 0.32 loads neither, the owned-flag check reads them all the same
    assert owned_flags_in([f"--config={config}"])[0][1] == "--host"
    assert owned_flags_in(["--conf", config])[0][1] == "--host"
    assert owned_flags_in(["-tp", "2", "--ho=0.0.0.0"]) == [("--ho (vLLM reads it as --host)", "--host")]


def test_a_refused_layout_starts_nothing(cli, tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = cli("serve", str(tmp_path), "--state-dir", str(state), "--name", "dp", "--replicas", "2", "--",
                 "-dp", "2", "--data-parallel-rpc-port", "4567")
    assert result.exit_code == 2 and "they would all bind it" in result.stderr
    assert not (state / "runs" / "dp").exists()


def test_two_dp_replicas_are_launched_with_distinct_dp_ports(cli, tmp_path: Path) -> None:
    require_mooncake()
    result = cli(*serve_args(tmp_path, "dp", "--replicas", "2", "--detach", "--", "-dp", "2"))
    assert result.exit_code == 0, result.stderr
    record = runs.load("dp", tmp_path / "state")
    try:
        rpc_ports = []
        for r in record.replicas:
            argv = json.loads((Path(record.dir) / "replicas" / r.name / "tmp" / "launch.json").read_text())["argv"]
            rpc_ports.append(int(argv[argv.index("--data-parallel-rpc-port") + 1]))
            assert argv[-2:] == ["-dp", "2"]
        assert len(set(rpc_ports)) == 2 and 29550 not in rpc_ports
        assert not set(rpc_ports) & {r.port for r in record.replicas}
    finally:
        cli("stop", "--run", "dp", "--state-dir", str(tmp_path / "state"))
    assert gone(record)
