"""Command line: fetch, extract, generate, check (see tools/capabilities/__init__.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tools.capabilities import fetch, snapshot
from tools.capabilities.merge import build, check_committed, dumps

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "kvctl/data/vllm_facts.json"
HEADER = {"schema": 1, "generated_by": "tools/capabilities (make capabilities)"}


def generate(offline: bool, root: Path = fetch.CACHE_ROOT,
             only: list[str] | None = None) -> tuple[str, dict]:
    """The facts document as text, plus run statistics. `only`: these releases, not every one
    on the index (--check regenerates exactly the releases the committed file covers)."""
    started = time.monotonic()
    stats: dict = {"downloaded_bytes": 0}
    if offline:
        wanted = only or fetch.release_list(root)
        stale = [v for v in wanted if v in fetch.stale_versions(root)]
        if stale:  # facts from fewer files than the extractors read would be silently wrong
            raise SystemExit(f"the source cache of {', '.join(stale)} predates members the extractors read now "
                             f"({root}): run once without --offline to refetch them")
        releases = [v for v in wanted if v in fetch.cached_versions(root)]
    else:
        releases, metas = fetch.fetch_all(root, only=only)
        stats["downloaded_bytes"] = sum(m["bytes_downloaded"] for m in metas)
        stats["fetched_releases"] = len(metas)
    stats["fetch_seconds"] = round(time.monotonic() - started, 2)
    # Parsing dominates (~2 s a release): one process per core.
    with ProcessPoolExecutor() as pool:
        snapshots = dict(zip(releases, pool.map(snapshot, [root / v for v in releases])))
    stats["releases"] = len(releases)
    stats["total_seconds"] = round(time.monotonic() - started, 2)
    return dumps(build(releases, snapshots, HEADER)), stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.capabilities", description=__doc__)
    parser.add_argument("--offline", action="store_true", help="use only the source cache")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    parser.add_argument("--only-source", type=Path, help="print the snapshot of one source tree (holding vllm/)")
    parser.add_argument("--version", help="label for --only-source output")
    args = parser.parse_args(argv)
    if args.only_source:
        print(json.dumps({"version": args.version, **snapshot(args.only_source)}, indent=2, sort_keys=True))
        return 0
    if args.check:  # the releases the committed file covers: a new upstream release is not drift
        committed = json.loads(OUTPUT.read_text())["releases"] if OUTPUT.exists() else None
        return check_committed(OUTPUT, generate(args.offline, only=committed)[0], str(OUTPUT.relative_to(REPO)),
                               "make capabilities")
    text, stats = generate(args.offline)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}: {json.dumps(stats)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
