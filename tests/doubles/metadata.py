"""PACKAGE-METADATA DOUBLE of a Python environment: a folder of `<name>-<version>.dist-info/METADATA`
files (what pip writes, nothing else of the packages) and a launcher that runs this machine's REAL
interpreter with `-S` (no site-packages of its own) and only that folder on sys.path. kvctl's probes
(`-c CODE` asking importlib.metadata) then run for real and see exactly the versions given: a GPU vLLM
with a CUDA 13 torch, a Mooncake wheel, without installing any of them."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def environment(folder: Path, packages: dict[str, str]) -> str:
    """The launcher's path (use it as --vllm-python) for an environment with `packages` {name: version}."""
    site = folder / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    for name, version in packages.items():
        # wheels name the folder with the normalized name (PEP 503 with underscores), as importlib looks it up
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    launcher = folder / "python"
    launcher.write_text("#!/bin/sh\n"
                        "# PACKAGE-METADATA DOUBLE: the real interpreter, seeing only the dist-info folders below\n"
                        f"PYTHONPATH={shlex.quote(str(site))} exec {shlex.quote(sys.executable)} -S \"$@\"\n")
    launcher.chmod(0o755)
    return str(launcher)
