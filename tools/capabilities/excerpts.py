"""Committed excerpts of vLLM's and Mooncake's released sources: exactly the files the fact
extractors' unit tests read, so those tests run where neither the source cache
(~/.cache/kvctl/vllm-sources, `make capabilities`) nor the Mooncake mirror is.

    python -m tools.capabilities.excerpts        rebuild them (make release-excerpts)

Rebuilding runs the tests in TESTS against the cache and the mirror with recording on
(KVCTL_RECORD_SOURCES): tests/lib/release_sources.py then hands them trees that log every vLLM
file an extractor parses and every Mooncake file or grep snapshot_tree reads. Those files, byte
for byte, go into tests/data/release-sources/{vllm,mooncake}.tar.xz; manifest.json beside them
lists each file's sha256 (tests/unit/tools/test_release_excerpts.py holds the archives to it).

An excerpt answers like the whole release: each archive's index.json lists every file of each
vLLM release the cache holds, and the Mooncake greps made when it was built. Parsing a listed
file the excerpt lacks, or an unrecorded grep, raises ExcerptIncomplete: a test that starts
reading more fails (rebuild), instead of silently parsing nothing.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from functools import cached_property
from pathlib import Path

from packaging.version import Version

from tools.capabilities import fetch
from tools.capabilities import mooncake_facts as mf
from tools.capabilities.source import SourceTree

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests/data/release-sources"
VLLM_ARCHIVE = DATA / "vllm.tar.xz"
MOONCAKE_ARCHIVE = DATA / "mooncake.tar.xz"
MANIFEST = DATA / "manifest.json"
INDEX = "index.json"  # in each archive: what the excerpt trees need beyond the files
RECORD_ENV = "KVCTL_RECORD_SOURCES"
TESTS = tuple(f"tests/unit/tools/test_{name}_facts.py"
              for name in ("cli", "env", "offload_args", "offload", "mooncake"))
REGENERATE = ("make release-excerpts (needs the vLLM sources cache `make capabilities` fills "
              "and the Mooncake mirror at MOONCAKE_GIT_DIR)")


class ExcerptIncomplete(RuntimeError):
    """A test read a release file (or ran a grep) the committed excerpt was not built with."""


# --------------------------------------------------------------------------------------------
# Recording (rebuild time, on the real sources)


def recording() -> bool:
    return bool(os.environ.get(RECORD_ENV))


def _record(entry: dict) -> None:
    log = os.environ.get(RECORD_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


class RecordingTree(SourceTree):
    """A cached release that logs each file an extractor parses."""

    def __init__(self, root: Path, version: str) -> None:
        super().__init__(root)
        self.version = version

    def parse(self, path: str) -> ast.Module | None:
        if path not in self._parsed and (self.root / path).is_file():
            _record({"vllm": self.version, "path": path})
        return super().parse(path)


class RecordingGitTag(mf.GitTag):
    """A mirror's tag that logs each file read and each grep with what it found."""

    def __init__(self, git_dir: Path, tag: str, version: str) -> None:
        super().__init__(git_dir, tag)
        self.version = version

    def read(self, path: str) -> str:
        _record({"mooncake": self.version, "tag": self.tag, "read": path})
        return super().read(path)

    def files_containing(self, pattern: str, paths: tuple[str, ...]) -> list[str]:
        found = super().files_containing(pattern, paths)
        _record({"mooncake": self.version, "tag": self.tag, "grep": [pattern, list(paths), found]})
        return found


# --------------------------------------------------------------------------------------------
# Excerpt trees (test time, on an unpacked archive)


class ExcerptTree(SourceTree):
    """One vLLM release's excerpt, seen as the whole cached release: `files` and module_file
    know every file of it, and parsing one left out raises rather than returning None."""

    def __init__(self, root: Path, version: str, listing: list[str]) -> None:
        super().__init__(root)
        self.version = version
        self.listing = frozenset(listing)

    @cached_property
    def files(self) -> list[str]:
        return sorted(self.listing)

    def parse(self, path: str) -> ast.Module | None:
        if path in self.listing and not (self.root / path).is_file():
            raise ExcerptIncomplete(f"vLLM {self.version}: {path} is not in {VLLM_ARCHIVE.name}; "
                                    f"rebuild the excerpts: {REGENERATE}")
        return super().parse(path)

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((c for c in (base + ".py", base + "/__init__.py") if c in self.listing), None)


