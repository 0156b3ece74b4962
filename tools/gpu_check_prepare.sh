#!/usr/bin/env bash
# Fill the folder that tools/gpu_check.sh carries to a lent GPU machine, which reaches no network at all.
# Run it here, where PyPI and Debian's archive answer:
#
#   tools/gpu_check_prepare.sh [DIR]          (default .gpu-check-wheels, git-ignored; idempotent)
#
#   DIR/mooncake_transfer_engine_cuda13-0.3.14-cpXY-cpXY-manylinux_2_28_x86_64.whl
#                 one per Python version in GPU_CHECK_PYTHONS (default 3.12): the CUDA 13 build kvctl
#                 chooses for torch >= 2.11 (kvctl/facts/mooncake_wheels.py). One wheel is ~47 MiB and a
#                 call carries 64 MiB in all, work tree included, so one Python only: the lent machine's
#                 python3 was 3.12.3 when last seen (/work/.library/device/KINDS.md, 2026-11); cp310 to
#                 cp313 exist on PyPI.
#   DIR/py/       wheels of the third-party distributions tools/gpu/discovery_check.py may load (found by
#                 importing kvctl.serve.gpus here, plus psutil, which gpus._owner imports lazily);
#                 gpu_check.sh installs one only where that Python lacks it
#   DIR/debs/     Debian 12 packages of the system libraries the wheel links but does not bundle
#                 (readelf -d: libibverbs.so.1, libmlx5.so.1, libnuma.so.1, libcurl.so.4) and their
#                 libraries, with index.txt (soname -> .deb): gpu_check.sh unpacks only those the
#                 loader cannot find, into a private folder on LD_LIBRARY_PATH
#
# Settings: GPU_CHECK_PYTHONS (e.g. "3.11 3.12"), GPU_CHECK_MOONCAKE (default
# mooncake-transfer-engine-cuda13==0.3.14), GPU_CHECK_MAX_MIB (default 60: refused above it).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$repo/.gpu-check-wheels}
pythons=${GPU_CHECK_PYTHONS:-3.12}
mooncake=${GPU_CHECK_MOONCAKE:-mooncake-transfer-engine-cuda13==0.3.14}
max_mib=${GPU_CHECK_MAX_MIB:-60}
# libibverbs1 + ibverbs-providers (libmlx5) need libnl; libcurl4's own libraries follow. Left out: what
# every glibc system with Python has (libc6, libssl3, zlib1g, libzstd1, libffi8, gnutls and its kin).
DEBS=(libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 libnuma1 libcurl4 libbrotli1 libgssapi-krb5-2
    libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libldap-2.5-0 libsasl2-2 libsasl2-modules-db
    libnghttp2-14 libpsl5 librtmp1 libssh2-1 libidn2-0)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)

log() { printf '[gpu_check_prepare] %s\n' "$*" >&2; }
py=$repo/.venv/bin/python
[[ -x $py ]] || py=$(command -v python3)
"$py" -m pip --version >/dev/null 2>&1 || { log "$py has no pip: make kvctl's .venv first (make venv)"; exit 1; }
pip_download() { "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "$@"; }
mkdir -p "$dir/py" "$dir/debs"

# 1. Mooncake's CUDA 13 wheel, one per Python; wheels of other versions or Pythons go
name=${mooncake%%==*}
version=${mooncake#*==}
keep=()
for v in $pythons; do
    tag=cp${v/./}
    keep+=("${name//-/_}-$version-$tag-$tag-")
    log "downloading $mooncake for Python $v"
    pip_download --python-version "$v" --implementation cp "${PLATFORMS[@]}" -d "$dir" "$mooncake"
done
for whl in "$dir"/*.whl; do
    [[ -e $whl ]] || continue
    base=$(basename "$whl")
    wanted=0
    for k in "${keep[@]}"; do [[ $base == "$k"* ]] && wanted=1; done
    ((wanted)) || { log "removing $base (not wanted now)"; rm -f "$whl"; }
done

# 2. The third-party distributions the discovery check loads, at the versions installed here
deps=$(cd "$repo" && PYTHONPATH=$repo "$py" - <<'EOF'
import sys
from importlib.metadata import packages_distributions, version
before = set(sys.modules)
import kvctl.serve.gpus  # noqa: F401 - what tools/gpu/discovery_check.py imports
import kvctl.facts.mooncake_wheels  # noqa: F401 - what tools/gpu/machine_facts.py imports
names = {m.split(".")[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) - {"kvctl"}
names.add("psutil")  # imported inside kvctl.serve.gpus._owner, only when a process computes on a GPU
dists = packages_distributions()
print(" ".join(sorted(f"{d}=={version(d)}" for n in names for d in dists.get(n, []))))
EOF
)
rm -f "$dir"/py/*.whl
for dep in $deps; do
    for v in $pythons; do
        log "downloading $dep for Python $v"
        pip_download --python-version "$v" --implementation cp "${PLATFORMS[@]}" -d "$dir/py" "$dep"
    done
done

# 3. The system libraries, as Debian 12 packages, and which soname each provides
if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    rm -f "$dir"/debs/*.deb "$dir/debs/index.txt"
    (cd "$dir/debs" && apt-get download -qq "${DEBS[@]}" 2>/dev/null) ||
        { apt-get update -qq && (cd "$dir/debs" && apt-get download -qq "${DEBS[@]}"); }
    for deb in "$dir"/debs/*.deb; do
        dpkg-deb -c "$deb" | awk '{print $6}' | grep -E '/lib[^/]*\.so[.0-9]*$' | xargs -r -n1 basename |
            awk -v d="$(basename "$deb")" '{print $1 "\t" d}'
    done | sort -u >"$dir/debs/index.txt"
    log "$(ls "$dir"/debs/*.deb | wc -l) .debs, $(wc -l <"$dir/debs/index.txt") sonames in debs/index.txt"
else
    log "no apt-get/dpkg-deb here: no .debs (the GPU machine must then have libibverbs1, ibverbs-providers, libnuma1, libcurl4)"
fi

bytes=$(du -sb "$dir" | cut -f1)
mib=$(((bytes + 1048575) / 1048576))
log "$dir: $mib MiB"
ls -l "$dir" "$dir/py" | grep -v '^total' >&2
if ((mib > max_mib)); then
    log "over $max_mib MiB: the call carries 64 MiB in all, work tree included; set GPU_CHECK_PYTHONS to fewer versions"
    exit 1
fi
