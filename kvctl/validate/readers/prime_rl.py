"""prime-rl's inference TOML, read as prime-rl turns it into vLLM's config (issue 27).

vLLM never sees the TOML: prime-rl validates it with pydantic (prime-pydantic-config 0.4.3's
BaseConfig forbids unknown keys, pydantic_config/cli.py:94-97) and hands vLLM a Namespace holding
the kv_transfer_config it builds. Rules as of prime-rl 559b447 (2026-08-21); "inference.py" is
packages/prime-rl-configs/src/prime_rl/configs/inference.py:
- 248-262 `type = "native"`: OffloadingConnector, kv_both, {cpu_bytes_to_use: cpu.num_bytes}; with
  a disk tier also spec_name TieringOffloadingSpec, secondary_tiers [{type "fs_python", root_dir}].
- 265-280 `type = "mooncake"`: MooncakeStoreConnector, kv_both, {}. The store and its mooncake.json
  come from the SLURM template (src/prime_rl/templates/_mooncake_store.sh.j2: 13-14 export
  PYTHONHASHSEED=0 and MOONCAKE_CONFIG_PATH, 16-18 master and metadata on the job's head node,
  39-41 the JSON): its SLURM-filled values are kept as placeholders, not guessed.
- 221-246, 283-285: `type` has no default (a table without it is refused); a cpu tier with
  num_bytes > 0 is required; a disk tier has only `path`.
- 385-416, 527-531: deployment.type "disaggregated" sets use_pd_kv_transfer: NixlConnector
  {num_threads: 1}, composed with the offload connector under MultiConnector (555-582).
- 517-523: offload with vllm.enable_prefix_caching = false is refused.
- 144-161, 590-617: [vllm] keys pass through (kebab-case made snake, JSON strings parsed); a
  kv_transfer_config there is replaced when prime-rl builds one.
- env: [env_vars] (src/prime_rl/entrypoints/inference.py:86,198; an RL config's top-level env_vars
  too, entrypoints/rl.py:204-207), prefill_env_vars / decode_env_vars per role
  (templates/inference.sbatch.j2:256-258,271-273), use_deep_gemm (inference/server.py:25-27).
  prime-rl's own defaults (utils/process.py:17-33, server.py:11-23) are not the file's statement:
  left out, so a release that reads none of them is not blamed on the file.
Before c13409e2c (2026-06-02) the table was a flat `cpu_bytes = N` (and `block_size` before
c9a4b3b19): prime-rl at 559b447 refuses those keys, and the message says the shape it takes now.
An RL config (rl.toml) has the same tables under [inference] (configs/rl.py:234); its top-level
[deployment] is the training job's. Layered files and CLI flags (`--slurm.*`) are not known.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from kvctl.errors import UsageError
from kvctl.validate.model import Artifact, Collector, SourceLines, did_you_mean, join
from kvctl.validate.readers import offload_args
from kvctl.validate.readers.structured import Found

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package (pyproject.toml)
    import tomli as tomllib

FORMAT = "prime-rl-toml"
REF = "prime-rl 559b447"
# Tables only prime-rl's InferenceConfig has (inference.py:437-483); `vllm` alone is not enough.
_MARKERS = ("kv_cache_offload", "deployment", "use_pd_kv_transfer", "use_deep_gemm", "weight_broadcast")
_RL_TABLES = ("trainer", "orchestrator")
_TIER_KEYS = {"cpu": ("num_bytes",), "disk": ("path",)}
_OFFLOAD_KEYS = {"native": ("type", "cpu", "disk"), "mooncake": ("type", "cpu", "disk", "device_name")}
_DEPLOYMENT_KEYS = {
    "single_node": ("type", "gpus_per_node"),
    "multi_node": ("type", "gpus_per_node", "num_nodes"),
    "disaggregated": ("type", "gpus_per_node", "prefill_nodes_per_replica", "decode_nodes_per_replica",
                      "num_prefill_replicas", "num_decode_replicas", "prefill_port", "decode_port",
                      "prefill_env_vars", "decode_env_vars", "prefill_vllm_overrides",
                      "decode_vllm_overrides")}
_PROTECTED_ENV = ("CUDA_VISIBLE_DEVICES", "PRL_RUN_ID", "PRL_RUN_NAME", "WANDB_RUN_ID", "WANDB_SHARED_MODE",
                  "WANDB_SHARED_LABEL", "WANDB_SHARED_PRIMARY", "WANDB_SHARED_FINISHER")  # shared.py:13-24
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"num_threads": 1}}
_MC_HEAD = "$MC_HEAD"  # the SLURM job's first node (_mooncake_store.sh.j2:16)
_CONFIG = "kv_transfer_config"
_MOONCAKE_CONFIG_PATH = "$OUTPUT_DIR/mooncake/node_$INFER_NODE_RANK/config.json"  # _mooncake_store.sh.j2:11,14


def inference_root(data: Any) -> str | None:
    """Where prime-rl's InferenceConfig sits: "" (an inference TOML), "inference" (an RL TOML), or
    None when the TOML is not prime-rl's."""
    if not isinstance(data, Mapping):
        return None
    if isinstance(data.get("inference"), Mapping) and (
            any(k in data for k in _RL_TABLES) or any(k in data["inference"] for k in (*_MARKERS, "vllm"))):
        return "inference"
    return "" if any(k in data for k in _MARKERS) else None


