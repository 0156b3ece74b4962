"""vllm-project/production-stack Helm values, read as the chart renders them.

A production-stack values file (`servingEngineSpec.modelSpec: [...]`) holds no kv_transfer_config:
the chart builds the vLLM argv and env from each modelSpec's `lmcacheConfig` and `vllmConfig`.
This reader applies the chart's rules, as of chart 0.1.12 (production-stack a6c01db, 2026-08-05),
and yields one kv_transfer_config Artifact per modelSpec, located at the values' lines, with the
env the chart sets for that container on Artifact.env.

helm/templates/deployment-vllm-multi.yaml at a6c01db (the default path):
- lines 1-4: nothing unless servingEngineSpec.enableEngine (the chart's default: true); a modelSpec
  with `enabled: false` is skipped; `raySpec.enabled` moves it to ray-cluster.yaml (below).
- 5-12: kv_role = lmcacheConfig.kvRole when truthy, else "kv_both".
- 194-198: vllmConfig.extraArgs, each item quoted; 204-216 come after them, and argparse keeps the
  last --kv-transfer-config (vllm/utils/argparse_utils.py:412-423 at 0.32.0 only logs the repeat).
- 204-216: when lmcacheConfig.enabled: `hasKey lmcacheConfig "enablePD"` (the key, not its value)
  -> {"kv_connector":"LMCacheConnectorV1","kv_role":R,"kv_connector_extra_config":
  {"discard_partial_chunks":false,"lmcache_rpc_port":<nixlRole | quote>}}; else vllmConfig.v0 == "1"
  -> {"kv_connector":"LMCacheConnector","kv_role":R} (and VLLM_USE_V1=0, 239-241); else
  {"kv_connector":"LMCacheConnectorV1","kv_role":R}. Sprig v3's `quote` drops a nil argument, so
  enablePD without nixlRole renders `"lmcache_rpc_port": }}`: JSON vLLM cannot parse.
- 223-392: env: PYTHONHASHSEED=123, servingEngineSpec.env, modelSpec.env, then the LMCACHE_*
  variables, which are set from lmcacheConfig even when `enabled` is not true (only
  LMCACHE_USE_EXPERIMENTAL, VLLM_RPC_TIMEOUT and LMCACHE_LOG_LEVEL need it). 336-343: the CPU
  buffer is set only when `gt (int size) 0` (sprig's int is spf13/cast ToInt: "0.5" and 0.5 are 0).
  344-347: LMCACHE_MAX_LOCAL_DISK_SIZE without LMCACHE_LOCAL_DISK (dropped in ed9a3dd4, chart
  0.1.2), and LMCache's disk backend is off while local_disk is None (LMCache docs,
  kv_cache/storage_backends/local_storage.rst). 348-350: LMCACHE_REMOTE_URL points at the chart's
  cache server, named after the Helm release: kept as a placeholder, not guessed.
- 394-399: servingEngineSpec.configs become env through a ConfigMap (envFrom: env wins over it).
helm/templates/ray-cluster.yaml at a6c01db (raySpec.enabled): kv_role is always kv_both and the
connector is LMCacheConnectorV1 only when vllmConfig.v1 == "1", else V0 LMCacheConnector with
VLLM_USE_V1=0 (lines 113-120, 739-751): the rule every chart used before 4a0960be (chart 0.1.5).
helm/values.schema.json at a6c01db: Helm refuses values whose lmcacheConfig.enabled is not a
boolean, vllmConfig.v0 not a string, or extraArgs items not strings.

Values files are often layered (`-f base.yaml -f prod.yaml`): this reads one file, with the chart's
defaults (values.yaml) where a key is absent; Secrets (envFromSecret, hf_token) are not known.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvctl.errors import UsageError
from kvctl.validate.model import Artifact, Collector, Environment, SourceLines, did_you_mean, join
from kvctl.validate.readers.documents import node_lines
from kvctl.validate.readers.shell import Command, Token, configs_in_command, is_config_flag
from kvctl.validate.readers.structured import Found

FORMAT = "helm-values"
CHART = "production-stack chart 0.1.12 (a6c01db)"
V1, V0 = "LMCacheConnectorV1", "LMCacheConnector"
# lmcacheConfig keys each template reads (a6c01db); any other key is never rendered.
_DEPLOYMENT_KEYS = frozenset({
    "enabled", "kvRole", "enablePD", "nixlRole", "logLevel", "cudaVisibleDevices", "enableNixl",
    "nixlPeerHost", "nixlPeerPort", "nixlBufferSize", "nixlBufferDevice", "nixlEnableGc",
    "cpuOffloadingBufferSize", "diskOffloadingBufferSize", "enableController", "instanceId",
    "controllerPort", "controllerReplyPort", "workerPorts", "p2pHost", "p2pInitPorts",
    "workerHeartbeatTime"})
_RAY_KEYS = frozenset({
    "enabled", "logLevel", "cpuOffloadingBufferSize", "diskOffloadingBufferSize", "enableController",
    "instanceId", "controllerPort", "controllerReplyPort", "workerPort", "workerHeartbeatTime"})
# Values the chart fills from the Helm release or the cluster: said as placeholders.
_RELEASE = "{{ .Release.Name }}"
_ZERO_DECIMAL = re.compile(r"^(.*?)\.0+$")


def is_values(data: Any) -> bool:
    """A production-stack values file: servingEngineSpec with a modelSpec list."""
    spec = data.get("servingEngineSpec") if isinstance(data, Mapping) else None
    return isinstance(spec, Mapping) and isinstance(spec.get("modelSpec"), list)


def read_helm_values(data: Any, node: yaml.Node | None, file: str) -> Found | None:
    """The configs the chart renders from a values document; None when it is not one."""
    if not is_values(data):
        return None
    lines = node_lines(node, "", file)
    out, found = Collector(lines), Found(FORMAT)
    spec = data["servingEngineSpec"]
    if "enableEngine" in spec and not spec["enableEngine"]:
        out.warn("servingEngineSpec.enableEngine", f"enableEngine is {spec['enableEngine']!r}: the "
                 "chart renders no vLLM deployment from this file, so it has no KV settings to check",
                 "set servingEngineSpec.enableEngine: true to deploy the engines")
    else:
        chart = _Chart(data, lines, out)
        for index, model in enumerate(spec["modelSpec"]):
            if isinstance(model, Mapping):
                found.artifacts += chart.model(index, model)
    found.problems += out.problems
    if not found.artifacts and not found.problems:
        raise UsageError(f"{file}: a production-stack values file, but no modelSpec sets "
                         "lmcacheConfig.enabled: true or --kv-transfer-config in vllmConfig.extraArgs: "
                         "the chart renders vLLM without KV transfer, so there is nothing to check",
                         "add lmcacheConfig: {enabled: true} to a modelSpec (the chart then renders "
                         "LMCacheConnectorV1), or validate the launch line you run instead")
    return found


@dataclass
class _Rendered:
    """What the chart writes for one modelSpec: the config, and the values line of each key."""

    data: dict[str, Any]
    keys: dict[str, int] = field(default_factory=dict)  # dotted key -> values line


class _Chart:
    """The chart's rules for each modelSpec of one values document."""

    def __init__(self, data: Mapping[str, Any], lines: SourceLines, out: Collector) -> None:
        self.values, self.lines, self.out = data, lines, out
        self.file = lines.file

    def model(self, index: int, model: Mapping[str, Any]) -> list[Artifact]:
        if model.get("enabled") is False:  # `ne $modelSpec.enabled false`: only false skips
            return []
        path = f"servingEngineSpec.modelSpec[{index}]"
        name = model.get("name") if isinstance(model.get("name"), str) else f"#{index + 1}"
        ray = isinstance(model.get("raySpec"), Mapping) and bool(model["raySpec"].get("enabled"))
        vllm = model.get("vllmConfig") if isinstance(model.get("vllmConfig"), Mapping) else {}
        lmcache = model.get("lmcacheConfig") if isinstance(model.get("lmcacheConfig"), Mapping) else {}
        self._schema(path, vllm, lmcache)
        env = self._env(path, model, vllm, lmcache, ray)
        rendered = self._chart_config(path, name, vllm, lmcache, ray) if lmcache.get("enabled") else None
        if lmcache and not lmcache.get("enabled"):
            self._not_enabled(path, name, lmcache)
        if lmcache:
            self._lmcache_keys(join(path, "lmcacheConfig"), lmcache, ray, env)
        extra = self._extra_args(path, name, vllm, env)
        if rendered is None:
            return extra
        if extra:
            self.out.drop(join(path, "vllmConfig.extraArgs"),
                          f"modelSpec '{name}' passes --kv-transfer-config in vllmConfig.extraArgs and "
                          "sets lmcacheConfig.enabled: the chart writes its own --kv-transfer-config "
                          "after extraArgs, and vLLM keeps the last one, so the extraArgs config is "
                          "not used",
                          "keep one: remove --kv-transfer-config from extraArgs, or set "
                          "lmcacheConfig.enabled: false and give the whole config in extraArgs")
        where = join(path, "lmcacheConfig")
        origin = f"production-stack chart{' (Ray template)' if ray else ''}: modelSpec '{name}' " \
                 f"lmcacheConfig (line {self.lines.get(where, 1)})"
        lines = SourceLines(self.file, {join("kv_transfer_config", k) if k else "kv_transfer_config": line
                                        for k, line in rendered.keys.items()})
        return [Artifact("kv_transfer_config", rendered.data, "kv_transfer_config", lines,
                         origin=origin, env=env)]

    # -- the rendered flag ------------------------------------------------------------------
    def _chart_config(self, path: str, name: str, vllm: Mapping[str, Any], lmcache: Mapping[str, Any],
                      ray: bool) -> _Rendered:
        lm = join(path, "lmcacheConfig")
        at = self._line(join(lm, "enabled"))
        if ray:
            connector = V1 if "v1" in vllm and _go_str(vllm["v1"]) == "1" else V0
            return _Rendered({"kv_connector": connector, "kv_role": "kv_both"},
                             {"": at, "kv_connector": self._line(join(path, "vllmConfig.v1"), at)})
        role = _go_str(lmcache["kvRole"]) if lmcache.get("kvRole") else "kv_both"
        keys = {"": at, "kv_connector": at, "kv_role": self._line(join(lm, "kvRole"), at)}
        if "enablePD" in lmcache:
            self._pd(lm, name, lmcache)
            rpc = _go_str(lmcache.get("nixlRole")) if lmcache.get("nixlRole") is not None else "$NIXL_ROLE"
            keys.update({"kv_connector_extra_config": self._line(join(lm, "enablePD"), at),
                         "kv_connector_extra_config.lmcache_rpc_port": self._line(join(lm, "nixlRole"), at)})
            return _Rendered({"kv_connector": V1, "kv_role": role, "kv_connector_extra_config": {
                "discard_partial_chunks": False, "lmcache_rpc_port": rpc}}, keys)
        if "v0" in vllm and _go_str(vllm["v0"]) == "1":
            keys["kv_connector"] = self._line(join(path, "vllmConfig.v0"), at)
            return _Rendered({"kv_connector": V0, "kv_role": role}, keys)
        if "v1" in vllm and _go_str(vllm["v1"]) != "1":
            self.out.drop(join(path, "vllmConfig.v1"),
                          f"vllmConfig.v1 is {vllm['v1']!r}: {CHART} never reads v1 (charts 0.1.2-0.1.5 "
                          "did, until 4a0960be), so it renders LMCacheConnectorV1 on vLLM's V1 engine",
                          "write vllmConfig.v0: \"1\" for the V0 engine and LMCacheConnector, or remove v1")
        return _Rendered({"kv_connector": V1, "kv_role": role}, keys)

    def _pd(self, lm: str, name: str, lmcache: Mapping[str, Any]) -> None:
        if lmcache.get("nixlRole") is None:
            self.out.error(join(lm, "enablePD"),
                           f"modelSpec '{name}' has lmcacheConfig.enablePD but no nixlRole: the chart "
                           "writes `\"lmcache_rpc_port\": }}` (sprig's quote of a missing value is empty), "
                           "and vLLM refuses --kv-transfer-config that is not JSON",
                           "add lmcacheConfig.nixlRole: \"sender\" (prefill) or \"receiver\" (decode)")
        if not lmcache["enablePD"]:
            self.out.drop(join(lm, "enablePD"),
                          f"lmcacheConfig.enablePD is {lmcache['enablePD']!r}, but the chart tests only "
                          "that the key exists: it still renders the disaggregated-prefill "
                          "kv_transfer_config (lmcache_rpc_port from nixlRole), without the PD env "
                          "(LMCACHE_ENABLE_NIXL, LMCACHE_NIXL_*, hostIPC)",
                          "remove enablePD (not false) to get the plain LMCacheConnectorV1 config")

    def _extra_args(self, path: str, name: str, vllm: Mapping[str, Any], env: dict[str, str]) -> list[Artifact]:
        """--kv-transfer-config in vllmConfig.extraArgs (each item one argv word)."""
        items = vllm.get("extraArgs") if isinstance(vllm.get("extraArgs"), list) else []
        base = join(path, "vllmConfig.extraArgs")
        tokens = [Token(_go_str(item), self._line(f"{base}[{i}]", self._line(base)))
                  for i, item in enumerate(items) if item is not None]
        if not any(is_config_flag(t.text) for t in tokens):
            return []
        artifacts = configs_in_command(Command(tokens, Environment(env, env.set_by)), self.file,
                                       self.out.problems)
        flag = next(i for i, t in enumerate(tokens) if is_config_flag(t.text))
        return [Artifact(a.kind, a.data, a.where, a.lines, env=a.env, partial=a.partial, options=a.options,
                         origin=f"production-stack chart: modelSpec '{name}' vllmConfig.extraArgs[{flag}] "
                                f"(line {tokens[flag].line})") for a in artifacts]

    # -- the rendered env -------------------------------------------------------------------
    def _env(self, path: str, model: Mapping[str, Any], vllm: Mapping[str, Any],
             lmcache: Mapping[str, Any], ray: bool) -> Environment:
        spec = self.values["servingEngineSpec"]
        env = Environment()
        configs = spec.get("configs")
        if isinstance(configs, Mapping):  # envFrom a ConfigMap: the container's env wins over it
            env.update({str(k): _go_str(v) for k, v in configs.items()})
        if not ray:
            env["PYTHONHASHSEED"] = "123"
            env.set_by["PYTHONHASHSEED"] = CHART
        if vllm and ray:  # both under `with $modelSpec.vllmConfig`
            env["VLLM_USE_V1"] = _go_str(vllm["v1"]) if "v1" in vllm else "0"
        elif vllm and "v0" in vllm and _go_str(vllm["v0"]) == "1":
            env["VLLM_USE_V1"] = "0"
        for entries in (spec.get("env"), model.get("env")):
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                    value = entry.get("value")
                    env[entry["name"]] = _go_str(value) if "value" in entry else f"$({entry['name']})"
                    env.set_by.pop(entry["name"], None)  # the values file states it
        if lmcache:
            own = self._lmcache_env(lmcache, ray)
            env.update(own)
            env.set_by.update(dict.fromkeys(own, CHART))
        return env

    def _lmcache_env(self, lm: Mapping[str, Any], ray: bool) -> dict[str, str]:
        env: dict[str, str] = {}
        if lm.get("enabled"):
            env.update(LMCACHE_USE_EXPERIMENTAL="True", VLLM_RPC_TIMEOUT="1000000",
                       LMCACHE_LOG_LEVEL=_go_str(lm.get("logLevel") or "INFO"))
        if not ray and "cudaVisibleDevices" in lm:
            env["CUDA_VISIBLE_DEVICES"] = _go_str(lm["cudaVisibleDevices"])
        if not ray and lm.get("enablePD"):
            env.update(LMCACHE_LOCAL_CPU="False", LMCACHE_MAX_LOCAL_CPU_SIZE="0", LMCACHE_REMOTE_SERDE="NULL")
            for key, name in (("enableNixl", "LMCACHE_ENABLE_NIXL"), ("nixlEnableGc", "LMCACHE_NIXL_ENABLE_GC")):
                if key in lm:
                    env[name] = "True" if lm[key] else "False"
            for key, name in (("nixlRole", "LMCACHE_NIXL_ROLE"), ("nixlPeerHost", "LMCACHE_NIXL_RECEIVER_HOST"),
                              ("nixlPeerPort", "LMCACHE_NIXL_RECEIVER_PORT"),
                              ("nixlBufferSize", "LMCACHE_NIXL_BUFFER_SIZE"),
                              ("nixlBufferDevice", "LMCACHE_NIXL_BUFFER_DEVICE")):
                if key in lm:
                    env[name] = _go_str(lm[key])
        size = lm.get("cpuOffloadingBufferSize")
        if ("cpuOffloadingBufferSize" in lm and _go_int(size) > 0) if not ray else bool(size):
            env.update(LMCACHE_LOCAL_CPU="True", LMCACHE_MAX_LOCAL_CPU_SIZE=_go_str(size))
        if "diskOffloadingBufferSize" in lm if not ray else bool(lm.get("diskOffloadingBufferSize")):
            env["LMCACHE_MAX_LOCAL_DISK_SIZE"] = _go_str(lm["diskOffloadingBufferSize"])
            if ray:
                env["LMCACHE_LOCAL_DISK"] = "True"
        cache_server = self.values.get("cacheserverSpec")
        if isinstance(cache_server, Mapping) and cache_server.get("enabled"):
            port = _go_str(cache_server.get("servicePort", 80))  # the chart's default servicePort
            env["LMCACHE_REMOTE_URL"] = f"lm://{_RELEASE}-cache-server-service:{port}"
        if "enableController" in lm:
            env["LMCACHE_ENABLE_CONTROLLER"] = "True" if lm["enableController"] else "False"
        return env

    # -- what the chart drops or refuses ----------------------------------------------------
    def _not_enabled(self, path: str, name: str, lmcache: Mapping[str, Any]) -> None:
        if "enabled" in lmcache:
            return  # `enabled: false` says so: LMCache is off on purpose
        stated = sorted(k for k in lmcache if k in _DEPLOYMENT_KEYS | _RAY_KEYS)
        if stated:
            self.out.drop(join(path, "lmcacheConfig"),
                          f"modelSpec '{name}' sets lmcacheConfig ({', '.join(stated)}) without "
                          "enabled: true: the chart renders no --kv-transfer-config, so vLLM runs "
                          "without LMCache and nothing reads the LMCACHE_* variables it still sets",
                          "add lmcacheConfig.enabled: true")

    def _lmcache_keys(self, lm: str, lmcache: Mapping[str, Any], ray: bool, env: Mapping[str, str]) -> None:
        known = _RAY_KEYS if ray else _DEPLOYMENT_KEYS
        template = "ray-cluster.yaml" if ray else "deployment-vllm-multi.yaml"
        for key in lmcache:
            if key in known or (ray and key == "kvRole"):  # kvRole on Ray: said below
                continue
            hint = "the chart never sets LMCACHE_REMOTE_URL from it: set cacheserverSpec.enabled: true " \
                   "(the chart's cache server) or put LMCACHE_REMOTE_URL in modelSpec.env" \
                if str(key).lower().startswith("remote") else f"{did_you_mean(key, known)}the keys " \
                f"{template} reads are: {', '.join(sorted(known))}"
            self.out.drop(join(lm, key), f"lmcacheConfig.{key} is never read by {CHART} ({template}): "
                          "the setting does not reach LMCache or vLLM", hint)
        size = lmcache.get("cpuOffloadingBufferSize")
        if not ray and size is not None and _go_int(size) <= 0 and _nonzero(size):
            self.out.drop(join(lm, "cpuOffloadingBufferSize"),
                          f"cpuOffloadingBufferSize {size!r} is 0 to the chart (sprig's int: "
                          "spf13/cast truncates floats and does not parse decimals in strings), so it "
                          "sets no LMCACHE_MAX_LOCAL_CPU_SIZE and LMCache uses its default (5.0 GB)",
                          "give a whole number of GB, e.g. cpuOffloadingBufferSize: \"20\"")
        if not ray and "diskOffloadingBufferSize" in lmcache and not env.get("LMCACHE_LOCAL_DISK"):
            self.out.drop(join(lm, "diskOffloadingBufferSize"),
                          f"diskOffloadingBufferSize sets LMCACHE_MAX_LOCAL_DISK_SIZE but {CHART} sets "
                          "no LMCACHE_LOCAL_DISK (removed in ed9a3dd4), and LMCache's disk backend is off "
                          "while local_disk is unset: nothing is offloaded to disk",
                          "add to modelSpec.env: {name: LMCACHE_LOCAL_DISK, value: \"file:///data/lmcache/\"}")
        if ray and lmcache.get("kvRole"):
            self.out.drop(join(lm, "kvRole"), "lmcacheConfig.kvRole is not read by the Ray template "
                          "(ray-cluster.yaml writes kv_role kv_both)",
                          "remove kvRole, or deploy this model without raySpec")

    def _schema(self, path: str, vllm: Mapping[str, Any], lmcache: Mapping[str, Any]) -> None:
        """Types helm/values.schema.json (a6c01db) requires: helm install refuses anything else."""
        checks = [(join(path, "lmcacheConfig.enabled"), lmcache, "enabled", bool, "a boolean", "true"),
                  (join(path, "vllmConfig.v0"), vllm, "v0", str, "a string", '"1"')]
        for where, block, key, kind, word, example in checks:
            if key in block and not isinstance(block[key], kind):
                self._refuse(where, f"{key} is {block[key]!r}, not {word}", f"write {key}: {example}")
        items = vllm.get("extraArgs")
        if items is not None and not isinstance(items, list):
            self._refuse(join(path, "vllmConfig.extraArgs"), "extraArgs is not a list",
                         'write extraArgs: ["--flag", "value"]')
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, str):
                self._refuse(join(path, f"vllmConfig.extraArgs[{i}]"), f"extraArgs item {item!r} is "
                             "not a string", f'quote it: "{item}"')

    def _refuse(self, where: str, what: str, fix: str) -> None:
        self.out.error(where, f"{what}: helm install refuses values that break the chart's "
                       "values.schema.json, so no vLLM starts", fix)

    def _line(self, path: str, default: int | None = None) -> int:
        return self.lines.get(path, default if default is not None else self.lines.get("", 1))


# -- Go template values -----------------------------------------------------------------------
def _go_str(value: Any) -> str:
    """The text Go templates print for a YAML value (Helm reads numbers as float64)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def _go_int(value: Any) -> int:
    """sprig's `int`: spf13/cast ToInt, 0 where it cannot convert."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        match = _ZERO_DECIMAL.match(text)
        text = match[1] if match else text
        try:
            return int(text, 8) if re.fullmatch(r"[+-]?0[0-7]+", text) else int(text, 0)
        except ValueError:
            return 0
    return 0


def _nonzero(value: Any) -> bool:
    """The user meant a size above 0 (0.5, "1.5", "20GB"), not 0 or "0"."""
    try:
        return float(str(value).strip()) > 0
    except ValueError:
        return bool(re.match(r"\s*[0-9.]*[1-9]", str(value)))