def grep(root: Path, pattern: str, paths: list[str] | tuple[str, ...]) -> list[str]:
    """`git grep -l -E pattern -- paths` over a folder: line by line, as git matches (Python's re
    reads the extractors' patterns, \\b, \\s and alternation, as git's extended regex does)."""
    regex = re.compile(pattern)
    found = set()
    for base in paths:
        target = root / base
        candidates = [target] if target.is_file() else sorted(target.rglob("*"))
        for file in candidates:
            lines = file.read_text(encoding="utf-8", errors="replace").splitlines() if file.is_file() else []
            if any(regex.search(line) for line in lines):
                found.add(file.relative_to(root).as_posix())
    return sorted(found)


class FolderTag:
    """One Mooncake release's excerpt as mooncake_facts.snapshot_tree reads it: the files, and
    greps over them limited to those recorded at build time (another might match a file left out)."""

    def __init__(self, root: Path, version: str, greps: list[list]) -> None:
        self.root, self.version = root, version
        self.queries = [(pattern, list(paths)) for pattern, paths, _ in greps]

    def read(self, path: str) -> str:
        file = self.root / path
        if not file.is_file():
            raise ExcerptIncomplete(f"Mooncake {self.version}: {path} is not in {MOONCAKE_ARCHIVE.name}; "
                                    f"rebuild the excerpts: {REGENERATE}")
        return file.read_text(encoding="utf-8", errors="replace")

    def files_containing(self, pattern: str, paths: tuple[str, ...]) -> list[str]:
        if (pattern, list(paths)) not in self.queries:
            raise ExcerptIncomplete(f"Mooncake {self.version}: grep {pattern!r} in {list(paths)} was not "
                                    f"recorded in {MOONCAKE_ARCHIVE.name}; rebuild the excerpts: {REGENERATE}")
        return grep(self.root, pattern, paths)


def unpack(archive: Path, dest: Path) -> dict:
    """Unpack one archive into dest; returns its index."""
    with tarfile.open(archive, "r:xz") as tar:
        # filter="data" refuses links and paths outside dest (Pythons without it: trusted input).
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return json.loads((dest / INDEX).read_text())


def vllm_excerpt(root: Path, version: str) -> ExcerptTree | None:
    """The release's tree in an unpacked vllm.tar.xz, or None when it holds no such release."""
    listing = json.loads((root / INDEX).read_text()).get(version)
    return None if listing is None else ExcerptTree(root / version, version, listing)


def mooncake_excerpt(root: Path, version: str) -> FolderTag | None:
    entry = json.loads((root / INDEX).read_text()).get(version)
    return None if entry is None else FolderTag(root / version, version, entry["greps"])


# --------------------------------------------------------------------------------------------
# Rebuilding


def run_tests(log: Path) -> None:
    """The tests on the real sources, logging what they read into `log`."""
    env = {**os.environ, RECORD_ENV: str(log)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                          cwd=REPO, env=env, check=False)
    if done.returncode:
        # A test stopped early may not have read everything: an excerpt from it would be short.
        raise SystemExit("the tests fail on the real sources themselves: fix that before rebuilding")


def read_log(log: Path) -> tuple[dict[str, set[str]], dict[str, dict]]:
    """({vLLM version: files parsed}, {Mooncake version: {tag, reads, greps}}) from a log."""
    vllm: dict[str, set[str]] = {}
    mooncake: dict[str, dict] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if "vllm" in entry:
            vllm.setdefault(entry["vllm"], set()).add(entry["path"])
            continue
        release = mooncake.setdefault(entry["mooncake"], {"tag": entry["tag"], "reads": set(), "greps": []})
        if "read" in entry:
            release["reads"].add(entry["read"])
        elif entry["grep"] not in release["greps"]:
            release["greps"].append(entry["grep"])
    return vllm, mooncake


