"""How many GPUs one replica takes, read from its vLLM arguments as vLLM reads them, and the DP ports
that keep replicas on one host apart.

What vLLM does (the same in vLLM 0.13 to 0.33, vllm/config/parallel.py ParallelConfig.__post_init__,
0.32.0:945-949, 0.13.0:504-508):
- world_size = pipeline x tensor x prefill-context parallel. Decode context parallel reuses the TP
  ranks (the field's doc, 0.32.0:385-388; `tp % dcp == 0`, :590-603): no GPUs of its own;
- a replica (one `vllm.entrypoints.openai.api_server` process tree) runs data_parallel_size_local
  engines of world_size GPUs each; without `-dpl` that is every DP rank (arg_utils.py 0.32.0:2492-2494).
So gpus_per_replica = world_size x local DP ranks.

kvctl serve starts whole replicas on one host (kvctl serve --ray: one whole replica per Ray node), so
what makes a replica span hosts or serve no HTTP is refused: fewer local DP ranks than DP ranks (the
rest would be headless engines elsewhere), --nnodes > 1, a --node-rank, --headless, external and
hybrid DP load balancing (one API server per rank or per node), a DP start rank, a DP address that is
not loopback, and the Ray DP backend (it places the engines on a Ray cluster itself).

DP ports (vllm/engine/arg_utils.py 0.32.0:2516-2522, vllm/v1/engine/utils.py 0.32.0:1304-1317,
0.13.0:864-867): with every DP rank local, the engines meet the front end over ZMQ ipc sockets, and the
DP master ports come from the OS (get_open_ports_list, parallel.py 0.32.0:992-996, 0.13.0:526-528);
VLLM_DP_MASTER_PORT is read only when no DP size is given (offline SPMD, 0.32.0:1003-1009). vLLM binds
--data-parallel-rpc-port (default 29550) over TCP only when ranks are remote or with
--enable-elastic-ep (utils.py 0.32.0:1304-1310), and elastic EP keeps the fixed DP master port 29500,
which no flag sets (parallel.py 0.32.0:991). kvctl gives every DP replica its own free RPC port anyway
(cheap, and no layout vLLM adds later collides on 29550), refuses one RPC port for several replicas,
and refuses elastic EP for several replicas on one host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvctl.errors import UsageError
from kvctl.serve.ports import free_port
from kvctl.serve.vllm_args import Arg, option_value, read_args
from kvctl.serve.vllm_launch import is_loopback

INT, STR, FLAG, BOOL = "int", "str", "flag", "bool"  # FLAG: store_true; BOOL: --x / --no-x
# vLLM's options that shape a replica (EngineArgs.add_cli_args' ParallelConfig group, arg_utils.py
# 0.32.0:1130-1299, the same names and short forms since 0.13; --headless: vllm/entrypoints/launchers/
# cli_args.py:435 in 0.32, entrypoints/openai/cli_args.py:258 in 0.13):
# argparse dest -> (long option, short option, kind)
OPTIONS: dict[str, tuple[str, str | None, str]] = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp", INT),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp", INT),
    "prefill_context_parallel_size": ("--prefill-context-parallel-size", "-pcp", INT),
    "decode_context_parallel_size": ("--decode-context-parallel-size", "-dcp", INT),
    "data_parallel_size": ("--data-parallel-size", "-dp", INT),
    "data_parallel_size_local": ("--data-parallel-size-local", "-dpl", INT),
    "data_parallel_rank": ("--data-parallel-rank", "-dpn", INT),
    "data_parallel_start_rank": ("--data-parallel-start-rank", "-dpr", INT),
    "data_parallel_rpc_port": ("--data-parallel-rpc-port", "-dpp", INT),
    "data_parallel_address": ("--data-parallel-address", "-dpa", STR),
    "data_parallel_backend": ("--data-parallel-backend", "-dpb", STR),
    "data_parallel_hybrid_lb": ("--data-parallel-hybrid-lb", "-dph", BOOL),
    "data_parallel_external_lb": ("--data-parallel-external-lb", "-dpe", BOOL),
    "data_parallel_multi_port_external_lb": ("--data-parallel-multi-port-external-lb", "-dpm", FLAG),
    "nnodes": ("--nnodes", "-n", INT),
    "node_rank": ("--node-rank", "-r", INT),
    "headless": ("--headless", None, FLAG),
    "enable_elastic_ep": ("--enable-elastic-ep", None, BOOL),
}
# Other short options of vLLM that a parallel one starts with: '-dc' is --diffusion-config (0.32+),
# not an abbreviation of -dcp.
OTHER_SHORTS = ("-dc",)
AT_LEAST_ONE = ("tensor_parallel_size", "pipeline_parallel_size", "prefill_context_parallel_size",
                "decode_context_parallel_size", "data_parallel_size", "data_parallel_size_local", "nnodes")
_MULTI_NODE = "kvctl serve starts each replica whole, on one host, serving its own HTTP API"


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    data_local: int = 1  # DP ranks this replica runs on its host (vLLM's data_parallel_size_local)
    prefill_context: int = 1
    decode_context: int = 1  # reuses TP ranks: no GPUs of its own
    rpc_port: int | None = None  # --data-parallel-rpc-port as the user gave it
    elastic_ep: bool = False

    @property
    def world_size(self) -> int:
        """GPUs of one DP rank (ParallelConfig.world_size)."""
        return self.pipeline * self.tensor * self.prefill_context

    @property
    def gpus_per_replica(self) -> int:
        return self.world_size * self.data_local

    @property
    def opens_dp_ports(self) -> bool:
        """DP > 1 opens DP ports; elastic EP binds the DP RPC port over TCP whatever the DP size."""
        return self.data > 1 or self.elastic_ep


def parallel_layout(extra_args: list[str]) -> ParallelLayout:
    """The layout vLLM gives a replica started with `extra_args`; UsageError for a bad value or a
    layout kvctl serve cannot start on one host."""
    values, given = read_parallel_args(extra_args)

    def flag(dest: str) -> str:
        return given.get(dest, OPTIONS[dest][0])

    for dest in AT_LEAST_ONE:
        if values.get(dest, 1) < 1:
            raise UsageError(f"{flag(dest)} {values[dest]} after --: kvctl serve needs at least 1",
                             f"give a whole number from 1, e.g. -- {OPTIONS[dest][0]} 2")
    data = values.get("data_parallel_size", 1)
    local = values.get("data_parallel_size_local", data)
    _check_one_host(values, flag, data, local)
    return ParallelLayout(tensor=values.get("tensor_parallel_size", 1),
                          pipeline=values.get("pipeline_parallel_size", 1), data=data, data_local=local,
                          prefill_context=values.get("prefill_context_parallel_size", 1),
                          decode_context=values.get("decode_context_parallel_size", 1),
                          rpc_port=values.get("data_parallel_rpc_port"),
                          elastic_ep=bool(values.get("enable_elastic_ep", False)))


def _check_one_host(values: dict[str, Any], flag: Callable[[str], str], data: int, local: int) -> None:
    """Refuse what would make a replica span hosts, or serve no HTTP of its own."""
    if local != data:
        why = "it must not exceed the DP size" if local > data else "the other DP ranks would run on other hosts"
        raise UsageError(f"{flag('data_parallel_size_local')} {local} with {flag('data_parallel_size')} {data} after "
                         f"--: {why}; {_MULTI_NODE}", "leave --data-parallel-size-local out (every DP rank runs in "
                                                      "the replica), or give it the DP size")
    refusals = {
        "nnodes": values.get("nnodes", 1) != 1,
        "node_rank": values.get("node_rank", 0) != 0,
        "headless": values.get("headless", False),
        "data_parallel_rank": "data_parallel_rank" in values,
        "data_parallel_external_lb": values.get("data_parallel_external_lb", False),
        "data_parallel_multi_port_external_lb": values.get("data_parallel_multi_port_external_lb", False),
        "data_parallel_hybrid_lb": values.get("data_parallel_hybrid_lb", False),
        "data_parallel_start_rank": values.get("data_parallel_start_rank", 0) != 0,
        "data_parallel_address": not is_loopback(values.get("data_parallel_address", "127.0.0.1")),
        "data_parallel_backend": values.get("data_parallel_backend", "mp") == "ray",
    }
    for dest, refused in refusals.items():
        if refused:
            shown = values[dest] if OPTIONS[dest][2] in (INT, STR) else ""
            raise UsageError(f"{flag(dest)} {shown}".rstrip() + f" after --: {_WHY[dest]}; {_MULTI_NODE}", _FIX[dest])


_WHY = {
    "nnodes": "one replica over several hosts", "node_rank": "a replica's share on another host",
    "headless": "a headless replica serves no HTTP API (it runs engines for a front end elsewhere)",
    "data_parallel_rank": "external DP load balancing runs one API server per DP rank",
    "data_parallel_external_lb": "external DP load balancing runs one API server per DP rank",
    "data_parallel_multi_port_external_lb": "it runs one API server per DP rank, each on its own port",
    "data_parallel_hybrid_lb": "hybrid DP load balancing runs one API server per host of a DP group",
    "data_parallel_start_rank": "the first DP rank of a secondary host",
    "data_parallel_address": "the address of a DP group's head host (DP within one host needs none)",
    "data_parallel_backend": "the Ray DP backend places the engines on a Ray cluster itself",
}
_SEPARATE = "leave it out and run several independent replicas with kvctl serve --replicas N"
_FIX = {
    "nnodes": "leave --nnodes out: one replica per host (kvctl serve --ray runs whole replicas on each Ray node)",
    "node_rank": "leave --node-rank out", "headless": "leave --headless out",
    "data_parallel_rank": _SEPARATE, "data_parallel_external_lb": _SEPARATE,
    "data_parallel_multi_port_external_lb": _SEPARATE, "data_parallel_hybrid_lb": "leave it out: on one host "
    "vLLM balances the DP ranks internally",
    "data_parallel_start_rank": "leave it out (0: every DP rank is on this host)",
    "data_parallel_address": "leave it out, or give 127.0.0.1",
    "data_parallel_backend": "leave it out (the default mp backend runs the DP ranks in the replica); for a "
                             "cluster use kvctl serve --ray",
}


def read_parallel_args(extra_args: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(argparse dest -> value, argparse dest -> the option as given) for OPTIONS, the last one winning,
    as vLLM's parser reads `extra_args` (kvctl.serve.vllm_args)."""
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    for arg in read_args(extra_args):
        found = resolve(arg)
        if found is None:
            continue
        dest, negated, glued = found
        kind = OPTIONS[dest][2]
        if kind in (FLAG, BOOL):
            values[dest] = not negated
        else:
            values[dest] = _value(arg, dest, glued)
        given[dest] = arg.option[:2] if glued else arg.given  # '-n2': named as -n (its value is shown)
    return values, given


