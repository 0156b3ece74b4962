"""Regenerate the generated parts of docs/ from kvctl's data (run: make docs).

tests/unit/tools/test_docs.py fails when docs/ drift from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvctl.facts.capabilities import table  # noqa: E402
from kvctl.facts.compat import matrix_markdown  # noqa: E402
from tools.releases import docs as observed  # noqa: E402

BEGIN, END = "<!-- BEGIN GENERATED MATRIX (make docs) -->", "<!-- END GENERATED MATRIX -->"


def replace_section(text: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    """`text` with what lies between the generated-section markers replaced by `body`."""
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"markers {begin} ... {end} not found")
    return f"{head}{begin}\n{body}{end}{tail}"


def main() -> None:
    path = ROOT / "docs" / "compat.md"
    text = replace_section(path.read_text("utf-8"), matrix_markdown())
    text = replace_section(text, observed.markdown(table()), observed.BEGIN, observed.END)
    path.write_text(text, "utf-8")
    print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
