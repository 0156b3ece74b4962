"""tests/data/release-sources (tools/capabilities/excerpts.py): the committed excerpts of vLLM's and
Mooncake's released sources hold exactly the files manifest.json records, byte for byte the real
ones where this machine has them, and an excerpt refuses to stand in for a file it lacks."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.lib import release_sources
from tools.capabilities import excerpts, fetch
from tools.capabilities import mooncake_facts as mf
from tools.capabilities.source import SourceTree

MANIFEST = json.loads(excerpts.MANIFEST.read_text())
ARCHIVES = (excerpts.VLLM_ARCHIVE, excerpts.MOONCAKE_ARCHIVE)


def _members(archive: Path) -> dict[str, str]:
    """member name -> sha256, the index aside."""
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: excerpts.sha256(tar.extractfile(m).read()) for m in tar.getmembers()
                if m.isfile() and m.name != excerpts.INDEX}


def _index(archive: Path) -> dict:
    return json.loads((release_sources.unpacked(archive) / excerpts.INDEX).read_text())


@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda a: a.name)
def test_each_archive_holds_exactly_the_manifests_files(archive: Path) -> None:
    recorded = {f"{version}/{path}": sha for version, files in MANIFEST[archive.name].items()
                for path, sha in files.items()}
    assert _members(archive) == recorded
    assert set(_index(archive)) == set(MANIFEST[archive.name])


def test_each_vllm_excerpt_file_is_a_file_of_its_release() -> None:
    listings = _index(excerpts.VLLM_ARCHIVE)
    for version, files in MANIFEST[excerpts.VLLM_ARCHIVE.name].items():
        assert set(files) <= set(listings[version]), version


def test_greps_over_the_mooncake_excerpt_find_what_git_grep_found() -> None:
    root = release_sources.unpacked(excerpts.MOONCAKE_ARCHIVE)
    for version, entry in _index(excerpts.MOONCAKE_ARCHIVE).items():
        for pattern, paths, found in entry["greps"]:
            assert excerpts.grep(root / version, pattern, paths) == found, (version, pattern)


def test_the_real_sources_here_match_the_excerpts() -> None:
    """Wherever the cache or the mirror holds a release of the excerpts (none on a bare machine:
    then there is nothing to compare), its files are the excerpt's, and so is its file list."""
    listings = _index(excerpts.VLLM_ARCHIVE)
    for version, files in MANIFEST[excerpts.VLLM_ARCHIVE.name].items():
        if fetch._is_cached(fetch.CACHE_ROOT, version):
            root = fetch.CACHE_ROOT / version
            assert SourceTree(root).files == listings[version], version
            assert {p: excerpts.sha256((root / p).read_bytes()) for p in files} == files, version
    if (mf.DEFAULT_GIT_DIR / "HEAD").exists():
        for version, entry in _index(excerpts.MOONCAKE_ARCHIVE).items():
            tag = mf.GitTag(mf.DEFAULT_GIT_DIR, entry["tag"])
            files = MANIFEST[excerpts.MOONCAKE_ARCHIVE.name][version]
            assert {p: excerpts.sha256(tag.read(p).encode()) for p in files} == files, version


def test_an_excerpt_refuses_to_stand_in_for_a_file_it_lacks(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm/a.py").write_text("A = 1\n")
    tree = excerpts.ExcerptTree(tmp_path, "9.9.9", ["vllm/a.py", "vllm/b/__init__.py"])
    assert tree.files == ["vllm/a.py", "vllm/b/__init__.py"]  # the release's, not the folder's
    assert tree.module_file("vllm.b") == "vllm/b/__init__.py" and tree.module_file("vllm.c") is None
    assert tree.parse("vllm/a.py") is not None and tree.parse("vllm/c.py") is None  # c: not in the release
    with pytest.raises(excerpts.ExcerptIncomplete, match="vllm/b/__init__.py is not in vllm.tar.xz"):
        tree.parse("vllm/b/__init__.py")
    tag = excerpts.FolderTag(tmp_path, "9.9.9", [["A =", ["vllm"], ["vllm/a.py"]]])
    assert tag.files_containing("A =", ("vllm",)) == ["vllm/a.py"]
    with pytest.raises(excerpts.ExcerptIncomplete, match="was not recorded"):
        tag.files_containing("B =", ("vllm",))
    with pytest.raises(excerpts.ExcerptIncomplete, match="make release-excerpts"):
        tag.read("vllm/b/__init__.py")


def test_a_release_in_neither_place_fails_saying_how_to_rebuild(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setattr(fetch, "CACHE_ROOT", tmp_path)
    monkeypatch.setattr(mf, "DEFAULT_GIT_DIR", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="make release-excerpts"):
        release_sources.vllm_tree("0.0.1")
    with pytest.raises(pytest.fail.Exception, match="nor in tests/data/release-sources/mooncake.tar.xz"):
        release_sources.mooncake_tree("0.0.1")
