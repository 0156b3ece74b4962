"""One kvctl reset at a time per replica, on this machine.

Two resets of one fleet at once harm each other: the second sees the first's pause, takes it for
the owner's, resets without pausing and leaves the replica to the first, which resumes it while the
second still works. So a reset (and a weight update, which runs the reset's executor) holds an
exclusive lock per replica from before its pause to after its resume, and a second one of any of
those replicas is refused. The locks are POSIX byte-range locks on one file (the state dir's
locks/reset.lock), one byte per endpoint key (at an offset from its hash): one open file whatever the
fleet's size (a 1024-replica reset must stay within the open-file limit), released by the kernel
when the process ends, however it ends. Resets started from other machines are not seen: run a
fleet's resets from one place.

A lock names the server, not the URL's text (`endpoint_keys`): `http://localhost:8000`,
`http://127.0.0.1:8000/` and `HTTP://[::1]:8000` are one server. The host is resolved to its
addresses, and every address of this machine (loopback, 0.0.0.0, an address of its own interfaces)
is one host, `local`; the port is made explicit (80, 443); the scheme is left out (one port is one
server) and so are trailing slashes. A URL is locked under every key its host resolves to, so two
names that share one address collide. A name that does not resolve keeps its lower-cased text.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from kvctl.state import state_dir

LOCKS = "locks"
DEFAULT_PORTS = {"http": 80, "https": 443}


class Busy(Exception):
    """Another process holds the reset lock of a replica."""

    def __init__(self, url: str) -> None:
        super().__init__(f"{url} is being reset by another kvctl (another process on this machine)")
        self.url = url


def endpoint_keys(url: str, hosts: dict[str, list[str]] | None = None) -> list[str]:
    """The lock keys of the server `url` names: `<address>:<port><path>` for each address its host
    resolves to (`local` for this machine's own), sorted. `hosts`: a host's keys already found (one
    lookup per host for a fleet of many ports on few hosts)."""
    text = url.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port
    except ValueError:  # not a port: the reset cannot reach it either; its text is its key
        return [text.lower().rstrip("/")]
    host = (parts.hostname or "").lower()
    port = port if port is not None else DEFAULT_PORTS.get(parts.scheme.lower(), 80)
    path = "/".join(p for p in parts.path.split("/") if p)
    tail = f":{port}" + (f"/{path}" if path else "")
    if hosts is None or host not in hosts:
        found = sorted({_host_key(address) for address in _addresses(host, port)})
        if hosts is None:
            return [f"{key}{tail}" for key in found]
        hosts[host] = found
    return [f"{key}{tail}" for key in hosts[host]]


def _addresses(host: str, port: int) -> set[str]:
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return {host}
    return {str(info[4][0]).split("%")[0] for info in found} or {host}


def _host_key(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # a name that did not resolve
    if ip.is_loopback or ip.is_unspecified or _is_own(ip):
        return "local"
    return f"[{ip}]" if ip.version == 6 else str(ip)


def _is_own(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address of one of this machine's interfaces: only those can be bound."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
        return True
    except OSError:
        return False


# The locks this process holds, per lock file: its descriptor and how many holders each key has. POSIX
# locks belong to the process, and closing any descriptor of the file drops all of them, so a nested
# reset_lock (kvctl weights update holds its replicas' locks around the reset's executor, which takes
# them again) counts its keys here instead of opening the file again.
_HELD: dict[Path, tuple[int, dict[str, int]]] = {}
_GUARD = threading.Lock()


@contextmanager
def reset_lock(urls: list[str], override: str | Path | None = None) -> Iterator[None]:
    """Hold the reset lock of every replica (each of its endpoint keys); Busy at once, naming the
    URL as given, when another process holds one. Re-entrant within this process."""
    import fcntl  # POSIX only: imported where a lock is taken

    keys: dict[str, str] = {}
    hosts: dict[str, list[str]] = {}
    for url in urls:
        for key in endpoint_keys(url, hosts):
            keys.setdefault(key, url)
    folder = state_dir(override) / LOCKS
    path = folder / "reset.lock"
    taken: list[str] = []
    with _GUARD:
        if path not in _HELD:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            _HELD[path] = (os.open(path, os.O_RDWR | os.O_CREAT, 0o600), {})
        fd, counts = _HELD[path]
        try:
            for key in sorted(keys):
                if not counts.get(key):
                    try:
                        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _offset(key))
                    except OSError:  # EAGAIN / EACCES: held by another process
                        raise Busy(keys[key]) from None
                counts[key] = counts.get(key, 0) + 1
                taken.append(key)
        except BaseException:
            _release(path, taken)
            raise
    try:
        yield
    finally:
        with _GUARD:
            _release(path, taken)


def _offset(key: str) -> int:
    return int(hashlib.sha1(key.encode()).hexdigest()[:10], 16)  # < 2**40: one byte per key


def _release(path: Path, taken: list[str]) -> None:
    import fcntl

    fd, counts = _HELD[path]
    for key in taken:
        counts[key] -= 1
        if not counts[key]:
            del counts[key]
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, _offset(key))
    if not counts:
        del _HELD[path]
        os.close(fd)  # releases every lock this process holds on the file


__all__ = ["Busy", "endpoint_keys", "reset_lock"]
