"""One config per value and place: readers find the same config through several routes (a
variable and the flag that uses it, an env value and the args that name it)."""

from __future__ import annotations

import json
from typing import Any

from kvctl.validate.model import Artifact


def merge_held(artifacts: list[Artifact], held: list[Artifact]) -> list[Artifact]:
    """`artifacts` (the same value at the same line with the same env once) and the configs found
    in variables that none of them already gave (a flag using "$VAR" is located at VAR's text)."""
    def key(artifact: Artifact, env: bool = False) -> tuple[Any, ...]:
        return artifact.kind, json.dumps(artifact.data, sort_keys=True, default=str), \
            artifact.lines.get(artifact.where), tuple(sorted(artifact.env.items())) if env else ()

    out: list[Artifact] = []
    exact: set[tuple[Any, ...]] = set()
    for artifact in artifacts:  # two commands using one "$VAR" the same way: one config
        if key(artifact, env=True) not in exact:
            exact.add(key(artifact, env=True))
            out.append(artifact)
    seen = {key(a) for a in out}
    for artifact in held:
        if key(artifact) not in seen:
            seen.add(key(artifact))
            out.append(artifact)
    return out