def resolve(arg: Arg) -> tuple[str, bool, str | None] | None:
    """(dest, written as --no-x, a value glued to a one-letter option) for an option argparse reads as
    one of OPTIONS, None for any other option. An abbreviation that several options share is refused
    (vLLM's parser stops at it too)."""
    if arg.dotted:
        return None  # --name.field: a field of a JSON option; none of OPTIONS is one (vLLM fails on it)
    long = arg.option.startswith("--")
    names = _long_names() if long else _short_names()
    if arg.option in names:
        return (*names[arg.option], None)
    if arg.option in OTHER_SHORTS or (not long and arg.value is not None):
        return None  # another vLLM option; argparse abbreviates no short option written with '='
    matches = [n for n in [*names, *([] if long else OTHER_SHORTS)] if n.startswith(arg.option)]
    glued = arg.option[:2] if not long and arg.option[:2] in names else None  # argparse: -n2 is -n 2
    candidates = matches + ([glued] if glued else [])
    if len(candidates) > 1:
        raise UsageError(f"{arg.given} after -- is ambiguous: vLLM's parser could read it as "
                         + ", ".join(sorted(candidates)), "write the option out in full")
    if not candidates or candidates[0] in OTHER_SHORTS:
        return None
    dest, negated = names[candidates[0]]
    return dest, negated, arg.option[2:] if glued else None


