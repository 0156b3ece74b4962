"""Benchmark helper, run as its own process: a fleet of vLLM HTTP TEST DOUBLES on loopback.

The doubles (tests/doubles/) stand in for vLLM API servers; this process only
serves them, so the CPU and memory they cost are never charged to the kvctl process measured.

Usage: python benchmarks/fleet_server.py --replicas N --out DIR [--sizes 1,8,64] [--version V]
                                         [--delay S] [--connector NAME] [--cache-prefix P]

Starts N replicas in one process (one port each), writes DIR/inventory-K.yaml for each size K
(the first K replicas), prints `READY URL0` and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.doubles import DoubleFleet, Faults, VllmDouble  # noqa: E402


def raise_fd_limit() -> None:
    """One listening socket per replica plus one connection per client: lift the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def write_inventories(urls: list[str], sizes: list[int], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        lines = ["replicas:"] + [f"  - url: {u}" for u in urls[:size]]
        (out / f"inventory-{size}.yaml").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="")
    parser.add_argument("--version", default="0.23.0")
    parser.add_argument("--connector", default="MooncakeStoreConnector")
    parser.add_argument("--cache-prefix", default=None, help="the connector's cache_prefix (a scoped fleet)")
    parser.add_argument("--delay", type=float, default=0.0, help="server-side delay of /reset_prefix_cache (s)")
    args = parser.parse_args()
    raise_fd_limit()
    delay = {"/reset_prefix_cache": args.delay} if args.delay > 0 else {}
    # store=None: no shared store to model (cheap); the connector is still reported by /server_info,
    # so kvctl plans reset_external=true and, on >= 0.23.0, no master clear.
    replicas = [VllmDouble(args.version, connector=args.connector, store=None, faults=Faults(delay=dict(delay)),
                           cache_prefix=args.cache_prefix)
                for _ in range(args.replicas)]
    sizes = [int(s) for s in args.sizes.split(",") if s] or [args.replicas]
    with DoubleFleet(replicas=replicas) as fleet:
        write_inventories(fleet.urls, sizes, args.out)
        print(f"READY {fleet.urls[0]}", flush=True)
        for line in sys.stdin:  # serve until stdin closes; answer pings so the parent can sync
            print("OK " + line.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