def read_prime_rl(text: str, file: str) -> Found:
    """The configs prime-rl hands vLLM for this TOML. UsageError when it is not TOML or not prime-rl's."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{file}: not valid TOML: {exc}", "fix the TOML syntax there") from None
    root = inference_root(data)
    if root is None:
        raise UsageError(f"{file}: a TOML file, but not a config kvctl reads: kvctl reads prime-rl's "
                         "inference / RL TOML (tables such as [kv_cache_offload], [deployment] or "
                         "[inference.kv_cache_offload]); other TOML has no vLLM KV settings it knows",
                         "give the prime-rl config, or the kv_transfer_config / launch line itself")
    found = _Translation(data, root, toml_lines(text, file)).run()
    if not found.artifacts and not found.problems:
        raise UsageError(f"{file}: a prime-rl config, but prime-rl builds no kv_transfer_config from "
                         "it: no [kv_cache_offload], the deployment is not disaggregated and "
                         "[vllm] sets no kv_transfer_config, so vLLM runs without KV transfer",
                         "add [kv_cache_offload] (type = \"native\" or \"mooncake\", with "
                         "[kv_cache_offload.cpu] num_bytes), or validate the launch line you run")
    return found


class _Translation:
    """prime-rl's rules applied to one parsed TOML whose InferenceConfig is at `root`."""

    def __init__(self, data: Mapping[str, Any], root: str, lines: SourceLines) -> None:
        self.data, self.root, self.lines = data, root, lines
        self.inference: Mapping[str, Any] = data[root] if root else data
        self.out = Collector(lines)

    def run(self) -> Found:
        offload = self._offload()
        deployment = self._table("deployment")
        kind = self._deployment_type(deployment)
        pd_key = "deployment.type" if kind == "disaggregated" else "use_pd_kv_transfer"
        pd = kind == "disaggregated" or self.inference.get("use_pd_kv_transfer") is True
        built = _compose(offload, self._line(self._path(pd_key)) if pd else None)
        vllm = self._table("vllm")
        self._prefix_caching(vllm, offload)
        found = Found(FORMAT)
        shared = self._shared_env()
        mooncake = offload is not None and offload[0] == "mooncake"
        roles = ("prefill", "decode") if kind == "disaggregated" else ("",)
        for role in roles if built is not None else ():
            data, keys, origin = built
            table = f"deployment.{role}_env_vars"
            env, paths = self._server_env(self._path(table) if role else "", deployment.get(f"{role}_env_vars"),
                                          shared, mooncake)
            where = join(role, _CONFIG)
            lines = SourceLines(self.lines.file, {join(where, k) if k else where: line for k, line in keys.items()})
            lines.update({join("env", name): self._line(path) for name, path in paths.items()})
            found.artifacts.append(Artifact("kv_transfer_config", data, where, lines, env=env,
                                            origin=f"{origin}{f', {role} servers' if role else ''}"))
        if built is not None and mooncake:
            found.artifacts.append(self._mooncake_json(self.inference["kv_cache_offload"]))
        found.artifacts += self._vllm_args(vllm, found.artifacts, self._server_env("", None, shared, False)[0])
        found.problems += self.out.problems
        return found

    # -- [kv_cache_offload] ---------------------------------------------------------------
    def _offload(self) -> tuple[str, dict[str, Any], dict[str, int], str] | None:
        """(type, connector dict, its key lines, origin) of [kv_cache_offload], or None."""
        path = self._path("kv_cache_offload")
        table = self.inference.get("kv_cache_offload")
        if table is None or table == "None":  # "None" is null to prime-pydantic-config (cli.py:99-108)
            return None
        if not isinstance(table, Mapping):
            self._refuse(path, f"kv_cache_offload is {table!r}, not a table",
                         '[kv_cache_offload] with type = "native" and [kv_cache_offload.cpu] num_bytes = ...')
            return None
        if "type" not in table:
            flat = [k for k in ("cpu_bytes", "block_size") if k in table]
            was = f" ({', '.join(flat)}: the flat table prime-rl read before c13409e2c, 2026-06-02)" if flat else ""
            self._refuse(path, f"[kv_cache_offload] has no type{was}: prime-rl picks the backend by type, "
                         "which has no default", _OFFLOAD_FIX)
            return None
        kind = table["type"]
        if kind not in _OFFLOAD_KEYS:
            self._refuse(join(path, "type"), f"kv_cache_offload.type {kind!r} is not one of 'native', 'mooncake'",
                         f'{did_you_mean(kind, _OFFLOAD_KEYS)}write type = "native" (vLLM\'s OffloadingConnector) '
                         'or "mooncake" (a Mooncake store, SLURM only)')
            return None
        self._unknown(path, table, _OFFLOAD_KEYS[kind], f"a {kind} kv_cache_offload")
        cpu, disk = table.get("cpu"), table.get("disk")
        size = self._tier(path, "cpu", cpu)
        root_dir = self._tier(path, "disk", disk) if disk is not None else None
        if size is None or (disk is not None and root_dir is None):
            return None
        at = self._line(path)
        kind_line = self._line(join(path, "type"))
        origin = f"prime-rl: [{path}] (line {at})"
        if kind == "mooncake":
            return kind, {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                          "kv_connector_extra_config": {}}, {"": at, "kv_connector": kind_line}, origin
        extra: dict[str, Any] = {"cpu_bytes_to_use": size}
        keys = {"": at, "kv_connector": kind_line, "kv_connector_extra_config": at,
                "kv_connector_extra_config.cpu_bytes_to_use": self._line(join(path, "cpu.num_bytes"))}
        if root_dir is not None:
            extra.update(spec_name="TieringOffloadingSpec",
                         secondary_tiers=[{"type": "fs_python", "root_dir": root_dir}])
            disk_at, dir_at = self._line(join(path, "disk")), self._line(join(path, "disk.path"))
            keys.update({"kv_connector_extra_config.spec_name": disk_at,
                         "kv_connector_extra_config.secondary_tiers": disk_at,
                         "kv_connector_extra_config.secondary_tiers[0]": disk_at,
                         "kv_connector_extra_config.secondary_tiers[0].type": disk_at,
                         "kv_connector_extra_config.secondary_tiers[0].root_dir": dir_at})
        return kind, {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": extra}, keys, origin

    def _tier(self, path: str, name: str, tier: Any) -> Any:
        """cpu.num_bytes as an int, disk.path as a str; None (and the refusal said) when prime-rl refuses it."""
        where, key = join(path, name), _TIER_KEYS[name][0]
        if tier is None:
            self._refuse(path, "[kv_cache_offload] has no cpu tier: prime-rl requires one (disk-only "
                         "offload is not supported, inference.py:238-245)", _OFFLOAD_FIX)
            return None
        if not isinstance(tier, Mapping):
            self._refuse(where, f"kv_cache_offload.{name} is {tier!r}, not a table", f"write [{where}] {key} = ...")
            return None
        self._unknown(where, tier, _TIER_KEYS[name], f"the {name} tier")
        value = tier.get(key)
        if name == "disk":
            if not isinstance(value, str) or not value:
                self._refuse(join(where, key) if key in tier else where, f"the disk tier needs path, a "
                             f"directory (got {value!r})", f'write [{where}] path = "/scratch/kv"')
                return None
            return value
        whole = (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
        if not whole or value <= 0:
            self._refuse(join(where, key) if key in tier else where, f"cpu.num_bytes is {value!r}: prime-rl "
                         "requires a whole number of bytes above 0 (inference.py:222)",
                         f"write [{where}] num_bytes = 128_000_000_000")
            return None
        return int(value)

    # -- [deployment], [vllm] ---------------------------------------------------------------
    def _deployment_type(self, deployment: Mapping[str, Any]) -> str | None:
        path = self._path("deployment")
        kind = deployment.get("type", "single_node")  # the default's type is filled in (cli.py:131-145)
        if kind not in _DEPLOYMENT_KEYS:
            self._refuse(join(path, "type"), f"deployment.type {kind!r} is not one of "
                         f"{', '.join(_DEPLOYMENT_KEYS)}", f'{did_you_mean(kind, _DEPLOYMENT_KEYS)}write '
                         'type = "disaggregated" for prefill/decode servers, or remove it (single_node)')
            return None
        if deployment:
            self._unknown(path, deployment, _DEPLOYMENT_KEYS[kind], f"a {kind} deployment")
        return kind

    def _prefix_caching(self, vllm: Mapping[str, Any], offload: tuple | None) -> None:
        if offload is not None and vllm.get("enable_prefix_caching", vllm.get("enable-prefix-caching")) is False:
            key = "enable_prefix_caching" if "enable_prefix_caching" in vllm else "enable-prefix-caching"
            self._refuse(self._path(f"vllm.{key}"), "enable_prefix_caching is false with kv_cache_offload: "
                         "prime-rl refuses it (inference.py:517-521: offloading reuses cached prefixes)",
                         "remove enable_prefix_caching (prime-rl then turns it on)")

    def _vllm_args(self, vllm: Mapping[str, Any], built: list[Artifact], env: dict[str, str]) -> list[Artifact]:
        """kv_transfer_config and kv_offloading_* written in the pass-through [vllm] table."""
        path, out = self._path("vllm"), []
        names = {str(k).replace("-", "_"): k for k in vllm}
        if _CONFIG in names:
            key = join(path, names[_CONFIG])
            value = _json(vllm[names[_CONFIG]])
            if built:
                self.out.drop(key, "[vllm] kv_transfer_config is replaced by the one prime-rl builds from "
                              "[kv_cache_offload] / the disaggregated deployment (inference.py:615-617): "
                              "vLLM never gets it", "remove it from [vllm], or remove [kv_cache_offload] "
                              "(and the disaggregated deployment) to pass your own config")
            else:
                lines = SourceLines(self.lines.file, {_CONFIG + p[len(key):]: n for p, n in self.lines.items()
                                                      if p == key or p.startswith(key + ".")})
                out.append(Artifact("kv_transfer_config", value, _CONFIG, lines, env=dict(env),
                                    origin=f"prime-rl: [{path}] kv_transfer_config (line {self._line(key)}), "
                                           "passed through"))
        values = offload_args.in_mapping(vllm, path, self.lines)
        if values:
            link = (built or out or [None])[0]
            out.append(offload_args.located(values, self.lines.file, path, f"prime-rl: [{path}], passed through",
                                            config=link, env=env))
        return out

    # -- env -------------------------------------------------------------------------------
    def _shared_env(self) -> list[tuple[dict[str, str], dict[str, str]]]:
        """(env, name -> TOML path) of the tables every server gets, in the order they apply."""
        rl = self._env("env_vars", self.data.get("env_vars")) if self.root else ({}, {})  # rl.py:204-207
        own = self._env(self._path("env_vars"), self.inference.get("env_vars"))
        gemm: tuple[dict[str, str], dict[str, str]] = ({}, {})
        if "use_deep_gemm" in self.inference:  # server.py:25-27, set after everything else
            flag = "1" if self.inference["use_deep_gemm"] is True else "0"
            names = ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM")
            gemm = ({n: flag for n in names}, {n: self._path("use_deep_gemm") for n in names})
        return [rl, own, gemm]

    def _server_env(self, role_path: str, role_table: Any, shared: list[tuple[dict[str, str], dict[str, str]]],
                    mooncake: bool) -> tuple[dict[str, str], dict[str, str]]:
        """One server's env: the sbatch script exports env_vars, then the store's variables
        (_mooncake_store.sh.j2:13-14), then the role's (inference.sbatch.j2:186-197,256-273); each
        rank's `uv run inference` applies env_vars again (entrypoints/inference.py:198), then use_deep_gemm."""
        (rl, rl_at), (own, own_at), (gemm, gemm_at) = shared
        env, paths = dict(rl), dict(rl_at)
        if mooncake:
            env.update(PYTHONHASHSEED="0", MOONCAKE_CONFIG_PATH=_MOONCAKE_CONFIG_PATH)
            paths.update({n: self._path("kv_cache_offload.type") for n in ("PYTHONHASHSEED", "MOONCAKE_CONFIG_PATH")})
        for values, at in (self._env(role_path, role_table) if role_path else ({}, {}), (own, own_at), (gemm, gemm_at)):
            env.update(values)
            paths.update(at)
        return env, paths

    def _env(self, path: str, table: Any) -> tuple[dict[str, str], dict[str, str]]:
        """An EnvVars table (dict[str, str], shared.py:36): prime-rl refuses other values."""
        if table is None:
            return {}, {}
        if not isinstance(table, Mapping):
            self._refuse(path, f"{path} is {table!r}, not a table", f'write [{path}] NAME = "value"')
            return {}, {}
        env, paths = {}, {}
        for name, value in table.items():
            where = join(path, _quoted(name))
            if name in _PROTECTED_ENV:
                self._refuse(where, f"{name} is set by prime-rl's launcher and env_vars cannot set it "
                             "(shared.py:13-33)", f"remove {name}")
            elif not isinstance(value, str):
                self._refuse(where, f"{name} = {value!r} is not a string: prime-rl takes env values as "
                             "strings only", f'quote it: "{name}" = "{value}"')
            else:
                env[name], paths[name] = value, where
        return env, paths

    def _mooncake_json(self, table: Mapping[str, Any]) -> Artifact:
        path = self._path("kv_cache_offload")
        data = {"mode": "standalone-store", "global_segment_size": 0, "local_buffer_size": 4294967296,
                "protocol": "rdma", "device_name": str(table.get("device_name", "")),
                "master_server_address": f"{_MC_HEAD}:50051", "metadata_server": f"http://{_MC_HEAD}:8080/metadata",
                "enable_offload": table.get("disk") is not None}
        at = self._line(path)
        lines = SourceLines(self.lines.file, {join("mooncake", k): at for k in data})
        lines["mooncake"] = at
        lines["mooncake.device_name"] = self._line(join(path, "device_name"))
        lines["mooncake.enable_offload"] = self._line(join(path, "disk"))
        return Artifact("mooncake", data, "mooncake", lines, readers=("MooncakeStoreConnector",),
                        origin=f"prime-rl: the SLURM template's mooncake.json (_mooncake_store.sh.j2:39-41) "
                               f"from [{path}] (line {at})")

    # -- helpers ---------------------------------------------------------------------------
    def _table(self, key: str) -> Mapping[str, Any]:
        value = self.inference.get(key)
        if value is not None and not isinstance(value, Mapping):
            self._refuse(self._path(key), f"{key} is {value!r}, not a table", f"write it as [{self._path(key)}]")
        return value if isinstance(value, Mapping) else {}

    def _unknown(self, path: str, table: Mapping[str, Any], known: tuple[str, ...], what: str) -> None:
        for key in table:
            if key not in known:
                self._refuse(join(path, key), f"{key} is not a key of {what}: prime-rl forbids unknown keys",
                             f"{did_you_mean(key, known)}the keys it takes are: {', '.join(known)}")

    def _refuse(self, path: str, what: str, fix: str) -> None:
        self.out.error(path, f"{what}; {REF} refuses the config, so no vLLM server starts", fix)

    def _path(self, key: str) -> str:
        return join(self.root, key)

    def _line(self, path: str) -> int:
        while path not in self.lines and "." in path:
            path = path.rsplit(".", 1)[0]
        return self.lines.get(path, self.lines.get(self.root, 1))


_OFFLOAD_FIX = ('write [kv_cache_offload] type = "native" and [kv_cache_offload.cpu] num_bytes = 128_000_000_000 '
                '(add [kv_cache_offload.disk] path = "/scratch/kv" for a disk tier)')


def _compose(offload: tuple | None, pd_line: int | None) -> tuple[dict[str, Any], dict[str, int], str] | None:
    """build_kv_transfer_config (inference.py:555-582): NIXL and/or the offload connector."""
    if pd_line is None:
        return None if offload is None else (offload[1], offload[2], offload[3])
    origin = f"prime-rl: disaggregated deployment (line {pd_line})"
    nixl_keys = {"": pd_line, "kv_connector": pd_line, "kv_connector_extra_config": pd_line,
                 "kv_connector_extra_config.num_threads": pd_line}
    if offload is None:
        return dict(NIXL), nixl_keys, origin
    keys = {"": pd_line, "kv_connector": pd_line, "kv_role": pd_line, "kv_connector_extra_config": pd_line,
            "kv_connector_extra_config.connectors": pd_line}
    for index, child in enumerate((nixl_keys, offload[2])):
        base = f"kv_connector_extra_config.connectors[{index}]"
        keys.update({join(base, k) if k else base: line for k, line in child.items()})
    data = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [dict(NIXL), offload[1]]}}
    return data, keys, f"{origin} + {offload[3].removeprefix('prime-rl: ')}"


