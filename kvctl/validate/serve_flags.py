"""Launch lines with an option the vLLM release does not have: its argparse refuses the whole command
("unrecognized arguments" / "ambiguous option", exit 2) before any connector is built.

The options per release come from kvctl.facts.serve_flags (the parser `vllm serve` builds, read from
the released sources). A word is judged as argparse reads it (Python's argparse under vLLM's
FlexibleArgumentParser): `--name_x` is `--name-x` (underscores before the first `.` become dashes,
vllm/utils/argparse_utils.py in 0.32), `--name=value` is `--name`, and an unambiguous prefix of an
option is that option (allow_abbrev stays on). Dotted `--kv-transfer-config.x` words, short options
and words the shell fills in ($EXTRA_ARGS, "${ARGS[@]}") are not judged here.
"""

from __future__ import annotations

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.facts.serve_flags import first_in, known, last_source, removed_in, serve_options
from kvctl.facts.versions import release
from kvctl.validate.model import ERROR, Artifact, Problem, SourceLines, closest, locate

# Options another check judges per release with its own wording (kvctl.validate.offloading_args).
OWNED = frozenset({"--kv-offloading-size", "--kv-offloading-backend"})


def option_of(word: str) -> str | None:
    """The long option argparse sees in `word` ('--max_model_len=4' -> '--max-model-len'), or None for
    what is not judged: a value, a short option, a dotted field, a word with a shell placeholder."""
    if not word.startswith("--") or word == "--":
        return None
    name = word.partition("=")[0]
    if "." in name or "$" in name or "{{" in name or "`" in name:
        return None
    return "--" + name[2:].replace("_", "-")


def resolve(option: str, accepted: set[str]) -> tuple[str, list[str]]:
    """("exact" | "prefix" | "ambiguous" | "unknown", the options it may mean), as argparse matches."""
    if option in accepted:
        return "exact", [option]
    matches = sorted(o for o in accepted if o.startswith(option) and o.startswith("--"))
    if len(matches) == 1:
        return "prefix", matches
    return ("ambiguous", matches) if matches else ("unknown", [])


def check_serve_args(artifact: Artifact, v: Version) -> list[Problem]:
    """Every option of the launch line an artifact came from (artifact.options) that `v` refuses."""
    if not known(v):
        return []
    options = serve_options(v)
    accepted = set(options)
    problems: list[Problem] = []
    for flag, line in artifact.options:
        option = option_of(flag)
        if option is None or option in OWNED:
            continue
        verdict, matches = resolve(option, accepted)
        where = locate(flag, SourceLines(getattr(artifact.lines, "file", ""), {flag: line}))
        if verdict == "unknown":
            message, fix = _unknown(flag, option, v, accepted)
            field = option[2:].replace("-", "_")
            if table().field(field) is not None:  # --kv-role kv_both: a field of the JSON, not an option
                message += f"; {field} is a field of kv_transfer_config, not an option of vllm serve"
                fix = f"write it inside --kv-transfer-config '{{\"{field}\": ...}}' (with kv_connector and kv_role)"
            if artifact.carrier and option_of(artifact.carrier) == option:
                message += ("; the config the script gives it never reaches vLLM, however right the JSON "
                            "(vLLM takes a kv_transfer_config only as --kv-transfer-config)")
                if table().field(field) is None:
                    fix = f"pass the JSON as --kv-transfer-config '<json>' instead of {flag}"
            problems.append(Problem(where, message, fix, ERROR))
        elif verdict == "ambiguous":
            shown = ", ".join(matches[:4]) + (", ..." if len(matches) > 4 else "")
            problems.append(Problem(
                where, f"{flag} is an ambiguous abbreviation in vLLM {release(v)}: it could be "
                f"{shown}; vLLM's argument parser refuses the command (\"ambiguous option\", exit 2)",
                f"write the whole option name, e.g. {matches[0]}", ERROR))
    return problems


def _unknown(word: str, option: str, v: Version, accepted: set[str]) -> tuple[str, str]:
    """(message, fix) for an option `v` does not have: removed, not yet added, or misspelled."""
    here = f"vLLM {release(v)}"
    refused = "vLLM's argument parser refuses the whole command (\"unrecognized arguments\", exit 2)"
    removed, added = removed_in(option, v), first_in(option, v)
    guess = closest(option, accepted)
    also = f", or use {guess}" if guess else ""
    if removed:
        return (f"{word}: {here} has no such option: it was removed in vLLM {removed} (defined at "
                f"{last_source(option)} and the releases after it up to {removed}); {refused}",
                f"remove {word} from the launch line{also} (or run a release before {removed})")
    if added:
        return (f"{word}: {here} has no such option: it was added in vLLM {added}; {refused}",
                f"remove {word}{also}, or upgrade vLLM to {added} or later")
    mean = f"did you mean {guess}? " if guess else ""
    return (f"{word}: no vLLM release kvctl knows has this option; {refused}",
            f"{mean}write an option `vllm serve --help=all` lists for {here}")
