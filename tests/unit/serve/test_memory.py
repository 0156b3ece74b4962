"""The fleet's Mooncake memory against what the machine has (issue 25 finding 7)."""

from __future__ import annotations

import resource

import pytest

from kvctl.errors import UsageError
from kvctl.serve.memory import VLLM_DEFAULT_SIZE, check_host_memory, mooncake_memory

MiB, GiB = 1024**2, 1024**3


def test_sizes_count_per_rank_not_per_server() -> None:
    need = mooncake_memory({"global_segment_size": "256MB", "local_buffer_size": "128MB", "protocol": "tcp"}, 2, 4)
    assert need is not None and need.per_rank == 384 * MiB and need.ranks == 8 and need.total == 3 * GiB
    assert not need.pinned


def test_missing_sizes_take_vllms_defaults_and_standalone_contributes_no_segment() -> None:
    need = mooncake_memory({"protocol": "rdma"}, 1, 1)
    assert need is not None and need.per_rank == 2 * VLLM_DEFAULT_SIZE and need.pinned
    need = mooncake_memory({"mode": "standalone-store", "local_buffer_size": 64 * MiB}, 1, 2)
    assert need is not None and need.total == 128 * MiB
    assert mooncake_memory(None, 3, 1) is None


def test_more_than_the_machine_has_is_refused_with_the_per_rank_arithmetic() -> None:
    need = mooncake_memory({"global_segment_size": "8GB", "local_buffer_size": "1GB", "protocol": "tcp"}, 2, 8)
    with pytest.raises(UsageError) as err:
        check_host_memory(need, available=64 * GiB)
    assert "16 worker rank(s) x 9.00 GiB" in err.value.message and "144.00 GiB" in err.value.message
    assert "per rank" in (err.value.hint or "")
    check_host_memory(need, available=200 * GiB)


def test_rdma_needs_a_locked_memory_limit_that_holds_a_rank() -> None:
    need = mooncake_memory({"global_segment_size": "4GB", "local_buffer_size": "1GB", "protocol": "rdma"}, 1, 1)
    with pytest.raises(UsageError, match="ulimit -l"):
        check_host_memory(need, available=100 * GiB, memlock=64 * 1024)
    check_host_memory(need, available=100 * GiB, memlock=resource.RLIM_INFINITY)
    tcp = mooncake_memory({"global_segment_size": "4GB", "local_buffer_size": "1GB", "protocol": "tcp"}, 1, 1)
    check_host_memory(tcp, available=100 * GiB, memlock=64 * 1024)  # tcp pins nothing


def test_the_real_machine_holds_the_demo_fleet() -> None:
    # two CPU replicas of the built-in mooncake-store template (256MB + 128MB per rank)
    check_host_memory(mooncake_memory({"global_segment_size": "256MB", "local_buffer_size": "128MB",
                                       "protocol": "tcp"}, 2, 1))


def test_serve_refuses_a_fleet_whose_mooncake_memory_does_not_fit(cli, tmp_path) -> None:
    """Through kvctl serve with a real master and the fake-vLLM double: 2 replicas x TP 4 ranks x
    (64 TiB + 128 MB, given as 65536GB) cannot fit any machine; nothing is left running."""
    from kvctl.serve import runs
    from tests.integration.helpers import require_mooncake
    from tests.unit.serve.test_serve import gone, serve_args

    require_mooncake()
    result = cli(*serve_args(tmp_path, "big", "--replicas", "2", "--set", "global_segment_size=65536GB",
                             "--", "--tensor-parallel-size", "4"))
    assert result.exit_code == 2, result.stderr
    assert "8 worker rank(s)" in result.stderr and "per rank" in result.stderr
    assert gone(runs.load("big", tmp_path / "state"))
