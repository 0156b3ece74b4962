"""Real released sources for the fact extractors' tests (tests/unit/tools/test_*_facts.py).

vllm_tree(version) is the release in the source cache (fetch.CACHE_ROOT, `make capabilities`)
when it is there, else its excerpt in tests/data/release-sources/vllm.tar.xz; mooncake_tree(version)
the tag in the Mooncake mirror (MOONCAKE_GIT_DIR), else its excerpt in mooncake.tar.xz. Each archive
is unpacked once per session into a temporary folder. Neither there: the test fails, saying how
to rebuild the excerpts (tools/capabilities/excerpts.py), never skips.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import NoReturn

import pytest

from tests.lib import REPO
from tools.capabilities import excerpts, fetch
from tools.capabilities import mooncake_facts as mf
from tools.capabilities.source import SourceTree


@cache
def unpacked(archive: Path) -> Path | None:
    """The archive unpacked into a temporary folder (once per session; removed at exit), or None."""
    if not archive.is_file():
        return None
    dest = Path(tempfile.mkdtemp(prefix="kvctl-release-sources-"))
    atexit.register(shutil.rmtree, dest, True)
    excerpts.unpack(archive, dest)
    return dest


def _missing(what: str, real: Path, archive: Path) -> NoReturn:
    if excerpts.recording():  # rebuilding reads the real sources only
        pytest.fail(f"{what} is not in {real}, which rebuilding the excerpts reads", pytrace=False)
    pytest.fail(f"{what} is neither in {real} nor in {archive.relative_to(REPO)}: put the real sources "
                f"there, then rebuild the excerpts with {excerpts.REGENERATE}", pytrace=False)


def vllm_tree(version: str) -> SourceTree:
    """vLLM release `version`'s sources, as the extractors read them."""
    if fetch._is_cached(fetch.CACHE_ROOT, version):
        cached = fetch.CACHE_ROOT / version
        return excerpts.RecordingTree(cached, version) if excerpts.recording() else SourceTree(cached)
    root = None if excerpts.recording() else unpacked(excerpts.VLLM_ARCHIVE)
    tree = excerpts.vllm_excerpt(root, version) if root else None
    if tree is None:
        _missing(f"vLLM {version}'s sources", fetch.CACHE_ROOT, excerpts.VLLM_ARCHIVE)
    return tree


def mooncake_tree(version: str) -> mf.ReleaseTree:
    """Mooncake's release `version` (tag v<version>), as mooncake_facts.snapshot_tree reads it."""
    if (mf.DEFAULT_GIT_DIR / "HEAD").exists():
        tag = f"v{version}"
        return excerpts.RecordingGitTag(mf.DEFAULT_GIT_DIR, tag, version) if excerpts.recording() \
            else mf.GitTag(mf.DEFAULT_GIT_DIR, tag)
    root = None if excerpts.recording() else unpacked(excerpts.MOONCAKE_ARCHIVE)
    tree = excerpts.mooncake_excerpt(root, version) if root else None
    if tree is None:
        _missing(f"Mooncake {version}'s sources", mf.DEFAULT_GIT_DIR, excerpts.MOONCAKE_ARCHIVE)
    return tree
