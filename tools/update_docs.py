"""Regenerate the generated parts of docs/ from kvctl's data (run: make docs).

tests/test_docs.py fails when docs/ drift from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvctl.compat import matrix_markdown  # noqa: E402

BEGIN, END = "<!-- BEGIN GENERATED MATRIX (make docs) -->", "<!-- END GENERATED MATRIX -->"


def replace_section(text: str, body: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"markers {BEGIN} ... {END} not found")
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def main() -> None:
    path = ROOT / "docs" / "compat.md"
    path.write_text(replace_section(path.read_text("utf-8"), matrix_markdown()), "utf-8")
    print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
