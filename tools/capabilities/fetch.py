"""Fetch the few Python sources kvctl's facts need from every vLLM release on PyPI.

A vLLM wheel is ~300-400 MB, almost all of it compiled kernels; the sources we parse are a few
hundred kB. So we read the zip's central directory with HTTP range requests, pick the members we
need, and download only their byte ranges (coalesced, so a release costs a handful of requests).
Extracted files are cached under ~/.cache/kvctl/vllm-sources/<version>/ with their in-package
paths; a re-run (or --offline) never touches the network.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urljoin

import httpx
from packaging.version import Version

PYPI_JSON = "https://pypi.org/pypi/vllm/json"
FIRST_RELEASE = Version("0.8.5")
CACHE_ROOT = Path(os.environ.get("KVCTL_VLLM_SOURCES", Path.home() / ".cache/kvctl/vllm-sources"))
MARKER = ".complete.json"  # written last: a release dir without it is an interrupted fetch

# Everything the extractors read. Whole subtrees rather than single files because modules moved
# between releases (vllm/config.py -> vllm/config/kv_transfer.py, api_server.py -> serve routers).
MEMBER_PATTERNS = (
    "vllm/config.py",
    "vllm/config/*.py",
    "vllm/distributed/kv_transfer/*",
    "vllm/entrypoints/*",
    "vllm/engine/*",
    "vllm/v1/engine/*",
    "vllm/envs.py",
    "vllm/distributed/mooncake*",  # MooncakeStoreConfig moved here (0.3x)
    "vllm/v1/kv_offload/*",  # OffloadingConnector's specs and their factory (0.11+)
    "vllm/v1/simple_kv_offload/*",  # SimpleCPUOffloadConnector's manager and worker
)

# Ranges closer than this are fetched in one request: fewer round trips beat a few wasted kB.
COALESCE_GAP = 128 * 1024
# A local file header is 30 bytes + name + extra; the extra field length is only known once read,
# so we over-fetch a little past what the central directory says.
LOCAL_HEADER_SLACK = 30 + 1024


def wanted(name: str) -> bool:
    return name.endswith(".py") and any(fnmatch(name, pat) for pat in MEMBER_PATTERNS)


@dataclass
class Release:
    version: str
    wheel_url: str
    wheel_name: str
    wheel_size: int


def list_releases(client: httpx.Client) -> list[Release]:
    """Every final (non pre-release) vLLM release >= 0.8.5 with a manylinux x86_64 wheel."""
    resp = client.get(PYPI_JSON).raise_for_status()
    data = resp.json()
    releases: list[Release] = []
    for version, files in data["releases"].items():
        parsed = Version(version)
        if parsed.is_prerelease or parsed.is_devrelease or parsed < FIRST_RELEASE:
            continue
        wheel = _pick_wheel(files)
        if wheel is not None:
            # Some PyPI mirrors answer with URLs relative to the JSON document.
            url = urljoin(str(resp.url), wheel["url"])
            releases.append(Release(version, url, wheel["filename"], wheel["size"]))
    return sorted(releases, key=lambda r: Version(r.version))


def _pick_wheel(files: list[dict]) -> dict | None:
    # Any x86_64 manylinux wheel: the Python sources are identical across platform wheels.
    for f in sorted(files, key=lambda f: f["filename"]):
        if f["filename"].endswith(".whl") and "manylinux" in f["filename"] and "x86_64" in f["filename"]:
            return f
    return None


@dataclass
class RangeFile(io.RawIOBase):
    """A read-only seekable file over HTTP range requests, with prefetched chunks.

    zipfile only needs seek/tell/read; every read is served from a prefetched chunk when it
    fits, otherwise fetched on demand (and counted, so we can report the bytes downloaded).
    """

    client: httpx.Client
    url: str
    size: int
    pos: int = 0
    chunks: list[tuple[int, bytes]] = field(default_factory=list)
    downloaded: int = 0
    requests: int = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes [start, end) from the server, kept as a chunk for later reads."""
        end = min(end, self.size)
        resp = self.client.get(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        resp.raise_for_status()
        if resp.status_code != 206:
            raise RuntimeError(f"{self.url}: server ignored the Range header")
        data = resp.content
        self.downloaded += len(data)
        self.requests += 1
        self.chunks.append((start, data))
        return data

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        data = self._from_chunks(self.pos, n)
        if data is None:
            # Unplanned read: fetch at least 64 kB so zipfile's small header reads don't each cost a request.
            self.fetch(self.pos, self.pos + max(n, 64 * 1024))
            data = self._from_chunks(self.pos, n)
            assert data is not None
        self.pos += len(data)
        return data

    def readinto(self, buffer) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _from_chunks(self, start: int, n: int) -> bytes | None:
        for chunk_start, chunk in self.chunks:
            if chunk_start <= start and start + n <= chunk_start + len(chunk):
                offset = start - chunk_start
                return chunk[offset : offset + n]
        return None


def coalesce(ranges: Iterable[tuple[int, int]], gap: int = COALESCE_GAP) -> list[tuple[int, int]]:
    """Merge [start, end) ranges that overlap or lie within `gap` bytes of each other."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _open_wheel(client: httpx.Client, release: Release) -> tuple[zipfile.ZipFile, RangeFile]:
    remote = RangeFile(client, release.wheel_url, release.wheel_size)
    # The end-of-central-directory record sits in the last 64 kB + 22 bytes; the central
    # directory itself (a few hundred kB for vLLM) just before it. Fetch the tail once, then
    # the whole directory in one request, so ZipFile's parsing costs no further round trips.
    tail_start = max(0, release.wheel_size - 66 * 1024)
    tail = remote.fetch(tail_start, release.wheel_size)
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise RuntimeError(f"{release.wheel_name}: no end of central directory (zip64-only?)")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
    if cd_offset < tail_start:
        remote.fetch(cd_offset, tail_start)
    return zipfile.ZipFile(remote), remote


def fetch_release(client: httpx.Client, release: Release, root: Path = CACHE_ROOT) -> dict:
    """Download the wanted members of one release into root/<version>/; returns its marker."""
    dest = root / release.version
    marker = dest / MARKER
    meta = _marker(root, release.version)
    if meta is not None and _covers(meta):
        return meta
    # Not cached, or cached before the member list grew: fetch it again. The old marker goes
    # first, so an interrupted refetch is never mistaken for a complete one.
    marker.unlink(missing_ok=True)
    archive, remote = _open_wheel(client, release)
    members = [info for info in archive.infolist() if wanted(info.filename)]
    spans = [(i.header_offset, i.header_offset + LOCAL_HEADER_SLACK + len(i.filename) + i.compress_size)
             for i in members]
    for start, end in coalesce(spans):
        remote.fetch(start, end)
    for info in members:
        target = dest / info.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(archive.read(info))
    meta = {"version": release.version, "wheel": release.wheel_name, "files": len(members),
            "bytes_downloaded": remote.downloaded, "requests": remote.requests,
            "patterns": list(MEMBER_PATTERNS)}
    marker.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def _marker(root: Path, version: str) -> dict | None:
    marker = root / version / MARKER
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None  # absent, or cut short mid-write: not complete


def _covers(meta: dict) -> bool:
    """Was this release fetched with every member pattern wanted now? A cache from before the
    list grew (vllm/v1/kv_offload was added later) lacks files an extractor reads."""
    return set(MEMBER_PATTERNS) <= set(meta.get("patterns", ()))


def _is_cached(root: Path, version: str) -> bool:
    meta = _marker(root, version)
    return meta is not None and _covers(meta)


def cached_versions(root: Path = CACHE_ROOT) -> list[str]:
    """Releases fully present in the cache with today's members, oldest first (what --offline
    works from)."""
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if p.is_dir() and _is_cached(root, p.name)]
    return sorted(found, key=Version)


def stale_versions(root: Path = CACHE_ROOT) -> list[str]:
    """Releases cached complete but with fewer members than wanted now (refetch: go online)."""
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if p.is_dir() and _marker(root, p.name) is not None
             and not _is_cached(root, p.name)]
    return sorted(found, key=Version)


def fetch_all(root: Path = CACHE_ROOT, workers: int = 6,
              only: list[str] | None = None) -> tuple[list[str], list[dict]]:
    """Fetch every release not yet cached (or only the versions in `only`).
    Returns (ordered versions, metas of new downloads)."""
    with httpx.Client(timeout=120, follow_redirects=True) as client:
        releases = list_releases(client)
        if only is not None:
            missing = set(only) - {r.version for r in releases}
            if missing:
                raise SystemExit(f"not on the package index: {', '.join(sorted(missing))}")
            newer = [r.version for r in releases if r.version not in only
                     and Version(r.version) > Version(only[-1])]
            if newer:
                print(f"note: newer vLLM releases on the index, not in the facts yet: "
                      f"{', '.join(newer)} (make capabilities adds them)", file=sys.stderr)
            releases = [r for r in releases if r.version in only]
        todo = [r for r in releases if not _is_cached(root, r.version)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            metas = list(pool.map(lambda r: fetch_release(client, r, root), todo))
    (root / "releases.json").write_text(json.dumps([r.version for r in releases], indent=1) + "\n")
    return [r.version for r in releases], metas


def release_list(root: Path = CACHE_ROOT) -> list[str]:
    """The release list saved by the last online run (falls back to what is cached)."""
    saved = root / "releases.json"
    if saved.exists():
        return json.loads(saved.read_text())
    return cached_versions(root)
