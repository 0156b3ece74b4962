"""Benchmark helper, run as its own process: a real Mooncake store client that fills the master.

Usage: python benchmarks/store_filler.py --master 127.0.0.1:RPC_PORT [--clear-once]

Connects (tcp, P2PHANDSHAKE, loopback only), prints `READY` and answers one-line commands on
stdin until it closes (a client's keys vanish from the master when it goes, so it stays alive):
  fill N    put N new small keys with put_batch        -> "OK <seconds>"
  fillp P N [FIRST]  put N new small keys named like vLLM's MooncakeStoreConnector's, under prefix P
            (P@Qwen/Qwen3-8B@tp_rank:0@...@<hash>, ~90 bytes; numbered from FIRST) -> "OK <seconds>"
  clear     MooncakeDistributedStore.remove_all(force=True), timed -> "OK <removed> <seconds>"
  rmre R    remove_by_regex(R, force=True), timed      -> "OK <removed> <seconds>"

--clear-once: what a user without kvctl runs from scratch: set up a client, remove_all(force=True),
close; prints one JSON line with the setup, call and close times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MB = 1024 * 1024
BATCH = 2000
VALUE = b"v" * 32


def connect(master: str, segment_mb: int):  # type: ignore[no-untyped-def]
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment_mb * MB, 16 * MB, "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"setup returned {rc}")
    return store


# the shape of a vLLM MooncakeStoreConnector key (cache_prefix@model@tp_rank@...@block hash)
VLLM_KEY = "{prefix}@Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{generation:04x}{i:028x}"


def fill(store, count: int, generation: int, prefix: str | None = None,  # type: ignore[no-untyped-def]
         offset: int = 0) -> float:
    start = time.perf_counter()
    for first in range(offset, offset + count, BATCH):
        span = range(first, min(offset + count, first + BATCH))
        keys = [f"bench-{generation}-{i}" for i in span] if prefix is None else \
            [VLLM_KEY.format(prefix=prefix, generation=generation, i=i) for i in span]
        rc = store.put_batch(keys, [VALUE] * len(keys))
        if rc != 0:
            raise RuntimeError(f"put_batch returned {rc} at key {first}")
    return time.perf_counter() - start


def clear_once(master: str) -> int:
    began = time.perf_counter()
    store = connect(master, 16)
    ready = time.perf_counter()
    removed = store.remove_all(True)
    done = time.perf_counter()
    store.close()
    print(json.dumps({"setup_s": ready - began, "call_s": done - ready, "close_s": time.perf_counter() - done,
                      "removed": removed}), flush=True)
    return 0 if removed >= 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True, help="host:port of the master's RPC port")
    parser.add_argument("--segment-mb", type=int, default=1024)
    parser.add_argument("--clear-once", action="store_true")
    args = parser.parse_args()
    if args.clear_once:
        return clear_once(args.master)
    try:
        store = connect(args.master, args.segment_mb)
    except RuntimeError as exc:
        print(f"ERROR {exc}", flush=True)
        return 2
    print("READY", flush=True)
    generation = 0
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["fill"] and len(words) == 2:
                generation += 1
                print(f"OK {fill(store, int(words[1]), generation):.6f}", flush=True)
            elif words[:1] == ["fillp"] and len(words) in (3, 4):  # fillp P N [FIRST]: key numbers from FIRST
                generation += 1
                first = int(words[3]) if len(words) == 4 else 0
                print(f"OK {fill(store, int(words[2]), generation, words[1], first):.6f}", flush=True)
            elif words[:1] == ["rmre"] and len(words) == 2:
                start = time.perf_counter()
                removed = store.remove_by_regex(words[1], True)
                print(f"OK {removed} {time.perf_counter() - start:.6f}", flush=True)
            elif words == ["clear"]:
                start = time.perf_counter()
                removed = store.remove_all(True)
                print(f"OK {removed} {time.perf_counter() - start:.6f}", flush=True)
            else:
                print(f"ERROR unknown command {line.strip()!r}", flush=True)
        except (RuntimeError, ValueError) as exc:
            print(f"ERROR {exc}", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
