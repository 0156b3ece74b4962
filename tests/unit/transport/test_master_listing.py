"""kvctl.transport.master_admin counts the master's key listing while reading it (issue 29).

The count must equal what splitting the whole answer into strings gives (the exact count kvctl took
before), for any chunking of the answer; and kvctl's memory must not grow with the number of keys
listed: a server answering millions of keys is counted within a small constant (tracemalloc's peak).
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from kvctl.transport.master_admin import MAX_KEY_LINE, KeyCount, KeyCounter, MasterAdmin, MasterError, NotLeader
from tests.doubles import DoubleFleet, Faults, MasterDouble, SharedStore


def reference(body: bytes, prefix: str | None) -> KeyCount:
    """The count kvctl took before streaming: the whole answer split into strings."""
    keys = [line.rstrip("\r") for line in body.decode().split("\n") if line.rstrip("\r")]
    return KeyCount(len(keys), 0 if prefix is None else sum(1 for k in keys if k.startswith(prefix)))


def fed(body: bytes, prefix: str | None, cuts: list[int]) -> KeyCount:
    counter = KeyCounter(prefix)
    start = 0
    for cut in sorted(cuts) + [len(body)]:
        counter.feed(body[start:cut])
        start = cut
    return counter.result()


LINES = ["rl-a@m@tp_rank:0@aa", "svc-b@m@tp_rank:0@bb", "rl-a@", "rl-ax@no", "x@rl-a@mid", "rl-", "",
         "\r", "rl-a@crlf\r", "\rrl-a@cr-first", "é@rl-a", "rl-a@é", "rl-a@rl-a@twice"]


@pytest.mark.parametrize("prefix", ["rl-a@", None, "", "é@", "rl-a@\nsvc", "r"])
def test_the_streamed_count_equals_the_split_count_for_any_chunking(prefix: str | None) -> None:
    rng = random.Random(29)
    for _ in range(400):
        body = "\n".join(rng.choice(LINES) for _ in range(rng.randint(0, 40)))
        body += rng.choice(["", "\n", "\n\n", "\r\n"])
        raw = body.encode()
        cuts = [rng.randint(0, len(raw)) for _ in range(rng.randint(0, 6))]
        assert fed(raw, prefix, cuts) == reference(raw, prefix), (body, cuts)
        assert fed(raw, prefix, list(range(len(raw)))) == reference(raw, prefix)  # a byte at a time


def test_a_line_without_end_is_refused_not_held() -> None:
    counter = KeyCounter("rl-a@")
    counter.feed(b"k" * MAX_KEY_LINE)
    with pytest.raises(ValueError, match="not a key listing"):
        counter.feed(b"k")


def test_key_counts_on_the_master_double_are_exact() -> None:
    keys = [f"rl-a@m@{i:x}" for i in range(3000)] + [f"svc-b@m@{i:x}" for i in range(7001)] + ["rl-a"]
    with DoubleFleet() as fleet:
        address = fleet.add_master(MasterDouble(SharedStore(keys)))

        async def go() -> tuple[KeyCount, int, int]:
            async with MasterAdmin(address) as admin:
                return await admin.key_counts("rl-a@"), await admin.key_count(), await admin.key_count("svc-b@")
        assert asyncio.run(go()) == (KeyCount(10002, 3000), 10002, 7001)


def test_a_listing_refused_by_a_standby_says_so() -> None:
    with DoubleFleet() as fleet:
        address = fleet.add_master(MasterDouble(SharedStore(["a"]), faults=Faults(status={"/get_all_keys": 503})))

        async def go() -> None:
            async with MasterAdmin(address) as admin:
                await admin.key_counts("a")
        with pytest.raises(NotLeader, match=r"GET /get_all_keys: HTTP 503: .*not the serving leader"):
            asyncio.run(go())


def test_an_unreachable_master_fails_the_count_clearly() -> None:
    async def go() -> None:
        async with MasterAdmin("127.0.0.1:1", timeout=0.5) as admin:
            await admin.key_counts("a")
    with pytest.raises(MasterError, match=r"127.0.0.1:1: GET /get_all_keys: .*Connect"):
        asyncio.run(go())


def test_calls_that_grow_with_the_keys_wait_longer_than_the_others() -> None:
    """remove_all and the listing answer only when done (seconds at millions of keys): slow_timeout
    bounds them; every other call keeps `timeout`."""
    faults = Faults(delay={"/api/v1/remove_all": 0.6, "/get_all_keys": 0.6, "/metrics": 0.6})
    with DoubleFleet() as fleet:
        address = fleet.add_master(MasterDouble(SharedStore(["a", "b"]), faults=faults))

        async def go() -> tuple[KeyCount, int]:
            async with MasterAdmin(address, timeout=0.2, slow_timeout=5.0) as admin:
                with pytest.raises(MasterError, match=r"GET /metrics: no answer within 0.2s"):
                    await admin.metrics()
                return await admin.key_counts("a"), await admin.remove_all()
        assert asyncio.run(go()) == (KeyCount(2, 1), 2)
    assert MasterAdmin("127.0.0.1:1", timeout=10).slow_timeout == 120.0
    assert MasterAdmin("127.0.0.1:1", timeout=300).slow_timeout == 300.0


# -- a server answering millions of keys: kvctl's memory stays flat ---------------------------------------
BLOCK_KEYS = 1000


def _block() -> tuple[bytes, int]:
    """1,000 vLLM-shaped keys (~90 bytes each), 50 of them rl-a's: the unit the listing repeats."""
    lines = [("rl-a" if i % 20 == 0 else "svc-b") + f"@Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{i:032x}"
             for i in range(BLOCK_KEYS)]
    return "".join(line + "\n" for line in lines).encode(), sum(1 for x in lines if x.startswith("rl-a@"))


@pytest.fixture
def listing_server() -> Iterator[tuple[str, int, int]]:
    """An HTTP/1.1 server that answers GET /get_all_keys with `copies` blocks: a listing of millions
    of keys from a constant buffer (so what the server allocates while it sends is next to nothing)."""
    block, mine = _block()
    copies = 2000  # 2,000,000 keys, ~180 MB of answer
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(None)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n" % (len(block) * copies))
                view = memoryview(block)
                for _ in range(copies):
                    conn.sendall(view)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{sock.getsockname()[1]}", BLOCK_KEYS * copies, mine * copies
    stop.set()
    thread.join(timeout=5)
    sock.close()


def test_counting_millions_of_keys_takes_constant_memory(listing_server: tuple[str, int, int]) -> None:
    address, total, mine = listing_server

    async def go() -> KeyCount:
        async with MasterAdmin(address, timeout=30) as admin:
            return await admin.key_counts("rl-a@")
    tracemalloc.start()
    try:
        counted = asyncio.run(go())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counted == KeyCount(total, mine)
    # the answer is ~180 MB; held as strings it was more. Counted: one chunk and one line at a time.
    assert peak < 4 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB while counting {total} keys"
