"""Test helper, run as a separate process: a real Mooncake store client that writes keys.

Usage: python store_writer.py --master 127.0.0.1:RPC_PORT --count N [--prefix P] [--value-size B] [--tenant T]

Connects to the master (tcp, P2PHANDSHAKE, loopback only), puts N keys named
f"{prefix}key-{i}" (or, where the prefix has an "@", shaped as vLLM's: key_name), reads the first one back (so it holds a read lease), prints
"READY key..." on stdout, then stays alive until stdin closes or it gets SIGTERM: a writer's
keys vanish from the master when it closes, so tests keep it alive during their assertions. --tenant T
sets the client up in Mooncake tenant T, as vLLM >= 0.28 does with mooncake.json's tenant_id
(vllm/distributed/mooncake_store.py setup_mooncake_store: tenant_id as a keyword, only when not "default").

While alive it answers one-line commands on stdin (one answer line each, "OK ..." or "ERROR ..."):
  put COUNT [PREFIX]   put COUNT more keys named key_name(PREFIX, I) -> "OK key..."
  get KEY              read KEY (renews its read lease)    -> "OK <bytes>"
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

MB = 1024 * 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True, help="host:port of the master's RPC port")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", default="")
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--segment-mb", type=int, default=32)
    parser.add_argument("--buffer-mb", type=int, default=16)
    parser.add_argument("--tenant", default="default")
    args = parser.parse_args()

    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")

    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    tenant = {"tenant_id": args.tenant} if args.tenant != "default" else {}
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", args.segment_mb * MB, args.buffer_mb * MB,
                     "tcp", "", args.master, **tenant)
    if rc != 0:
        print(f"ERROR setup returned {rc}", flush=True)
        return 2

    value = b"x" * args.value_size

    def put(count: int, prefix: str) -> list[str]:
        keys = [key_name(prefix, i) for i in range(count)]
        for key in keys:
            rc = store.put(key, value)
            if rc != 0:
                raise RuntimeError(f"put {key} returned {rc}")
        return keys

    def get(key: str) -> int:
        got = store.get(key)  # a read grants the key a lease of --default_kv_lease_ttl
        if got != value:
            raise RuntimeError(f"get {key} returned {len(got)} bytes")
        return len(got)

    try:
        keys = put(args.count, args.prefix)
        if keys:
            get(keys[0])
    except RuntimeError as exc:
        print(f"ERROR {exc}", flush=True)
        return 3

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def serve_stdin() -> None:
        for line in sys.stdin:
            words = line.split()
            try:
                if words and words[0] == "put" and len(words) in (2, 3):
                    answer = " ".join(put(int(words[1]), words[2] if len(words) == 3 else ""))
                elif words and words[0] == "get" and len(words) == 2:
                    answer = str(get(words[1]))
                else:
                    raise RuntimeError(f"unknown command {line.strip()!r}")
                print(f"OK {answer}".rstrip(), flush=True)
            except (RuntimeError, ValueError) as exc:
                print(f"ERROR {exc}", flush=True)
        stop.set()  # stdin closed

    threading.Thread(target=serve_stdin, daemon=True).start()
    print("READY " + " ".join(keys), flush=True)
    while not stop.wait(0.2):  # a timeout keeps the main thread responsive to SIGTERM
        pass
    store.close()
    return 0


def key_name(prefix: str, i: int) -> str:
    """Under a deployment's prefix ("rl-a@", or "rl-a@MODEL" to name the model): a key shaped as vLLM's
    MooncakeStoreConnector writes it (<cache_prefix>@<model>@tp_rank:0@...@<hash hex>), which a scoped
    clear matches whole; without an '@', PREFIXkey-I."""
    if "@" not in prefix:
        return f"{prefix}key-{i}"
    deployment, _, model = prefix.rpartition("@")
    return f"{deployment}@{model or 'tiny'}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{i:032x}"


if __name__ == "__main__":
    sys.exit(main())
