"""Benchmark helper, run as its own process: the floor of the fan-out rig.

Sends exactly the requests `kvctl reset --connector` sends to N vLLM >= 0.16 replicas, in the
same phases (read /version and /server_info of all; ask /is_paused and pause all, as kvctl does so
that a replica its owner paused stays paused; reset prefix/mm/encoder caches of all; resume all), with the leanest async client at hand (aiohttp, one connection per replica, no
retries, no parsing beyond the status), all replicas at once. Whatever kvctl takes beyond this is
kvctl's own cost; what this takes is the rig's (client + the doubles' server, on the same cores).

Usage: python benchmarks/floor_client.py INVENTORY.yaml  -> prints {"total_s": ..., "requests": ...}
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp
import yaml

RESET = "/reset_prefix_cache?reset_running_requests=false&reset_external=true"
PHASES: list[list[tuple[str, str]]] = [
    [("GET", "/version"), ("GET", "/server_info?config_format=json")],
    [("GET", "/is_paused"), ("POST", "/pause?mode=wait&clear_cache=false")],
    [("POST", RESET), ("POST", "/reset_mm_cache"), ("POST", "/reset_encoder_cache")],
    [("POST", "/resume")],
]


async def main(urls: list[str]) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=1)
    count = 0
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:

        async def replica(url: str, calls: list[tuple[str, str]]) -> None:
            nonlocal count
            for method, path in calls:
                async with session.request(method, url + path) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{method} {url}{path}: HTTP {response.status}")
                count += 1

        for calls in PHASES:
            await asyncio.gather(*(replica(u, calls) for u in urls))
    return {"total_s": time.perf_counter() - start, "requests": count}


if __name__ == "__main__":
    inventory = yaml.safe_load(open(sys.argv[1]).read())
    print(json.dumps(asyncio.run(main([r["url"] for r in inventory["replicas"]]))))
