"""How kvctl serve shares a machine's cores among vLLM CPU replicas (kvctl/serve/cpu_binding.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvctl.serve import cpu_binding
from kvctl.serve.cpu_binding import NOBIND, id_list, plan


def test_two_replicas_on_two_cores_get_one_core_each() -> None:
    p = plan(2, {}, cpus=[0, 1], taken=set())
    assert p.binds == ["0", "1"]
    assert "1 core(s) each, none shared" in p.reason


def test_cores_are_split_into_contiguous_disjoint_ranges() -> None:
    p = plan(3, {}, cpus=list(range(8)), taken=set())
    assert p.binds == ["0-1", "2-3", "4-5"]  # 8 // 3 = 2 each; cores 6 and 7 stay free


def test_more_replicas_than_cores_turns_binding_off() -> None:
    p = plan(3, {}, cpus=[0, 1], taken=set())
    assert p.binds == [NOBIND, NOBIND, NOBIND]
    assert "no binding" in p.reason


def test_one_replica_alone_keeps_vllms_own_binding() -> None:
    p = plan(1, {}, cpus=[0, 1], taken=set())
    assert p.binds == [None] and not p.changed


def test_cores_other_workers_are_bound_to_are_left_alone() -> None:
    assert plan(1, {}, cpus=[0, 1, 2, 3], taken={0, 1}).binds == ["2-3"]
    assert plan(2, {}, cpus=[0, 1, 2, 3], taken={0}).binds == ["1", "2"]
    # every core taken (a 2-replica run on 2 cores, then one more replica): no binding at all
    assert plan(1, {}, cpus=[0, 1], taken={0, 1}).binds == [NOBIND]


def test_a_binding_the_user_set_wins() -> None:
    p = plan(2, {cpu_binding.BIND_ENV: "0-1|2-3"}, cpus=[0, 1, 2, 3], taken=set())
    assert p.binds == [None, None]
    assert "set by you" in p.reason


@pytest.mark.parametrize("ids,text", [([0], "0"), ([0, 1, 2, 5], "0-2,5"), ([3, 1, 2], "1-3"), ([], ""),
                                      ([0, 2, 4], "0,2,4")])
def test_id_list(ids: list[int], text: str) -> None:
    assert id_list(ids) == text
    assert cpu_binding.parse_ids(text) == set(ids)


LINUX_2CPU = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                reason="needs Linux with two CPUs")


def fake_worker(core: int) -> subprocess.Popen[str]:
    """A real process titled like vLLM's CPU worker (PR_SET_NAME, what setproctitle shows), pinned to
    one core: no vLLM needed. A double of the worker's name and affinity, nothing else."""
    code = ("import ctypes, os, time\n"
            "ctypes.CDLL(None).prctl(15, b'VLLM::Worker', 0, 0, 0)\n"
            f"os.sched_setaffinity(0, {{{core}}})\n"
            "print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@LINUX_2CPU
def test_finds_cores_a_running_vllm_worker_is_pinned_to() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    proc = fake_worker(cpus[-1])
    try:
        assert cpu_binding.pinned_vllm_processes(cpus)[proc.pid] == {cpus[-1]}
        assert cpu_binding.bound_by_other_workers(cpus) >= {cpus[-1]}
        bind = plan(1, {}, cpus=cpus).binds[0]  # other vLLM workers on this machine may hold cores too
        assert bind is not None and cpus[-1] not in cpu_binding.parse_ids(bind)
    finally:
        proc.kill()
        proc.wait()


@LINUX_2CPU
def test_doctor_warns_when_two_vllm_workers_share_a_core() -> None:
    from kvctl.doctor import check_cpu_binding

    core = sorted(os.sched_getaffinity(0))[-1]
    procs = [fake_worker(core), fake_worker(core)]
    try:
        check = check_cpu_binding()
        assert check.status == "warn"
        assert f"pids {procs[0].pid} and {procs[1].pid} share cores {core}" in check.detail
        assert "VLLM_CPU_OMP_THREADS_BIND" in (check.fix or "")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(p.pid not in cpu_binding.pinned_vllm_processes() for p in procs)
