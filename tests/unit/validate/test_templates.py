"""Templated files (run.sh.j2, ...): every {% if %} branch read, line numbers the template's own."""

from __future__ import annotations

from pathlib import Path

from kvctl.validate import validate_path
from kvctl.validate.readers import read
from kvctl.validate.readers.templates import conditions, render
from tests.lib import REPO

TEMPLATE = REPO / "tests" / "corpus" / "files" / "more-primerl-mooncake-store-standalone-template.sh.j2"


def test_branches_are_chosen_by_condition_and_lines_are_kept() -> None:
    text = "a\n{% if x %}X{% elif y %}Y{% else %}N{% endif %}\n{%- if x %}\nX2\n{%- endif %}\nz {{ v }}\n"
    assert conditions(text) == ["x", "y"]
    assert render(text, {"x": True}) == "a\nX\n\nX2\n\nz {{ v }}\n"
    assert render(text, {"y": True}) == "a\nY\n\n\n\nz {{ v }}\n"
    assert render(text, {}) == "a\nN\n\n\n\nz {{ v }}\n"


def test_nested_blocks_follow_their_parent() -> None:
    text = "{% if a %}A{% if b %}B{% endif %}{% else %}-{% endif %}"
    assert render(text, {"a": False, "b": True}) == "-"
    assert render(text, {"a": True, "b": True}) == "AB"


def test_mooncake_json_with_inline_ifs_is_read_in_every_branch() -> None:
    found = read(TEMPLATE)
    offloads = {a.data["enable_offload"] for a in found.artifacts if a.kind == "mooncake"}
    assert offloads == {True, False}
    assert all(a.lines["mooncake.mode"] == 40 for a in found.artifacts)
    report = validate_path(TEMPLATE, "0.21.0")  # mode / enable_offload unread there
    assert report.dropped and not [p for p in report.errors if not p.dropped]
    assert validate_path(TEMPLATE, "0.22.0").ok


def test_a_branch_with_an_error_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "launch.sh.j2"
    path.write_text("vllm serve m --kv-transfer-config "
                    "'{\"kv_connector\":\"{% if p2p %}P2pNcclConnector{% else %}NoSuchConnector{% endif %}\","
                    "\"kv_role\":\"kv_both\"}'\n")
    assert {a.data["kv_connector"] for a in read(path).artifacts} == {"P2pNcclConnector", "NoSuchConnector"}
    assert not validate_path(path, "0.13.0").ok