def _json(value: Any) -> Any:
    """A string value is JSON-parsed, as prime-rl does for pass-through keys (inference.py:153-160)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _quoted(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


# -- TOML key lines ---------------------------------------------------------------------------
_BARE = r"[A-Za-z0-9_-]+"
_KEY_PART = rf'(?:{_BARE}|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?")
_ASSIGN = re.compile(rf"^\s*({_DOTTED})\s*=")
_PART = re.compile(_KEY_PART)


def toml_lines(text: str, file: str) -> SourceLines:
    """Dotted path -> line of every table header and key (tomllib keeps no positions): a line scan
    that skips multi-line strings; keys inside inline tables take their table's line."""
    lines, table, arrays = SourceLines(file), "", {}
    in_string: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if in_string:
            if line.count(in_string) % 2:
                in_string = None
            continue
        header = _HEADER.match(line)
        if header:
            table = _dotted(header[2])
            if header[1] == "[[":  # an array of tables: each header is the next item
                arrays[table] = arrays.get(table, -1) + 1
                table = f"{table}[{arrays[table]}]"
            lines.setdefault(table, number)
            continue
        assign = _ASSIGN.match(line)
        if assign:
            key = join(table, _dotted(assign[1]))
            lines.setdefault(key, number)
            rest = line[assign.end():]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2:
                    in_string = quote
    return lines


def _dotted(key: str) -> str:
    parts = [p[1:-1] if p[0] in "\"'" else p for p in _PART.findall(key)]
    return ".".join(_quoted(p) for p in parts)