def _long_names() -> dict[str, tuple[str, bool]]:
    out = {}
    for dest, (long, _, kind) in OPTIONS.items():
        out[long] = (dest, False)
        if kind == BOOL:
            out["--no-" + long[2:]] = (dest, True)
    return out


def _short_names() -> dict[str, tuple[str, bool]]:
    return {short: (dest, False) for dest, (_, short, _) in OPTIONS.items() if short}


def _value(arg: Arg, dest: str, glued: str | None) -> Any:
    long, _, kind = OPTIONS[dest]
    text = glued if glued else option_value(arg)
    if text is None:
        raise UsageError(f"{arg.given} after -- has no value", f"e.g. -- {long} {'2' if kind == INT else 'VALUE'}")
    if kind == STR:
        return text
    try:
        return int(text)  # what argparse's type=int accepts (' 2', '+2', '1_0' included)
    except ValueError:
        raise UsageError(f"{arg.given} {text!r} after -- is not a whole number", f"e.g. -- {long} 2") from None


def check_dp_ports(layout: ParallelLayout, replicas: int) -> None:
    """Several replicas on one host must not share a DP port."""
    if replicas < 2 or not layout.opens_dp_ports:
        return
    if layout.rpc_port is not None:
        raise UsageError(f"--data-parallel-rpc-port {layout.rpc_port} after -- with {replicas} replicas: they "
                         "would all bind it", "leave it out: kvctl gives each replica a free one")
    if layout.elastic_ep and layout.data > 1:
        raise UsageError(f"--enable-elastic-ep with data parallel and {replicas} replicas on one host: every "
                         "replica would take vLLM's fixed DP master port 29500, which no vLLM flag moves",
                         "run one elastic-EP replica per host (--replicas 1)")


def dp_rpc_ports(layout: ParallelLayout, taken: list[int]) -> list[int | None]:
    """Per replica, the --data-parallel-rpc-port kvctl gives it: a free loopback port unlike `taken` and
    the others (vLLM binds it on the DP address, loopback here), or None when the replica opens no DP
    port or the user chose it (one replica, check_dp_ports)."""
    if not layout.opens_dp_ports or layout.rpc_port is not None:
        return [None] * len(taken)
    chosen: list[int | None] = []
    for _ in range(20 * len(taken) + 100):  # the OS hands out free ports; a bound, not a spin
        if len(chosen) == len(taken):
            return chosen
        port = free_port("127.0.0.1")
        if port not in taken and port not in chosen:
            chosen.append(port)
    if len(chosen) == len(taken):
        return chosen
    raise UsageError(f"found only {len(chosen)} free port(s) on 127.0.0.1 for {len(taken)} DP replica(s)",
                     "free some ports or start fewer replicas")
