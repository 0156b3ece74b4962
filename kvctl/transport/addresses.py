"""Which address this host shows to a Mooncake master and its peers.

A Mooncake client registers its segment under a host name (`local_hostname` in `setup()`); every
other client that reads a block from that segment dials it. vLLM passes `get_ip()` there
(vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py:1420 in 0.32.0; the
MooncakeConnector's side channel uses the same), and `get_ip()` returns `VLLM_HOST_IP` when it is set,
else the address of the default route. So a replica that shows 127.0.0.1 to a master on another
machine sends that machine's clients to their own loopback, and one that shows its default route
to a master reached over a second NIC sends them to the wrong network: the address must be the one
this host uses *toward the master*.
"""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK = "127.0.0.1"
_WILDCARDS = ("0.0.0.0", "::", "")


def master_hosts(master: str) -> list[str]:
    """The hosts in a master address: `host:port`, `[v6]:port`, or an HA `etcd://h1:p;h2:p` list."""
    text = master.split("://", 1)[1] if "://" in master else master
    hosts = []
    for part in text.replace(",", ";").split(";"):
        part = part.strip().rstrip("/")
        if not part:
            continue
        host = part[1:part.index("]")] if part.startswith("[") and "]" in part else part.rpartition(":")[0] or part
        hosts.append(host)
    return hosts


def route_address(host: str) -> str:
    """The local address the kernel would use to reach `host` (loopback for a loopback host or no route)."""
    if _loopback(host):
        return LOOPBACK
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return LOOPBACK
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(sockaddr)  # UDP: nothing is sent, the kernel only picks the route
                return str(probe.getsockname()[0])
            except OSError:
                continue
    return LOOPBACK


def advertised_address(host: str, master: str | None) -> str:
    """What a replica bound to `host` shows to the master at `master` (None: an embedded one on `host`).

    A master on this machine: loopback, whatever `host` is (every peer is local). A master elsewhere:
    the concrete `--host` when one was given, else the address of the route toward the master."""
    hosts = master_hosts(master) if master else []
    if not hosts or all(_loopback(h) for h in hosts):
        return LOOPBACK if master or _loopback(host) or host in _WILDCARDS else host
    if host not in _WILDCARDS and not _loopback(host):
        return host.strip("[]")
    return route_address(hosts[0])


def _loopback(host: str) -> bool:
    text = host.strip("[]")
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False
