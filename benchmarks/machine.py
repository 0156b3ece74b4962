"""What machine and software a benchmark run measured (goes into results.json and the report)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import time
from typing import Any

from benchmarks.common import ROOT


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _mem_gib() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _os_name() -> str:
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def describe(vllm_python: str | None) -> dict[str, Any]:
    from kvctl._version import __version__

    vllm = None
    if vllm_python:
        from kvctl.serve.vllm_launch import find_vllm

        install = find_vllm(vllm_python)
        vllm = f"{install.distribution} {install.version}"
    dirty = bool(_git("status", "--porcelain", "--", "kvctl", "pyproject.toml"))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "os": _os_name(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "kvctl": __version__,
        "commit": (_git("rev-parse", "--short", "HEAD") or "?") + (" (kvctl/ modified)" if dirty else ""),
        "httpx": _version("httpx"),
        "httpcore": _version("httpcore"),
        "aiohttp": _version("aiohttp"),
        "mooncake": _version("mooncake-transfer-engine-non-cuda") or _version("mooncake-transfer-engine"),
        "vllm": vllm,
        "loadavg_start": os.getloadavg()[0],
    }