def vllm_members(used: dict[str, set[str]]) -> tuple[dict, dict[str, bytes]]:
    """(index: version -> every file of the cached release, member name -> bytes)."""
    index, files = {}, {}
    for version, paths in used.items():
        if not fetch._is_cached(fetch.CACHE_ROOT, version):
            raise SystemExit(f"vLLM {version} is not in {fetch.CACHE_ROOT}: make capabilities")
        root = fetch.CACHE_ROOT / version
        index[version] = SourceTree(root).files
        files.update({f"{version}/{path}": (root / path).read_bytes() for path in paths})
    return index, files


def mooncake_members(used: dict[str, dict]) -> tuple[dict, dict[str, bytes]]:
    """(index: version -> {tag, greps}, member name -> bytes): every file read or grep-matched,
    so a grep over the excerpt finds what git grep found (checked here)."""
    index, files = {}, {}
    for version, release in used.items():
        tag = mf.GitTag(mf.DEFAULT_GIT_DIR, release["tag"])
        paths = release["reads"] | {path for _, _, found in release["greps"] for path in found}
        texts = {path: tag.read(path) for path in sorted(paths)}
        with tempfile.TemporaryDirectory() as tmp:
            for path, text in texts.items():
                (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / path).write_text(text, encoding="utf-8")
            for pattern, where, found in release["greps"]:
                if grep(Path(tmp), pattern, where) != found:
                    raise SystemExit(f"Mooncake {version}: grep {pattern!r} over the excerpt differs from git grep")
        index[version] = {"tag": release["tag"], "greps": release["greps"]}
        files.update({f"{version}/{path}": text.encode("utf-8") for path, text in texts.items()})
    return index, files


def _member_order(name: str) -> tuple[str, Version]:
    # A file's copies across releases side by side: xz then stores the later ones as small diffs.
    version, path = name.split("/", 1)
    return path, Version(version)


def write_archive(archive: Path, index: dict, files: dict[str, bytes]) -> None:
    """A reproducible tar.xz (no times, owners or modes from this machine)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    members = [(INDEX, (json.dumps(index, indent=1, sort_keys=True) + "\n").encode())]
    members += [(name, files[name]) for name in sorted(files, key=_member_order)]
    with tarfile.open(archive, "w:xz", preset=9 | lzma.PRESET_EXTREME, format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))


def manifest_entry(files: dict[str, bytes]) -> dict[str, dict[str, str]]:
    """version -> path -> sha256: what the unit test holds each archive (and the cache) to."""
    out: dict[str, dict[str, str]] = {}
    for name in sorted(files, key=lambda n: (Version(n.split("/", 1)[0]), n)):
        version, path = name.split("/", 1)
        out.setdefault(version, {})[path] = sha256(files[name])
    return out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rebuild() -> dict[str, int]:
    """Record, then write both archives and the manifest; returns each archive's size."""
    if not (mf.DEFAULT_GIT_DIR / "HEAD").exists():
        raise SystemExit(f"no Mooncake mirror at {mf.DEFAULT_GIT_DIR} (set MOONCAKE_GIT_DIR)")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "reads.jsonl"
        run_tests(log)
        vllm_used, mooncake_used = read_log(log)
    manifest = {"about": "The release files tests/lib/release_sources.py serves where the real sources "
                         "are absent. Rebuilt by python -m tools.capabilities.excerpts."}
    for archive, (index, files) in ((VLLM_ARCHIVE, vllm_members(vllm_used)),
                                    (MOONCAKE_ARCHIVE, mooncake_members(mooncake_used))):
        write_archive(archive, index, files)
        manifest[archive.name] = manifest_entry(files)
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return {archive.name: archive.stat().st_size for archive in (VLLM_ARCHIVE, MOONCAKE_ARCHIVE)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.capabilities.excerpts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    sizes = rebuild()
    print(f"wrote {DATA.relative_to(REPO)}: {json.dumps(sizes)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
